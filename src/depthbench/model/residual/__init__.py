"""Residual families: one module per family here, the machinery they share below.

A family is one file in this package plus one line in the registry
(``protocol/registry.py``'s ``_BUILTIN``): ``pre_ln``, ``sandwich_ln``, ``lns``,
``deepnorm``, ``keel``, ``hc``, ``mhc``, ``attnres`` (full and block),
``moda``, ``post_ln``, ``mix_ln``, ``completep``.

* ``protocol/``: what every family implements and declares: the core
  (``base.py``), the opt-in capabilities (``capabilities.py``, and
  ``original_format.py`` for the original benchmark's checkpoints), the typed
  family config (``family_config.py``) and the registry;
* ``parts/``: building blocks some families share: the stream machinery of
  hc and mhc (``streams.py``), Sinkhorn (``sinkhorn.py``), the depth mix of
  attnres (``depth_mix.py``), MoDA's depth attention (``moda_attention.py``) and
  the switch to the fused kernels (``fused.py``).
"""
