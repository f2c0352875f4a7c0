"""A small synthetic corpus (400 documents over 8 text files) and its prepared
cache, for the data tests of both tiers (tests/unit/test_data.py and
tests/integration/test_data_workers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from depthbench import config as config_lib
from depthbench import data

SEQ_LEN, BATCH, VOCAB = 16, 4, 384


_WORDS = (
    "the of and a to in is was that for on as with by he it at from his an were are which this "
    "be or has had not first one their its new after but who they also been have her she two "
    "time city river north south king queen war music art water light house year people world "
    "small great old long high early late black white red green blue stone iron gold silver "
    "under over between during against across through before among within without"
).split()


def _sentence(rng: np.random.Generator) -> str:
    words = rng.choice(_WORDS, size=rng.integers(4, 14))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", "!", "?", ";"])


def _document(rng: np.random.Generator) -> str:
    paragraphs = []
    for _ in range(rng.integers(1, 4)):
        paragraphs.append(" ".join(_sentence(rng) for _ in range(rng.integers(1, 6))))
    return "\n".join(paragraphs)


def make_config(tmp, **overrides):
    base = {
        "data.cache_dir": str(tmp / "cache"),
        "model.vocab_size": VOCAB,
        "train.seq_len": SEQ_LEN,
        "train.batch_size": BATCH,
        "data.val_fraction": 0.1,
        "data.val_windows": 8,
        "data.prefetch": 2,
    }
    base.update(overrides)
    return config_lib.apply_overrides(config_lib.base_config(), base)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """400 synthetic documents over 8 text files (one document per paragraph block)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    docs = [_document(rng) for _ in range(400)]
    docs[7] = docs[3]  # a duplicate: must land in the same split as its twin
    for i in range(8):
        (root / f"part{i}.txt").write_text("\n\n".join(docs[i::8]) + "\n")
    return root, docs


@pytest.fixture(scope="module")
def prepared(corpus_dir, tmp_path_factory):
    root, _ = corpus_dir
    tmp = tmp_path_factory.mktemp("prepared")
    config = make_config(
        tmp,
        **{"data.corpus": "text", "data.paths": f"{root}/part*.txt", "data.split_by": "paragraph"},
    )
    return config, data.prepare(config, progress=False)


def make_config_like(config, **overrides):
    return config_lib.apply_overrides(config, overrides)
