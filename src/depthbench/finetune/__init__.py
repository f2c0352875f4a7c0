"""Supervised fine-tuning as the original DepthBench does it (its ``eval/finetune/``).

* :mod:`.records`: instruction records from local JSON, JSON-lines, Parquet;
* :mod:`.template`: its Alpaca template, label mask and truncation rule;
* :mod:`.prepare`: ``depthbench data sft``, the records as cached token ids
  and label masks, tokenised with the run's own tokenizer;
* :mod:`.rows`: which records each training row holds (padded or packed),
  epoch by epoch, and so the run's steps;
* :mod:`.batches`: those rows as arrays through grain (checkpointed with the
  model), the held-out batches and their loss;
* :mod:`.configure`: a fine-tuning's config (the parent's model, a spec's
  recipe, the data's digest);
* :mod:`.inputs`: what the one trainer loop trains on and starts from (the
  parent's newest intact checkpoint);
* :mod:`.trainer`: ``depthbench finetune``, into a run directory.
"""
