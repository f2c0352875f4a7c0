"""PyTorch references for the designs the original DepthBench trained.

Built on upstream OLMo-core's own modules (``ai2-olmo-core``: attention,
RoPE, SwiGLU, norms, LM head, and its ``default`` / ``default_scaled`` /
``peri_norm`` blocks as they are) and liger-kernel's mHC coefficient kernel
(under ``TRITON_INTERPRET=1`` on CPU).  The blocks OLMo-core does not have
(deepnorm, keel, post-norm, CompleteP, HC, mHC, AttnRes, MoDA) are written
here from the original's code (keyu-wang-2002/DepthBench,
``pretrain/OLMo-core/src/olmo_core/nn/``; read, not copied; docs/ORIGINAL.md
cites each file), with the original's module names, so that
``state_dict()`` has the original's checkpoint keys.  :mod:`.step_dir`
saves a model in the original's format (OLMo-core's own checkpoint writer).

Needs the ``test-olmo`` extra; tests importorskip it.
"""

import os

# Liger's Triton kernels run on CPU tensors only in the interpreter; it must be
# set before triton is first imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
