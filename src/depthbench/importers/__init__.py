"""Other formats into depthbench runs.

* :mod:`~depthbench.importers.hf`: a local Hugging Face ``LlamaForCausalLM``
  (safetensors) as a pre_ln run (``depthbench import-hf``);
* :mod:`~depthbench.importers.olmo`: an OLMo-core distributed checkpoint of
  the original DepthBench (``step*/``) as a run of the family it trained
  (``depthbench import-olmo``);
* :mod:`~depthbench.importers.run_writer`: the run directory both write
  (config, checkpoint, tokenizer files), built aside and moved into place
  only when complete.
"""
