"""completep (depth-muP): pre_ln with branch multiplier ``(L / L_base)^(-alpha)``.

``x <- x + m F(N(x))`` with ``m = (L / L_base)^(-alpha)``, ``alpha`` in
[0.5, 1] (``completep_alpha``; 1 is CompleteP, 0.5 the depth-muP of Yang et
al. 2023) and ``L_base`` the depth the learning rate was tuned at
(``completep_base_depth``).  Initialisation is unchanged with depth.

The matching learning-rate rule for Adam(W) (Dey et al. 2025, "Don't be
lazy: CompleteP enables compute-efficient deep transformers", arXiv
2505.01618, Table 1, and its reference code EleutherAI/nanoGPT-mup, branch
``completep``, ``configure_optimizers``): every parameter inside the blocks
(hidden matrices and the blocks' norm weights) trains with learning rate
``eta * (L / L_base)^(alpha - 1)``; the embedding, the LM head and the final
norm keep ``eta``.  :meth:`CompleteP.lr_multipliers` returns that factor
per leaf (the family's ``LearningRateRule``); the trainer multiplies each
leaf's AdamW update by it when ``config.train.lr_rule == "family"``
(decoupled weight decay is scaled with it, as PyTorch's per-group ``lr``
does).  With ``alpha = 1`` the learning-rate factor is 1.  Under the same
rule AdamW's epsilon of the block parameters is ``eps * (L / L_base)^(-alpha)``
(:meth:`CompleteP.eps_multipliers`), so that it stays in proportion to their
gradients, which shrink like the branch multiplier; the embedding, the head
and the final norm keep ``eps``.  That is the original benchmark's grouping
(``examples/pretrain_preln_mup.py@aba1f65``, ``apply_depth_only_scaling``:
one override for ``blocks.*`` with ``lr * m_L^(alpha-1)`` and ``eps *
m_L^(-alpha)``; the optimizer state of its own checkpoints shows the same
groups, tests/integration/test_original_checkpoints.py), where the reference
code scales one ``adam_eps`` for every group alike.

``alpha = 1`` (the default) is CompleteP, the paper's recommendation: the only
setting with both depth-wise transfer and non-lazy layers.  ``alpha = 0.5``
is the depth-muP of Yang et al. 2023 and Bordelon et al. 2023, kept
available (the variant ``completep+depth_mup``).

``completep_head_scale`` multiplies the LM head's output (the readout, the
head being linear): the original benchmark's depth-width runs
(``examples/pretrain_preln_mup.py@aba1f65``) multiply it by ``d_base / d``,
the muP output multiplier; 1 (default) in its depth-only runs and here.
Only that factor is a field: the width-muP init and per-group learning
rates of those runs are not (``import-olmo`` sets the factor from a
checkpoint, whose logits it then reproduces).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol.base import ResidualFamily, gate
from depthbench.model.residual.protocol.capabilities import LearningRateRule, Variants
from depthbench.model.residual.protocol.family_config import FamilyConfig, check_number
from depthbench.model.residual.protocol.original_format import OriginalFormat, Reading


def branch_multiplier(depth: int, base_depth: int, alpha: float) -> float:
    """``(L / L_base)^(-alpha)``."""
    return (depth / base_depth) ** -alpha


def hidden_lr_multiplier(depth: int, base_depth: int, alpha: float) -> float:
    """``(L / L_base)^(alpha - 1)``: Adam learning-rate factor of the block parameters."""
    return (depth / base_depth) ** (alpha - 1.0)


def eps_multiplier(depth: int, base_depth: int, alpha: float) -> float:
    """``(L / L_base)^(-alpha)``: the factor on AdamW's epsilon."""
    return (depth / base_depth) ** -alpha


def _head_scale(saved) -> float:
    """The LM-head output factor of the original's depth-width muP runs (its
    ``pretrain_preln_mup.py`` multiplies the head's output by ``d_base / d``, a
    patch config.json does not record), recovered from the embedding's AdamW
    epsilon override ``eps / m_N`` (m_N = d / d_base); 1 for depth-only runs."""
    optim = ((saved.get("train_module") or {}).get("optim") or {})
    base_eps = optim.get("eps")
    for group in optim.get("group_overrides") or []:
        if group.get("params") == ["embeddings.weight"] and "eps" in (group.get("opts") or {}):
            width_multiplier = float(base_eps) / float(group["opts"]["eps"])
            return 1.0 / width_multiplier
    return 1.0


@dataclasses.dataclass(frozen=True)
class CompletePConfig(FamilyConfig, Variants):
    completep_alpha: float = 1.0  # (L / L_base) ** -alpha: 1 = CompleteP, 0.5 = depth-muP
    completep_base_depth: int = 4  # L_base: the depth the learning rate was tuned at
    completep_head_scale: float = 1.0  # the LM head's output factor (depth-width muP: d_base/d)

    variants = {"depth_mup": {"completep_alpha": 0.5}}

    def validate(self, config) -> None:
        check_number("completep_alpha", self.completep_alpha, 0.5, 1.0,
                     meaning="1 = CompleteP, 0.5 = depth-muP")
        check_number("completep_base_depth", self.completep_base_depth, 1.0, integer=True)
        check_number("completep_head_scale", self.completep_head_scale, 0.0, exclusive=True,
                     meaning="the LM head's output factor")


@dataclasses.dataclass(frozen=True)
class CompleteP(ResidualFamily, LearningRateRule, OriginalFormat):
    name = "completep"
    description = ("CompleteP / depth-muP: x <- x + (L/L_base)^-alpha F(N(x)), block LR "
                   "x (L/L_base)^(alpha-1)")
    reference = ("Dey et al. 2025, Don't be lazy: CompleteP enables compute-efficient deep "
                 "transformers (arXiv 2505.01618); Yang et al. 2023, Tensor Programs VI")
    Config = CompletePConfig
    # DepthScaledTransformerBlock (block.py@6bdf2ad), through the original's
    # examples/pretrain_preln_mup.py@aba1f65.
    original_blocks = ("depth_mup", "completep")
    original_fields = {"residual_scaling_base_depth": (None,),
                       "attention_residual_alpha": (None, 1, 1.0),
                       "feed_forward_residual_alpha": (None, 1, 1.0)}

    @classmethod
    def from_original(cls, block, saved, options):
        name = block.opt("name")
        head_scale = _head_scale(saved)
        residual = {"completep_alpha": 0.5 if name == "depth_mup" else 1.0,
                    "completep_base_depth": block.int("residual_scaling_base_depth"),
                    "completep_head_scale": head_scale}
        if head_scale == 1.0:
            # Depth-only runs train the blocks with the depth rule (apply_depth_only_scaling:
            # one optimizer group for blocks.*): train.lr_rule = "family".
            return Reading(block=name, residual=residual, train={"lr_rule": "family"})
        return Reading(block=name, residual=residual, departures=(
            f"depth-width muP (head output factor d_base/d = {head_scale:g}, "
            "completep_head_scale): the logits are the original's, but its width-muP init "
            "and per-group learning rates are not fields, so training on from here is not "
            "the original's recipe",))

    def to_original(self):
        names = {0.5: "depth_mup", 1.0: "completep"}
        if self.alpha not in names or float(self.cfg.completep_head_scale) != 1.0:
            raise ConfigError("the original trained depth-muP (alpha 0.5) and CompleteP (1), "
                              "depth-only or with its width-muP rules; this completep has alpha "
                              f"{self.alpha:g}, head scale {self.cfg.completep_head_scale:g}")
        return {"name": names[self.alpha], "residual_scaling_base_depth": self.base_depth}

    @property
    def alpha(self) -> float:
        return float(self.cfg.completep_alpha)

    @property
    def base_depth(self) -> int:
        return int(self.cfg.completep_base_depth)

    @property
    def multiplier(self) -> float:
        return branch_multiplier(self.spec.depth, self.base_depth, self.alpha)

    @property
    def hidden_lr(self) -> float:
        return hidden_lr_multiplier(self.spec.depth, self.base_depth, self.alpha)

    def eps_multiplier(self) -> float:
        """AdamW epsilon factor of the block parameters under ``train.lr_rule = "family"``."""
        return eps_multiplier(self.spec.depth, self.base_depth, self.alpha)

    def write(self, p, state, y, site, aux, active):
        return gate(active, state + self.multiplier * y, state)

    def readout(self, g, state, final_norm):
        """``N_out(x)``, times ``completep_head_scale`` (the head is linear, so this
        scales the logits)."""
        scale = float(self.cfg.completep_head_scale)
        x = final_norm(state)
        return x if scale == 1.0 else (x.astype(jnp.float32) * scale).astype(x.dtype)

    def lr_multipliers(self, params: Any) -> Any:
        """Per-leaf learning-rate factor (python floats, same tree as ``params``).

        ``params`` is the model's parameter tree (boxed or unboxed): leaves under
        its top-level ``blocks`` get :attr:`hidden_lr`, all others 1.0."""

        return self._in_blocks(params, self.hidden_lr)

    def eps_multipliers(self, params: Any) -> Any:
        """Per-leaf AdamW epsilon factor: :meth:`eps_multiplier` under ``blocks``, 1.0
        elsewhere."""
        return self._in_blocks(params, self.eps_multiplier())

    @staticmethod
    def _in_blocks(params: Any, factor: float) -> Any:
        """``factor`` on the leaves under the top-level ``blocks``, 1.0 on the others."""

        def of(path, _):
            top = path[0] if path else None
            return factor if top == jax.tree_util.DictKey("blocks") else 1.0

        return jax.tree_util.tree_map_with_path(of, params)

    def describe(self) -> dict:
        return {**super().describe(), "branch_multiplier": self.multiplier,
                "hidden_lr_multiplier": self.hidden_lr, "alpha": self.alpha,
                "eps_multiplier": self.eps_multiplier(),
                "base_depth": self.base_depth}
