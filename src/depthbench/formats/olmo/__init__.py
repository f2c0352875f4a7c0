"""The original DepthBench's release format (an OLMo-core step directory), both ways.

* :mod:`.step_dir`: ``import_olmo`` and ``export_olmo``, a step directory
  as a whole;
* :mod:`.config`: its ``config.json`` (the model's design and shape) read
  as a family and its fields, and written from a run;
* :mod:`.weights`: where each checkpoint tensor goes in the parameters,
  and back;
* :mod:`.distcp`: the torch distributed checkpoint, read without torch
  (everything its index declares checked first) and written by torch's own
  writer;
* :mod:`.torch_save`: one ``torch.save`` archive (a chunk), read without torch;
* :mod:`.unpickle`: every pickle read with an allow-list, nothing it names run.
"""
