"""Supervised fine-tuning as the original DepthBench does it (its ``eval/finetune/``;
docs/FINETUNE.md): :mod:`.records` (the instruction records, their template
and their cache: ``depthbench data sft``), :mod:`.plan` (a fine-tuning's
config, rows and batches) and :mod:`.trainer` (``depthbench finetune``
through the one trainer loop).
"""
