"""Peak memory of ``depthbench import-olmo`` on a checkpoint of a few hundred MB.

Writes an upstream OLMo-core pre_ln model (bf16 weights and AdamW state, as
the original released them) of the given shape, then runs ``depthbench
import-olmo`` on it in a fresh process and prints that process's peak RSS
next to the sizes that matter: the checkpoint on disk, its model part, and
the fp32 parameters the run holds.  Streaming means the peak stays near one
copy of the fp32 parameters plus the interpreter and libraries, never two.

    PYTHONPATH=src python -m tests.olmo_reference.memory [--d 768 --layers 12]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import original
from .step_dir import save_step_dir


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write(root: str, d: int, layers: int, vocab: int) -> None:
    """The checkpoint (run in its own process); prints its parameter count."""
    import torch

    model, config = original.build("pre_ln", layers, d_model=d, n_heads=12, n_kv_heads=12,
                                   vocab=vocab)
    model = model.to(torch.bfloat16)
    save_step_dir(model, config, Path(root))
    print(sum(p.numel() for p in model.parameters()))


# Each measured child prints its own peak RSS.  (A child's ru_maxrss starts at
# its parent's peak on Linux, so this parent imports neither torch nor jax.)
_PEAK = "; import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"


def _child(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=os.environ.copy())
    return out.stdout.split()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50304)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        n_params = int(_child(f"from tests.olmo_reference.memory import write; "
                              f"write({str(root)!r}, {args.d}, {args.layers}, {args.vocab})")[-1])
        step = root / "step5"
        start = time.perf_counter()
        peak = int(_child(
            "from depthbench.cli import main; assert main(['import-olmo', "
            f"{str(step)!r}, '--out', {str(Path(tmp) / 'run')!r}, '--no-progress']) == 0"
            + _PEAK)[-1])
        seconds = time.perf_counter() - start
        base = int(_child("import torch, torch.distributed.checkpoint, jax, jax.numpy as jnp, "
                          "orbax.checkpoint, depthbench.formats.olmo.step_dir, "
                          "depthbench.train.state; "
                          "from depthbench.cli import build_parser; build_parser(); "
                          "jnp.zeros(1).block_until_ready()" + _PEAK)[-1])
        mb = 1 / 2**20
        fp32 = 4 * n_params
        print(f"parameters {n_params:,}: checkpoint {_size(step) * mb:,.0f} MiB on disk (model "
              f"part, bf16: {2 * n_params * mb:,.0f} MiB); fp32 parameters {fp32 * mb:,.0f} MiB; "
              f"import peak RSS {peak * mb:,.0f} MiB, the libraries alone {base * mb:,.0f} MiB: "
              f"the import adds {(peak - base) / fp32:.2f} x the fp32 parameters "
              f"({seconds:.0f} s on a shared 2-core machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
