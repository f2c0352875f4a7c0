"""The token an empty context is conditioned on when scoring (``encode`` adds none:
:mod:`depthbench.data.tokenizer`), for the eval suites and the lm-eval backend alike."""

from __future__ import annotations


def prefix_token_id(tokenizer) -> int:
    """BOS for a Hugging Face tokenizer that has one (lm-eval's hf backend), else EOS
    (depthbench runs train on documents joined by EOS, without BOS)."""
    if tokenizer.kind == "huggingface" and tokenizer.bos_id >= 0:
        return tokenizer.bos_id
    return tokenizer.eos_id
