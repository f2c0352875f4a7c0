"""The original DepthBench's instruction template and label mask.

As its ``eval/finetune/prepare_commonsense170k.py`` (@3a6423a) renders and
encodes a record: the Alpaca template (the instruction and the input
stripped; the form "paired with an input" when the input is not empty), the
response stripped, ``ids = prompt + response + [EOS]`` and a label mask that
covers the response and the final EOS only.  Its truncation rule for a
record longer than ``max_seq_len``: keep the first ``max_seq_len - 1``
tokens and then EOS (masked as supervised), and refuse a record cut before
its response starts (no supervised token but that EOS).
"""

from __future__ import annotations

import numpy as np

from depthbench.errors import ConfigError
from depthbench.finetune.records import Record

WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides "
              "further context. Write a response that appropriately completes the request.\n\n"
              "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
WITHOUT_INPUT = ("Below is an instruction that describes a task. Write a response that "
                 "appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Response:\n")


def prompt(record: Record) -> str:
    instruction, context = record.instruction.strip(), record.input.strip()
    if context:
        return WITH_INPUT.format(instruction=instruction, input=context)
    return WITHOUT_INPUT.format(instruction=instruction)


def response(record: Record) -> str:
    return record.output.strip()


def encode(prompt_ids: list[int], response_ids: list[int], eos_id: int, max_seq_len: int,
           where: str, field: str = "--max-seq-len") -> tuple[np.ndarray, np.ndarray, bool]:
    """``(ids, label mask, truncated)`` of one record (``where`` names it in errors,
    ``field`` the setting of ``max_seq_len``)."""
    ids = [*prompt_ids, *response_ids, eos_id]
    mask = [False] * len(prompt_ids) + [True] * (len(response_ids) + 1)
    truncated = len(ids) > max_seq_len
    if truncated:
        ids = ids[:max_seq_len - 1] + [eos_id]
        mask = mask[:max_seq_len - 1] + [True]
        if not any(mask[:-1]):
            raise ConfigError(f"{field} {max_seq_len}: {where}'s prompt alone is "
                              f"{len(prompt_ids)} tokens, so the original's truncation leaves "
                              f"no response token; raise {field} or drop the record")
    return np.asarray(ids, np.int64), np.asarray(mask, bool), truncated
