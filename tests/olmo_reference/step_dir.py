"""Save a reference model as the original DepthBench saved its checkpoints.

A step directory: ``config.json`` (an OLMo-core experiment config: ``model``,
``dataset.tokenizer``, ``train_module.optim``) and ``model_and_optim/``
written by OLMo-core's own ``save_model_and_optim_state`` (model and, after
one AdamW step, optimizer state), plus ``../tokenizer/`` when asked.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Stream-routing parameters drawn far from their near-identity init, so that
# mHC's Sinkhorn and gates work away from saturation (where every form agrees).
ROUTING_BIASES = frozenset({"b", "pre_bias", "post_bias", "residual_bias"})
ROUTING_GATES = frozenset({"alpha_pre", "alpha_post", "alpha_res", "pre_gate", "post_gate",
                           "residual_gate"})


def randomize(model: torch.nn.Module, seed: int, *, scale: float = 0.1) -> None:
    """Non-trivial weights: norm gains ``1 + 0.3 N(0, 1)``; mHC's routing biases
    ``N(0, 1)`` and gates ``1 + 0.3 N(0, 1)``; every other tensor its current
    value plus ``scale * N(0, 1)`` (HC's static mixing stays meaningful but is
    perturbed; zero-initialised queries and projections become non-zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            leaf = name.rsplit(".", 1)[-1]
            if any(part.endswith("norm") for part in name.split(".")[:-1]):
                value = 1.0 + 0.3 * noise
            elif leaf in ROUTING_BIASES:
                value = noise
            elif leaf in ROUTING_GATES:
                value = 1.0 + 0.3 * noise
            else:
                value = p.float() + scale * noise
            p.copy_(value.to(p.dtype))


def save_step_dir(model: torch.nn.Module, model_config: dict, root: Path, *, step: int = 5,
                  seq_len: int = 16, optimizer: bool = True, tokenizer: Path | None = None,
                  train_module: dict | None = None) -> Path:
    """``root/step{step}`` in the original's layout; returns it."""
    from olmo_core.distributed.checkpoint import save_model_and_optim_state

    step_dir = root / f"step{step}"
    step_dir.mkdir(parents=True)
    optim = None
    if optimizer:  # a real optimizer state in the checkpoint, as every released step has
        optim = torch.optim.AdamW(model.parameters(), lr=0.0)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optim.step()
        optim.zero_grad(set_to_none=True)
    save_model_and_optim_state(step_dir / "model_and_optim", model, optim)
    saved = {"model": model_config,
             "dataset": {"sequence_length": seq_len,
                         "tokenizer": {"vocab_size": model_config["vocab_size"],
                                       "eos_token_id": 0, "pad_token_id": 1,
                                       "bos_token_id": None}},
             "train_module": train_module or {"optim": {"lr": 2e-3, "eps": 1e-8,
                                                        "weight_decay": 0.1}}}
    (step_dir / "config.json").write_text(json.dumps(saved))
    if tokenizer is not None:
        (root / "tokenizer").mkdir()
        (root / "tokenizer" / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    return step_dir
