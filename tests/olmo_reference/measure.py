"""Per design the original trained: how far depthbench's import is from the original.

Builds each reference (:mod:`.original`) with random non-trivial weights,
saves it in the original's format (OLMo-core's writer), imports it with
``depthbench import-olmo``'s code, and prints the largest logit difference
relative to the largest reference logit (fp32), then the relative difference
of the loss after one AdamW step in each framework (:mod:`.training`), and
the departures the import recorded.  tests/integration/test_olmo_parity.py asserts the
same numbers (1e-4 for logits and the loss after the step); docs/ORIGINAL.md
shows this script's output.

    PYTHONPATH=src python -m tests.olmo_reference.measure [DESIGN ...]

Needs the ``test-olmo`` extra (torch, ai2-olmo-core, liger-kernel, triton).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from . import original  # sets TRITON_INTERPRET before triton loads
from .step_dir import randomize, save_step_dir
from .training import depthbench_step, torch_step


def difference(design: str, work: Path, *, depth: int = 3, seed: int = 1
               ) -> tuple[float, float, dict]:
    """``(max |ours - ref| / max |ref|, |loss_ours - loss_ref| / loss_ref after one
    step, config written)`` for one design."""
    import torch

    from depthbench import load_run
    from depthbench.importers.olmo import import_olmo

    torch.manual_seed(seed)
    model, config = original.build(design, depth)
    randomize(model, seed)
    step = save_step_dir(model, config, work / design, train_module=original.train_module(design))
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config["vocab_size"], (2, 13), generator=gen)
    ref = original.logits(model, tokens).numpy()
    written = import_olmo(step, work / design / "run", progress=False)
    run = load_run(work / design / "run")
    ours = run.logits(tokens.numpy().astype(np.int32))
    batch = torch.randint(0, config["vocab_size"], (4, 17), generator=gen).numpy()
    _, after = depthbench_step(run, batch, lr=1e-2)
    _, ref_after = torch_step(model, batch, lr=1e-2)
    return (float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref))),
            abs(after - ref_after) / ref_after, written)


def main(argv: list[str]) -> int:
    designs = argv or list(original.DESIGNS)
    print(f"{'design':16} {'family':14} {'logits':>9} {'step loss':>10}  departures recorded")
    with tempfile.TemporaryDirectory() as tmp:
        for design in designs:
            diff, step, written = difference(design, Path(tmp))
            notes = written["resolved"]["olmo"]["departures"]
            print(f"{design:16} {written['model']['family']:14} {diff:9.1e} {step:10.1e}  "
                  f"{'; '.join(n.split(':')[0] for n in notes) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
