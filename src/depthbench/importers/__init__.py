"""Other formats into depthbench runs.

* :mod:`~depthbench.importers.hf`: a local Hugging Face ``LlamaForCausalLM``
  (safetensors) as a pre_ln run (``depthbench import-hf``);
* :mod:`~depthbench.importers.olmo`: an OLMo-core distributed checkpoint of
  the original DepthBench (``step*/``) as a run of the family it trained
  (``depthbench import-olmo``), through :mod:`~depthbench.importers.olmo_config`
  (config.json: the backbone, and the family that claims the block),
  :mod:`~depthbench.importers.olmo_weights` (the tensors, both ways: the
  family's own from its ``OriginalFormat``), :mod:`~depthbench.importers.distcp`
  (the checkpoint, read without torch) and
  :mod:`~depthbench.importers.safe_unpickle` (every pickle read with an
  allow-list, nothing it names run);
* :mod:`~depthbench.importers.run_writer`: the run directory both write
  (config, checkpoint, tokenizer files), built aside and moved into place
  only when complete.
"""
