"""The original DepthBench's checkpoints as a family capability: :class:`OriginalFormat`.

The original benchmark (keyu-wang-2002/DepthBench, PyTorch on OLMo-core)
saves a run as OLMo-core does: ``config.json``, whose ``model.block`` names a
block type and its fields, and ``model_and_optim/``, tensors named by the
original's modules (``blocks.{i}.attention.w_q.weight`` ...).  A family the
original trained declares, in its own file, both directions of the mapping:

* **config**: which block configs are its (:meth:`OriginalFormat.original_claims`),
  what their fields mean as its own fields (:meth:`~OriginalFormat.from_original`,
  a :class:`Reading`), and back (:meth:`~OriginalFormat.to_original`, with
  :meth:`~OriginalFormat.original_model` for what sits beside the block);
* **tensors**: which checkpoint tensors hold its parameters, laid out how
  (:class:`Tensor`, :class:`Place`: each a conversion to depthbench's layout and
  its inverse), the norms and sublayer modules its blocks name, the entries
  that are not parameters of their own, and the parameters the original
  does not have (:class:`Constant`).

``formats/olmo/`` does the rest for every family alike: the LLaMA
backbone's shape, numerics and tensors, the checks, the run directory.  A
family without this capability is one the original did not train.  The
mappings, and the file and commit each was read at, are in docs/ORIGINAL.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from depthbench.errors import ConfigError

IMPORT = "import-olmo"


class Fields:
    """Typed reads of one section of the original's config.json, each failure one
    ConfigError line naming the field (``where``: its path, ``model.block``)."""

    def __init__(self, data: dict, where: str):
        self.data, self.where = data, where

    def _error(self, text: str) -> ConfigError:
        return ConfigError(f"{IMPORT}: config.json: {text}")

    def sub(self, *names: str) -> Fields:
        """The first of ``names`` that is a section."""
        for name in names:
            value = self.data.get(name)
            if isinstance(value, dict):
                return Fields(value, f"{self.where}.{name}")
        raise self._error(f"{self.where}.{names[0]} is missing")

    def sub_or_empty(self, name: str) -> Fields:
        value = self.data.get(name)
        return Fields(value if isinstance(value, dict) else {}, f"{self.where}.{name}")

    def opt(self, name: str) -> Any:
        return self.data.get(name)

    def int(self, name: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.data.get(name, default)
        if value is None and default is not None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._error(f"{self.where}.{name} must be an integer >= {minimum}, got "
                              f"{value!r}")
        return value

    def num(self, name: str, default: float) -> float:
        value = self.data.get(name, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            raise self._error(f"{self.where}.{name} must be a number, got {value!r}")
        return float(value)

    def refuse(self, name: str, allowed: tuple = (None, False), why: str = "") -> None:
        value = self.data.get(name)
        if value not in allowed:
            raise self._error(f"{self.where}.{name} = {value!r} is not supported"
                              f"{': ' + why if why else ''}")

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.data.get(name) or default
        if value not in allowed:
            raise self._error(f"{self.where}.{name} {value!r} is not one of {', '.join(allowed)}")
        return value

    def must(self, ok: bool, text: str) -> None:
        """One line about this section unless ``ok``."""
        if not ok:
            raise self._error(f"{self.where}: {text}")


@dataclasses.dataclass(frozen=True)
class Choice:
    """A reading config.json does not decide for certain (which of the original's
    forms of a design): what was chosen, why, and the import option that picks
    another (``option``: its name, ``values``: what it takes)."""

    value: str
    certain: bool
    why: str
    option: str
    values: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        return {"form": self.value, "certain": self.certain, "why": self.why,
                "option": self.option}


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a block config means for the family that claims it."""

    block: str  # the original's block type (after its legacy layouts are read)
    residual: dict[str, Any]  # the family's fields
    train: dict[str, Any] = dataclasses.field(default_factory=dict)  # the rule it trained with
    departures: tuple[str, ...] = ()  # what the fields cannot carry (said, recorded)
    choice: Choice | None = None


@dataclasses.dataclass(frozen=True)
class Place:
    """Where (part of) a checkpoint tensor lands: a leaf of depthbench's parameter
    tree (``"blocks/residual/A0"``), an index into it (blocks stacked on a leading
    axis), the conversion to depthbench's layout and its inverse (None: as is)."""

    leaf: str
    index: tuple = ()
    to_ours: Callable[[np.ndarray], np.ndarray] | None = None
    to_theirs: Callable[[np.ndarray], np.ndarray] | None = None


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor of the original's checkpoint (``key`` without ``model.``), its shape,
    its places, and how the places' ``to_theirs`` outputs make it again (``join``;
    None: the one place's)."""

    key: str
    shape: tuple[int, ...]
    places: tuple[Place, ...]
    join: Callable[[list[np.ndarray]], np.ndarray] | None = None


@dataclasses.dataclass(frozen=True)
class Constant:
    """A parameter of depthbench's model that the original's does not have, set to
    ``value`` on import (keel's block-0 norm ...), never exported."""

    leaf: str
    index: tuple
    value: float


def linear(key: str, rows: int, cols: int, leaf: str, index: tuple = (),
           shape: tuple[int, ...] | None = None) -> Tensor:
    """A torch ``Linear`` weight ``[rows = out, cols = in]`` into depthbench's
    ``[in, out]`` leaf (reshaped to ``shape`` when given)."""
    ours = shape or (cols, rows)
    return Tensor(key, (rows, cols), (Place(leaf, index, lambda w: w.T.reshape(ours),
                                            lambda x: x.reshape(cols, rows).T),))


def vector(key: str, shape: tuple[int, ...], leaf: str, index: tuple = ()) -> Tensor:
    """A tensor stored as it is."""
    return Tensor(key, tuple(shape), (Place(leaf, index),))


PRE_NORMS = {"attention_norm": "blocks/attn_norm", "feed_forward_norm": "blocks/mlp_norm"}
POST_NORMS = {"attention_norm": "blocks/residual/attn_post_norm",
              "feed_forward_norm": "blocks/residual/mlp_post_norm"}


class OriginalFormat:
    """A family the original benchmark trained: its checkpoints both ways.

    The class attributes describe the family's blocks in the original's
    modules; the methods map config fields and tensors.  Defaults: a pre-norm
    block (``attention_norm``, ``feed_forward_norm``) with nothing of its own."""

    original_blocks: ClassVar[tuple[str, ...]] = ()  # model.block.name values it reads
    # model.block fields the family reads, with the values that mean "not used":
    # another family's block with one of them set is refused.
    original_fields: ClassVar[dict[str, tuple]] = {}
    original_norm: ClassVar[str] = "rms"  # the blocks' layer_norm.name
    # The module paths of the two sublayers inside a block (MoDA wraps them).
    original_sublayers: ClassVar[tuple[str, str]] = ("attention.", "feed_forward.")
    # Checkpoint entries that are not parameters of their own (aliases, buffers):
    # key fragments.
    original_ignored: ClassVar[tuple[str, ...]] = ()
    # Choices an import of the family's checkpoints takes that config.json does not
    # always decide: option -> (allowed values, default, help).  import-olmo offers
    # each as ``--option`` and hands it to ``from_original``; families declaring the
    # same option declare it alike.
    original_options: ClassVar[dict[str, tuple[tuple[str, ...], str, str]]] = {}

    @classmethod
    def original_claims(cls, block: Mapping[str, Any]) -> bool:
        """Whether the block config ``block`` (config.json ``model.block``) is this
        family's."""
        return (block.get("name") or "default") in cls.original_blocks

    @classmethod
    def from_original(cls, block: Fields, saved: Mapping[str, Any],
                      options: Mapping[str, str]) -> Reading:
        """The family's fields from its block config (``saved``: the whole
        config.json, for what the original recorded elsewhere; ``options``: the
        import's choices: ``original_options``)."""
        return Reading(block=block.opt("name") or "default", residual={})

    def to_original(self) -> dict[str, Any]:
        """The family's part of ``model.block`` for a checkpoint in the original's
        format (its name and fields); ConfigError if the original has no block
        computing this config."""
        return {"name": self.original_blocks[0]}

    def original_model(self, block: dict[str, Any]) -> dict[str, Any]:
        """Entries of config.json's ``model`` section beside ``model.block`` that this
        family's blocks need (``block``: the whole block config written); none by
        default."""
        return {}

    def original_norms(self, i: int) -> dict[str, str]:
        """Block ``i``'s norm modules (``attention_norm`` ...) and the leaves their
        weights land in."""
        return PRE_NORMS

    def original_block_tensors(self, i: int) -> list[Tensor | Constant]:
        """Block ``i``'s tensors of the family's own (``blocks.{i}.`` left out)."""
        return []

    def original_buffers(self, i: int) -> dict[str, np.ndarray]:
        """Block ``i``'s state-dict entries that are no parameters (buffers the
        original's or upstream OLMo-core's modules keep), by key without
        ``blocks.{i}.``: written on export so that a loader requiring every key
        finds them, never read on import (``original_ignored``)."""
        return {}

    def original_global_tensors(self) -> list[Tensor]:
        """The family's tensors outside the blocks."""
        return []
