"""Checkpoint formats of other code, one module each, both directions.

* :mod:`~depthbench.formats.hf`: a Hugging Face ``LlamaForCausalLM``
  (safetensors) as a baseline run (``import-hf``) and back (``export-hf``),
  from one tensor map;
* :mod:`~depthbench.formats.olmo`: the original DepthBench's release format
  (an OLMo-core step directory) as a run of the family it trained
  (``import-olmo``) and back (``export-olmo``);
* :mod:`~depthbench.formats.run_writer`: the run directory an import writes
  (config, checkpoint, tokenizer files).

A reader reads only regular files inside the directory it is given
(:mod:`depthbench.confine`); a writer goes through the one output rule
(:mod:`depthbench.output_paths`: ``--out`` checked first, built aside,
renamed into place).  No family is named here: what differs by family is
the family's ``OriginalFormat``.
"""
