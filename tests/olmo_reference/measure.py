"""Per design the original trained: how far depthbench's import is from the original.

Builds each reference (:mod:`.original`) with random non-trivial weights,
saves it in the original's format (OLMo-core's writer), imports it with
``depthbench import-olmo``'s code, and prints the largest logit difference
relative to the largest reference logit (fp32), with the departures the
import recorded.  The designs that match are tests (tests/test_olmo_parity.py);
the others are what the family defaults must change to reach (docs/ORIGINAL.md).

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


def difference(design: str, work: Path, *, depth: int = 3, seed: int = 1) -> tuple[float, dict]:
    """``(max |ours - ref| / max |ref|, config written)`` for one design."""
    import torch

    from depthbench import load_run
    from depthbench.importers.olmo import import_olmo

    torch.manual_seed(seed)
    model, config = original.build(design, depth)
    randomize(model, seed)
    step = save_step_dir(model, config, work / design)
    tokens = torch.randint(0, config["vocab_size"], (2, 13), generator=torch.Generator()
                           .manual_seed(seed))
    ref = original.logits(model, tokens).numpy()
    written = import_olmo(step, work / design / "run", progress=False)
    ours = load_run(work / design / "run").logits(tokens.numpy().astype(np.int32))
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref))), written


def main(argv: list[str]) -> int:
    designs = argv or list(original.DESIGNS)
    print(f"{'design':14} {'family':14} {'max rel logit diff':>20}  departures recorded")
    with tempfile.TemporaryDirectory() as tmp:
        for design in designs:
            diff, written = difference(design, Path(tmp))
            notes = written["resolved"]["olmo"]["departures"]
            print(f"{design:14} {written['model']['family']:14} {diff:20.2e}  "
                  f"{'; '.join(n.split(':')[0] for n in notes) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
