"""Runs out of depthbench: the inverse of :mod:`depthbench.importers`.

* :mod:`.source_run`: the run directory an export reads (config, family,
  newest intact parameters, tokenizer files);
* :mod:`.hf`: a baseline run as a Hugging Face ``LlamaForCausalLM`` folder;
* :mod:`.olmo`: a run of a family the original DepthBench trained in its
  release format, from :mod:`.olmo_config` (its ``config.json``) and
  :mod:`.distcp_writer` (the distributed checkpoint, torch's own writer).

Both check ``--out`` first and build aside, renaming into place at the end
(``importers.run_writer.built_aside``: the full-disk rule of the imports).
No family is named here: what differs by family is the family's
``OriginalFormat``.
"""
