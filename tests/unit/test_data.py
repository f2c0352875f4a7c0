"""Data pipeline on a small synthetic corpus: split, tokenizer, cache, windows, sharding, resume.

One corpus is prepared per module (SentencePiece training takes ~0.3 s on it);
every test reads that prepared cache.  The real micro corpus is exercised
end to end in test_data_micro.py.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time

import numpy as np
import pytest
from data_synthetic import BATCH, SEQ_LEN, VOCAB, make_config, make_config_like

from depthbench import config as config_lib
from depthbench import data
from depthbench.data import corpora, split, token_cache
from depthbench.data.pipeline import WindowReader, window_count


def _documents(path: str, eos_id: int) -> list[tuple[int, ...]]:
    flat = np.load(path)
    assert flat[-1] == eos_id  # every document is closed by EOS
    ends = np.flatnonzero(flat == eos_id)
    return [
        tuple(flat[s + 1 if i else 0 : e])
        for i, (s, e) in enumerate(zip(np.r_[-1, ends[:-1]], ends, strict=True))
    ]


# ------------------------------------------------------------ split and tokenizer


def test_split_counts_and_disjoint(prepared, corpus_dir):
    config, p = prepared
    _, docs = corpus_dir
    assert p.train_documents + p.val_documents == len(docs)
    expected_val = sum(split.is_validation(d, 0.1) for d in docs)
    assert p.val_documents == expected_val
    assert 0.03 < p.val_documents / len(docs) < 0.2  # the hash split is roughly the fraction
    train = set(_documents(p.train_tokens_path, p.eos_id))
    val = set(_documents(p.val_tokens_path, p.eos_id))
    assert train and val and not train & val
    # The duplicate pair is on one side only (hash of the content, not the position).
    assert split.is_validation(docs[3], 0.1) == split.is_validation(docs[7], 0.1)


def test_flat_arrays_hold_the_documents_in_order(prepared, corpus_dir):
    config, p = prepared
    _, docs = corpus_dir
    tok = data.tokenizer(p)
    ordered = [d for i in range(8) for d in docs[i::8]]  # file order, then paragraph order
    train_docs = [d for d in ordered if not split.is_validation(d, 0.1)]
    decoded = [tok.decode(ids) for ids in _documents(p.train_tokens_path, p.eos_id)]
    assert decoded == train_docs
    assert p.train_tokens == len(np.load(p.train_tokens_path))
    assert p.bytes_per_token == pytest.approx(
        sum(len(d.encode()) for d in train_docs) / (p.train_tokens - p.train_documents)
    )


def test_tokenizer_round_trip_and_ids(prepared):
    _, p = prepared
    tok = data.tokenizer(p)
    assert (tok.vocab_size, p.vocab_size) == (VOCAB, VOCAB)
    assert (p.bos_id, p.eos_id, p.pad_id) == (1, 2, 3)
    for text in [
        "The river north of the city.",
        "  two leading spaces\nand a new line\n",
        "unseen: Zürich, 東京, emoji \U0001f600, tab\tend",
        "",
        "\n\n",
    ]:
        ids = tok.encode(text)
        assert all(0 <= i < VOCAB for i in ids)
        assert tok.decode(ids) == text
    # A line-initial word is tokenised like the same word after a space (trained per line).
    assert tok.encode("x\nThe")[-len(tok.encode("The")) :] == tok.encode("The")


def test_prepare_is_cached(prepared):
    config, p = prepared
    stamp = os.stat(p.train_tokens_path).st_mtime_ns
    again = data.prepare(config, progress=False)
    assert again == p
    assert os.stat(p.train_tokens_path).st_mtime_ns == stamp
    leftovers = [
        n for _, dirs, files in os.walk(config.data.cache_dir) for n in dirs + files if ".tmp-" in n
    ]
    assert leftovers == []


# ------------------------------------------------------------ windows and iterator


def _window_index(path: str) -> dict[bytes, int]:
    flat = np.load(path).astype(np.int32)
    n = window_count(len(flat), SEQ_LEN)
    return {flat[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1].tobytes(): i for i in range(n)}


def _rows(batch) -> list[bytes]:
    full = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
    return [r.tobytes() for r in full]


def test_windows_are_contiguous_runs(prepared):
    config, p = prepared
    index = _window_index(p.train_tokens_path)
    it = data.train_iterator(config, p, process_index=0, process_count=1)
    for _ in range(5):
        batch = next(it)
        assert batch["inputs"].shape == batch["targets"].shape == (BATCH, SEQ_LEN)
        assert batch["inputs"].dtype == np.int32
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
        for row in _rows(batch):
            assert row in index  # a run of the flat array starting at a multiple of seq_len


def test_epochs_cover_every_window_once_and_reshuffle(prepared):
    config, p = prepared
    index = _window_index(p.train_tokens_path)
    n = len(index)
    it = data.train_iterator(config, p, process_index=0, process_count=1)
    order = [index[r] for batch in itertools.islice(it, -(-2 * n // BATCH)) for r in _rows(batch)]
    first, second = order[:n], order[n : 2 * n]
    assert sorted(first) == list(range(n))  # a permutation of all windows
    assert first != sorted(first)  # shuffled
    assert sorted(second) == list(range(n)) and second != first  # reshuffled (seed + 1)
    other = data.train_iterator(
        make_config_like(config, **{"data.shuffle_seed": 1}), p, process_index=0, process_count=1
    )
    assert [index[r] for r in _rows(next(other))] != first[:BATCH]


@pytest.mark.parametrize("hosts", [2, 4])
def test_sharding_partitions_the_global_batch(prepared, hosts):
    config, p = prepared
    single = data.train_iterator(config, p, process_index=0, process_count=1)
    shards = [
        data.train_iterator(config, p, process_index=i, process_count=hosts) for i in range(hosts)
    ]
    for _ in range(6):
        whole = sorted(_rows(next(single)))
        parts = [_rows(next(s)) for s in shards]
        assert all(len(rows) == BATCH // hosts for rows in parts)
        assert sorted(r for rows in parts for r in rows) == whole  # no overlap, nothing lost


def test_batch_not_divisible_by_hosts_is_an_error(prepared):
    config, p = prepared
    with pytest.raises(config_lib.ConfigError, match="train.batch_size"):
        data.train_iterator(config, p, process_index=0, process_count=3)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_restored_iterator_continues_exactly(prepared, prefetch):
    config, p = prepared
    config = make_config_like(config, **{"data.prefetch": prefetch})
    k, m = 7, 6
    reference = data.train_iterator(config, p, process_index=0, process_count=1)
    expected = [next(reference) for _ in range(k + m)]
    it = data.train_iterator(config, p, process_index=0, process_count=1)
    for _ in range(k):
        next(it)
    state = it.get_state()
    resumed = data.train_iterator(config, p, process_index=0, process_count=1)
    resumed.set_state(state)
    for want in expected[k:]:
        got = next(resumed)
        np.testing.assert_array_equal(got["inputs"], want["inputs"])
        np.testing.assert_array_equal(got["targets"], want["targets"])


def test_orbax_checkpoint_round_trip(prepared, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    config, p = prepared
    it = data.train_iterator(config, p, process_index=0, process_count=1)
    for _ in range(5):
        next(it)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(
            5,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave({"w": np.arange(3.0)}),
                data=data.checkpoint_save_arg(it),
            ),
        )
        mngr.wait_until_finished()
        expected = [next(it) for _ in range(4)]
        fresh = data.train_iterator(config, p, process_index=0, process_count=1)
        restored = mngr.restore(
            5,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore({"w": np.zeros(3)}),
                data=data.checkpoint_restore_arg(fresh),
            ),
        )
    np.testing.assert_array_equal(restored["state"]["w"], np.arange(3.0))
    for want in expected:
        np.testing.assert_array_equal(next(fresh)["inputs"], want["inputs"])


def test_val_batches_fixed_and_sharded(prepared):
    config, p = prepared
    index = _window_index(p.val_tokens_path)
    batches = data.val_batches(config, p, process_index=0, process_count=1)
    assert len(batches) == 2  # val_windows 8 = two global batches of 4
    rows = [r for b in batches for r in _rows(b)]
    assert len(set(rows)) == 8 and all(r in index for r in rows)
    again = data.val_batches(config, p, process_index=0, process_count=1)
    assert [_rows(b) for b in again] == [_rows(b) for b in batches]
    halves = [data.val_batches(config, p, process_index=i, process_count=2) for i in (0, 1)]
    for j, batch in enumerate(batches):
        assert sorted(_rows(halves[0][j]) + _rows(halves[1][j])) == sorted(_rows(batch))
    # Rounded up to whole global batches: 5 windows -> 8.
    five = data.val_batches(
        make_config_like(config, **{"data.val_windows": 5}), p, process_index=0, process_count=1
    )
    assert sum(len(b["inputs"]) for b in five) == 8


# ------------------------------------------------------------ other corpora


def test_jsonl_corpus(tmp_path, corpus_dir):
    _, docs = corpus_dir
    lines = [f'{{"id": {i}, "body": {json.dumps(d)}}}' for i, d in enumerate(docs)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:200]) + "\n\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[200:]) + "\n")
    config = make_config(
        tmp_path,
        **{
            "data.corpus": "jsonl",
            "data.text_field": "body",
            "data.paths": f"{tmp_path}/a.jsonl,{tmp_path}/b.jsonl",
        },
    )
    p = data.prepare(config, progress=False)
    assert p.train_documents + p.val_documents == len(docs)
    tok = data.tokenizer(p)
    assert tok.decode(_documents(p.val_tokens_path, p.eos_id)[0]) == next(
        d for d in docs if split.is_validation(d, 0.1)
    )


def test_text_corpus_one_document_per_file(tmp_path, corpus_dir):
    _, docs = corpus_dir
    for i, d in enumerate(docs):
        (tmp_path / f"{i:03d}.txt").write_text(d)
    config = make_config(tmp_path, **{"data.corpus": "text", "data.paths": f"{tmp_path}/*.txt"})
    p = data.prepare(config, progress=False)
    assert p.train_documents + p.val_documents == len(docs)


def _write_shards(tmp_path, dtype, eos=2):
    rng = np.random.default_rng(1)
    docs = [rng.integers(4, 300, size=rng.integers(5, 60)) for _ in range(300)]
    flat = np.concatenate([np.r_[d, eos] for d in docs])
    half = len(flat) // 2
    half = int(np.flatnonzero(flat[:half] == eos)[-1]) + 1  # split the shards at a document end
    np.save(tmp_path / "s0.npy", flat[:half].astype(dtype))
    np.save(tmp_path / "s1.npy", flat[half:].astype(dtype))
    return docs


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_shards(tmp_path, dtype):
    docs = _write_shards(tmp_path, dtype)
    config = make_config(
        tmp_path,
        **{
            "data.corpus": "tokens",
            "data.paths": f"{tmp_path}/s*.npy",
            "data.tokens_dtype": dtype,
            "data.eos_id": 2,
        },
    )
    p = data.prepare(config, progress=False)
    assert (p.eos_id, p.tokenizer_path, p.bytes_per_token) == (2, "", 0.0)
    train = _documents(p.train_tokens_path, 2)
    val = _documents(p.val_tokens_path, 2)
    assert sorted(train + val) == sorted(tuple(d) for d in docs)
    assert {tuple(d) for d in val} == {tuple(d) for d in docs if split.is_validation(d, 0.1)}
    batch = next(data.train_iterator(config, p, process_index=0, process_count=1))
    assert batch["inputs"].shape == (BATCH, SEQ_LEN)
    with pytest.raises(config_lib.ConfigError, match="data.tokenizer"):
        data.tokenizer(p)


def test_token_writer_streams_a_valid_npy(tmp_path):
    path = tmp_path / "x.npy"
    with token_cache.TokenWriter(path, np.uint16) as w:
        w.write([1, 2, 3])
        w.write(np.arange(10, 1000, dtype=np.int64))
    expected = np.r_[1, 2, 3, np.arange(10, 1000)].astype(np.uint16)
    np.testing.assert_array_equal(np.load(path), expected)
    np.testing.assert_array_equal(token_cache.open_tokens(path), expected)
    with pytest.raises(ValueError), token_cache.TokenWriter(tmp_path / "y.npy", np.uint16) as w:
        w.write([70000])
    assert os.listdir(tmp_path) == ["x.npy"]  # the failed writer left nothing behind


def test_resolve_paths_dedups_and_orders(tmp_path):
    for name in ("b.txt", "a.txt"):
        (tmp_path / name).write_text("x")
    got = corpora.resolve_paths(f"{tmp_path}/*.txt, {tmp_path}/a.txt")
    assert [g.name for g in got] == ["a.txt", "b.txt"]


def test_damaged_cache_is_reported(corpus_dir, tmp_path):
    root, _ = corpus_dir
    config = make_config(
        tmp_path,
        **{"data.corpus": "text", "data.paths": f"{root}/part*.txt", "data.split_by": "paragraph"},
    )
    p = data.prepare(config, progress=False)
    with open(p.val_tokens_path, "r+b") as f:
        f.truncate(os.path.getsize(p.val_tokens_path) - 10)
    with pytest.raises(
        config_lib.ConfigError,
        match=r"data.cache_dir: .*val.npy is truncated.*"
        r"delete .* to rebuild it",
    ):
        data.prepare(config, progress=False)


def test_cli_prepare_reports_the_prepared_corpus(prepared, corpus_dir, capsys):
    from depthbench import cli

    config, p = prepared
    root, _ = corpus_dir
    args = ["data", "prepare", "--quiet"] + [
        f"--config.{k}={v}"
        for k, v in {
            "data.cache_dir": config.data.cache_dir,
            "data.corpus": "text",
            "data.paths": f"{root}/part*.txt",
            "data.split_by": "paragraph",
            "model.vocab_size": VOCAB,
            "train.seq_len": SEQ_LEN,
            "train.batch_size": BATCH,
            "data.val_fraction": 0.1,
            "data.val_windows": 8,
        }.items()
    ]
    capsys.readouterr()
    assert cli.main([*args, "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    assert {k: reported[k] for k in p.as_dict()} == p.as_dict()
    assert reported["train_windows_available"] == window_count(p.train_tokens, SEQ_LEN)
    assert cli.main(args) == 0
    table = capsys.readouterr().out
    train_row = next(line for line in table.splitlines() if line.startswith("train "))
    assert train_row.split()[1:3] == [f"{p.train_documents:,}", f"{p.train_tokens:,}"]


def test_window_reader_opens_its_file_once_when_threads_call_it_at_once(tmp_path, monkeypatch):
    """The prefetch threads call a new reader together: one of them opens the
    file (numpy's header parser is not thread-safe on CPython 3.11), the others
    wait for it, and every batch holds the right windows."""
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(1000, dtype=np.uint16))
    opened, real_open = [], token_cache.open_tokens

    def slow_open(*args, **kwargs):
        opened.append(threading.get_ident())
        time.sleep(0.05)  # wide enough for every thread to arrive while it opens
        return real_open(*args, **kwargs)

    monkeypatch.setattr(token_cache, "open_tokens", slow_open)
    reader = WindowReader(str(path), seq_len=8)
    start, results = threading.Barrier(8), {}

    def call(i):
        start.wait()
        results[i] = reader([i, i + 1])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 1 and sorted(results) == list(range(8))  # no thread failed
    for i, batch in results.items():
        np.testing.assert_array_equal(batch["inputs"][0], np.arange(8 * i, 8 * i + 8))
        np.testing.assert_array_equal(batch["targets"][1], np.arange(8 * i + 9, 8 * i + 17))
