"""PyTorch references for what the original's own checkpoints do not decide.

tests/fixtures/original_checkpoints/ (tests/helpers/original_outputs.py) tests every
design against what the original's own code wrote.  :mod:`.original` builds,
on upstream OLMo-core's own modules (``ai2-olmo-core``) and liger-kernel's mHC
kernels (under ``TRITON_INTERPRET=1`` on CPU), the cases those fixtures
cannot tell apart (mHC routing far from its init, the early HC and mHC forms,
upstream's own blocks); :mod:`.step_dir` saves a model in the original's
format (OLMo-core's own checkpoint writer).

Needs the ``test-olmo`` extra; tests importorskip it.
"""

import os

# Liger's Triton kernels run on CPU tensors only in the interpreter; it must be
# set before triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
