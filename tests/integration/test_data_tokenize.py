"""``depthbench data tokenize``: equal to the tokenizer's own encode, identical for any number
of workers, resumable after a kill, readable by the ``tokens`` corpus, bad input exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from depthbench import config as config_lib
from depthbench import data
from depthbench.cli import main
from depthbench.config import ConfigError
from depthbench.data import split, token_cache
from depthbench.data import tokenize as tokenize_lib
from depthbench.digest import file_sha256

WORDS = ("the of and a to in is was that for on as with by he it at from his an were are which "
         "this be or has had not first one their its new after but who they also river north "
         "king queen war music art water light house year people world é ü — 日本 \n").split(" ")
FRACTION = 0.15
SHARD = 1000


def _docs(seed: int, n: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    """A small byte-level BPE tokenizer.json (the kind GPT-NeoX's is) with <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_docs(99, 500), trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """Documents over two jsonl files, a parquet file (3 row groups) and a text file, in the
    order the glob sorts them; includes an empty document and a null (both skipped)."""
    root = tmp_path_factory.mktemp("corpus")
    docs = _docs(0, 300)
    with open(root / "a.jsonl", "w") as f:
        for d in docs[:100]:
            f.write(json.dumps({"id": 1, "text": d}) + "\n")
        f.write(json.dumps({"text": ""}) + "\n\n")
    with open(root / "b.jsonl", "w") as f:
        for d in docs[100:180]:
            f.write(json.dumps({"text": d}) + "\n")
    pq.write_table(pa.table({"text": docs[180:299] + [None]}), root / "c.parquet",
                   row_group_size=40)
    (root / "d.txt").write_text(docs[299])
    return root, docs


def _run(corpus, tok, out, workers=1, chunk_bytes=1500, **opts) -> dict:
    root, _ = corpus
    options = tokenize_lib.Options(shard_tokens=SHARD, val_fraction=FRACTION, **opts)
    return tokenize_lib.run(f"{root}/*", str(tok), out, options, workers=workers,
                            chunk_bytes=chunk_bytes, progress=False, log=lambda m: None)


def _stream(out: Path, name: str) -> np.ndarray:
    files = sorted(out.glob(f"{name}_*.npy"))
    return np.concatenate([token_cache.open_tokens(f) for f in files])


def _outputs(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def reference(corpus, bpe, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "out"
    _run(corpus, bpe, out)
    return out


def test_equal_to_the_tokenizers_own_encode_with_eos_between(corpus, bpe, reference):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bpe))
    eos = tok.token_to_id("<|endoftext|>")
    expected = {False: [], True: []}
    for doc in corpus[1]:
        ids = tok.encode(doc).ids
        expected[split.is_validation(np.asarray(ids, np.uint32), FRACTION)].extend([*ids, eos])
    manifest = json.loads((reference / "manifest.json").read_text())
    for name, is_val in (("train", False), ("val", True)):
        np.testing.assert_array_equal(_stream(reference, name), expected[is_val])
        shards = manifest["splits"][name]["shards"]
        assert [s["tokens"] for s in shards[:-1]] == [SHARD] * (len(shards) - 1)
        assert sum(s["tokens"] for s in shards) == len(expected[is_val])
    assert manifest["eos_id"] == eos and manifest["dtype"] == "uint16"
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == 300
    assert manifest["splits"]["val"]["documents"] > 10  # the hash split held some out
    assert manifest["tokenizer"]["sha256"] == file_sha256(bpe)
    assert [Path(s["path"]).name for s in manifest["sources"]] == [
        "a.jsonl", "b.jsonl", "c.parquet", "d.txt"]
    assert sum(s["train_tokens"] + s["val_tokens"] for s in manifest["sources"]) == sum(
        len(v) for v in expected.values())
    assert not (reference / ".work").exists()


def test_identical_for_any_number_of_workers_and_units(corpus, bpe, reference, tmp_path):
    _run(corpus, bpe, tmp_path / "w2", workers=2)
    _run(corpus, bpe, tmp_path / "big", workers=1, chunk_bytes=1 << 20)  # one unit per file
    ref = _outputs(reference)
    assert _outputs(tmp_path / "w2") == ref
    assert _outputs(tmp_path / "big") == ref


def test_sentencepiece_model(corpus, tmp_path):
    from depthbench.data import spm_tokenizer

    model = tmp_path / "spm.model"
    spm_tokenizer.train(_docs(5, 300), 300, model)
    out = tmp_path / "out"
    _run(corpus, model, out)
    tk = spm_tokenizer.SentencePieceTokenizer(model)
    stream = []
    for doc in corpus[1]:
        ids = tk.encode(doc)
        if not split.is_validation(np.asarray(ids, np.uint32), FRACTION):
            stream.extend([*ids, tk.eos_id])
    np.testing.assert_array_equal(_stream(out, "train"), stream)


def test_token_corpus_reads_the_shards_with_the_same_split(corpus, bpe, reference, tmp_path):
    """data.corpus=tokens over OUT/*.npy, same val_fraction: the cache holds the same split."""
    config = config_lib.apply_overrides(config_lib.base_config(), {
        "data.cache_dir": str(tmp_path / "cache"), "data.corpus": "tokens",
        "data.paths": f"{reference}/*.npy", "data.eos_id": 0, "data.val_fraction": FRACTION,
        "model.vocab_size": 512, "train.seq_len": 16, "train.batch_size": 4,
        "data.val_windows": 8})
    p = data.prepare(config, progress=False)
    np.testing.assert_array_equal(np.load(p.train_tokens_path), _stream(reference, "train"))
    np.testing.assert_array_equal(np.load(p.val_tokens_path), _stream(reference, "val"))


KILLER = textwrap.dedent(f"""
    import os, signal, sys
    from depthbench.data import tokenize as t
    done = []
    def kill(result):
        done.append(result)
        if len(done) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    t.run(sys.argv[1], sys.argv[2], sys.argv[3],
          t.Options(shard_tokens={SHARD}, val_fraction={FRACTION!r}), workers=1, chunk_bytes=1500,
          progress=False, on_unit_done=kill)
""")


def test_resume_after_a_kill_redoes_no_finished_input(corpus, bpe, reference, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", KILLER, f"{corpus[0]}/*", str(bpe), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert not (out / "manifest.json").exists()
    finished = len(list((out / ".work").glob("*.json"))) - 1  # minus plan.json
    assert finished >= 3
    ran = []
    root, _ = corpus
    tokenize_lib.run(f"{root}/*", str(bpe), out,
                     tokenize_lib.Options(shard_tokens=SHARD, val_fraction=FRACTION),
                     chunk_bytes=1500, progress=False, log=lambda m: None,
                     on_unit_done=ran.append)
    total = len(tokenize_lib.inputs.plan_units(tokenize_lib.inputs.input_files(f"{root}/*"),
                                               "text", 1500))
    assert len(ran) == total - finished
    assert _outputs(out) == _outputs(reference)
    # A finished directory is not redone; another tokenisation is refused, the files kept.
    ran.clear()
    tokenize_lib.run(f"{root}/*", str(bpe), out,
                     tokenize_lib.Options(shard_tokens=SHARD, val_fraction=FRACTION),
                     progress=False, log=lambda m: None, on_unit_done=ran.append)
    assert ran == []


def _cli(capsys, *args) -> tuple[int, str]:
    code = main(["data", "tokenize", "--quiet", *args])
    return code, capsys.readouterr().err.strip()


def test_bad_inputs_are_one_line_exit_2(corpus, bpe, reference, tmp_path, capsys):
    root, _ = corpus
    before = _outputs(reference)
    code, err = _cli(capsys, "--input", f"{root}/a.jsonl", "--tokenizer", str(bpe),
                     "--text-field", "body", "--out", str(tmp_path / "o1"))
    assert code == 2 and "--text-field" in err and "a.jsonl" in err and "'body'" in err
    assert len(err.splitlines()) == 1
    code, err = _cli(capsys, "--input", f"{root}/c.parquet", "--tokenizer", str(bpe),
                     "--text-field", "body", "--out", str(tmp_path / "o2"))
    assert code == 2 and "c.parquet has no column 'body'" in err
    bad = tmp_path / "broken.json"
    bad.write_text('{"model": {"type": "BPE", "vocab": ')
    code, err = _cli(capsys, "--input", f"{root}/*", "--tokenizer", str(bad),
                     "--out", str(tmp_path / "o3"))
    assert code == 2 and "--tokenizer" in err and "not a Hugging Face tokenizer.json" in err
    assert len(err.splitlines()) == 1
    big = _big_vocab_tokenizer(tmp_path / "big.json")
    code, err = _cli(capsys, "--input", f"{root}/*", "--tokenizer", str(big), "--dtype",
                     "uint16", "--out", str(tmp_path / "o4"))
    assert code == 2 and "--dtype: uint16 holds ids up to 65535" in err and "70000" in err
    code, err = _cli(capsys, "--input", f"{root}/*", "--tokenizer", str(bpe),
                     "--shard-tokens", "7", "--out", str(reference))
    assert code == 2 and "holds a tokenisation with other inputs or options" in err
    code, err = _cli(capsys, "--input", f"{root}/nothing*.jsonl", "--tokenizer", str(bpe),
                     "--out", str(tmp_path / "o5"))
    assert code == 2 and err.startswith("depthbench: error: --input:")
    assert _outputs(reference) == before
    for o in ("o1", "o3", "o4", "o5"):
        assert not (tmp_path / o / "manifest.json").exists()


def _big_vocab_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(69999)}
    vocab["<|endoftext|>"] = 69999
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_cli_prints_the_training_overrides(corpus, bpe, tmp_path, capsys):
    root, _ = corpus
    out = tmp_path / "out"
    code = main(["data", "tokenize", "--quiet", "--input", f"{root}/a.jsonl", "--tokenizer",
                 str(bpe), "--out", str(out), "--val-fraction", "0.2", "--workers", "2"])
    assert code == 0
    printed = capsys.readouterr().out
    assert f"--config.data.paths='{out}/*.npy'" in printed
    assert "--config.data.eos_id=0 --config.data.val_fraction=0.2" in printed
    assert f"--config.data.tokenizer={bpe.resolve()}" in printed
    assert os.path.exists(out / "train_00000.npy")


def test_data_show_decodes_the_shards_with_the_printed_overrides(corpus, bpe, tmp_path,
                                                                   capsys):
    """The overrides `data tokenize` prints make `data show` decode the shards back to the
    documents' text: every decoded validation document is one of the inputs."""
    root, docs = corpus
    out = tmp_path / "out"
    assert main(["data", "tokenize", "--quiet", "--input", f"{root}/*", "--tokenizer", str(bpe),
                 "--out", str(out), "--val-fraction", str(FRACTION)]) == 0
    overrides = capsys.readouterr().out.split("train with: ")[1].split()
    assert main(["data", "show", "--json", "--split", "val", "--windows", "2", *overrides,
                 f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.model.vocab_size=512",
                 "--config.train.seq_len=64", "--config.train.batch_size=2"]) == 0
    windows = json.loads(capsys.readouterr().out)
    # A window's first and last documents may be cut; every one in between is whole.
    inner = [t for w in windows for t in w["text"].split("\n<|eos|>\n")[1:-1]]
    assert inner and all(t in docs for t in inner), inner


def test_gzipped_inputs_tokenize_like_plain_ones(corpus, bpe, tmp_path):
    import gzip

    root, _ = corpus
    plain, zipped = tmp_path / "plain", tmp_path / "zipped"
    plain.mkdir(), zipped.mkdir()
    for name in ("a.jsonl", "d.txt"):
        data_bytes = (root / name).read_bytes()
        (plain / name).write_bytes(data_bytes)
        (zipped / f"{name}.gz").write_bytes(gzip.compress(data_bytes))
    opts = tokenize_lib.Options(shard_tokens=SHARD, val_fraction=FRACTION)
    for src in (plain, zipped):
        tokenize_lib.run(f"{src}/*", str(bpe), tmp_path / f"out-{src.name}", opts,
                         chunk_bytes=1500, progress=False, log=lambda m: None)
    for name in ("train", "val"):
        np.testing.assert_array_equal(_stream(tmp_path / "out-plain", name),
                                      _stream(tmp_path / "out-zipped", name))


def test_a_bad_document_found_while_tokenising_keeps_only_useful_work(bpe, tmp_path, monkeypatch):
    """Past the start of each file (what the preflight reads), a bad line is found by a
    worker: units finished before it are kept, and a re-run after the fix redoes only
    the fixed file; with no unit finished, nothing this run created is left."""
    monkeypatch.setattr(tokenize_lib.inputs, "PREFLIGHT_BYTES", 100)
    src = tmp_path / "src"
    src.mkdir()
    good = "".join(json.dumps({"text": d}) + "\n" for d in _docs(1, 60))
    (src / "a.jsonl").write_text(good)
    (src / "b.jsonl").write_text(good + "{not json\n")
    opts = tokenize_lib.Options(shard_tokens=SHARD, val_fraction=FRACTION)

    def run(pattern, out, ran, chunk_bytes=1500):
        return tokenize_lib.run(pattern, str(bpe), out, opts, chunk_bytes=chunk_bytes,
                                progress=False, log=lambda m: None, on_unit_done=ran.append)

    out, ran = tmp_path / "new" / "out", []
    with pytest.raises(ConfigError, match=r"b\.jsonl:61 is not JSON") as e:
        run(str(src / "b.jsonl"), out, ran, chunk_bytes=1 << 20)  # one unit: none finishes
    assert "kept" not in str(e.value) and not (tmp_path / "new").exists()

    out, ran = tmp_path / "out", []
    with pytest.raises(ConfigError, match=r"b\.jsonl \(line at byte \d+\) is not JSON .*; the "
                                          r"\d+ unit\(s\) finished are kept in .*\.work: fix"):
        run(f"{src}/*.jsonl", out, ran)
    units_a = len(tokenize_lib.inputs.plan_units([src / "a.jsonl"], "text", 1500))
    assert len(ran) >= units_a > 1 and not (out / "manifest.json").exists()
    (src / "b.jsonl").write_text(good)
    # As if a merge of the old inputs had been interrupted: a full shard, now stale.
    np.save(out / "train_00000.npy", np.zeros(SHARD, np.uint16))
    ran.clear()
    run(f"{src}/*.jsonl", out, ran)
    assert {Path(r["unit"]["path"]).name for r in ran} == {"b.jsonl"}
    fresh = tmp_path / "fresh"
    run(f"{src}/*.jsonl", fresh, [])
    assert _outputs(out) == _outputs(fresh)


