"""What a run trains on and where its parameters start: the trainer's one seam.

The loop is the same for every run; what differs between pretraining
(:class:`CorpusInputs`: a tokenised corpus, a fresh init from the seed) and
fine-tuning (``finetune.trainer.FinetuneInputs``) is asked of an
:class:`Inputs`: its data, the "resolved" block and files it records, its
batches, its first state and what ``result.json`` adds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from depthbench import data
from depthbench.train import state as state_lib


class Inputs(Protocol):
    vocab_size: int
    evaluate_first: bool

    def prepare(self, progress: bool) -> None: ...
    def resolved(self) -> dict: ...
    def files(self) -> dict[str, Path]: ...
    def train_iterator(self) -> Any: ...
    def val_batches(self) -> list[dict]: ...
    def val_loss(self, losses: np.ndarray) -> float: ...
    def initial_state(self, s: state_lib.TrainSetup, seed: int, init_fn) -> Any: ...
    def result_fields(self, workdir: Path) -> dict: ...


class CorpusInputs:
    """Pretraining: the config's corpus (``data.*``), windows of ``train.seq_len``
    tokens, parameters initialised from ``train.seed``."""

    evaluate_first = False

    def __init__(self, config):
        self.config = config
        self.prepared: data.Prepared | None = None

    @property
    def vocab_size(self) -> int:
        return self.prepared.vocab_size

    def prepare(self, progress: bool) -> None:
        self.prepared = data.prepare(self.config, progress=progress)

    def resolved(self) -> dict:
        return {"tokenizer": self.prepared.as_dict()}

    def files(self) -> dict[str, Path]:
        return {}  # the tokenizer stays in the data cache, where resolved.tokenizer says

    def train_iterator(self):
        return data.train_iterator(self.config, self.prepared)

    def val_batches(self) -> list[dict]:
        return data.val_batches(self.config, self.prepared)

    def val_loss(self, losses: np.ndarray) -> float:
        return float(np.mean(losses))  # every window holds the same number of tokens

    def initial_state(self, s: state_lib.TrainSetup, seed: int, init_fn):
        return state_lib.init_state(s, seed, init_fn)

    def result_fields(self, workdir: Path) -> dict:
        return {}
