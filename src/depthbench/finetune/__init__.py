"""Supervised fine-tuning as the original DepthBench does it (its ``eval/finetune/``).

* :mod:`.records`: instruction records from local JSON, JSON-lines, Parquet;
* :mod:`.template`: its Alpaca template, label mask and truncation rule;
* :mod:`.prepare`: ``depthbench data sft``, the records as cached token ids
  and label masks, tokenised with the run's own tokenizer.
"""
