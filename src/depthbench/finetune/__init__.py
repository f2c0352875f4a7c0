"""Supervised fine-tuning as the original DepthBench does it (its ``eval/finetune/``;
docs/FINETUNE.md): the records, the plan, and the trainer."""
