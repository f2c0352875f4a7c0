"""Bad input to ``depthbench data prepare | tokenize | show``, table-driven (integration:
each case runs the command in its own process, as a user does).

Every case must exit 2 with exactly one stderr line, starting ``depthbench:
error:`` and matching the case's pattern (it names the option, field or file
and what is allowed), with no traceback, and leave the scratch directory as it
was: every file's size and SHA-256 and every directory the same (the data
cache may gain entries from preparing good data, never a temporary one).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from depthbench import config as config_lib

BASE = str(config_lib.base_spec_path())
WORDS = "the river runs north of the old city and small boats carry stone to the market".split()


def _tokenizer_json(path: Path, vocab: list[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


@pytest.fixture(scope="module")
def disk(tmp_path_factory) -> Path:
    """Inputs good and bad for the three actions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from depthbench.data import spm_tokenizer

    d = tmp_path_factory.mktemp("disk")
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 40)))) for _ in range(120)]
    lines = "".join(json.dumps({"text": t}) + "\n" for t in docs)
    (d / "good.jsonl").write_text(lines)
    (d / "corpus.txt").write_text("\n\n".join(docs))
    _tokenizer_json(d / "tok.json", ["[UNK]", "<|endoftext|>", *sorted(set(WORDS))])
    _tokenizer_json(d / "no_eos.json", ["[UNK]", *sorted(set(WORDS))])
    (d / "garbage.json").write_text('{"model": {"type": "BPE", "vocab": ')
    spm_tokenizer.train(docs, 300, d / "spm.model", num_threads=1)
    # JSON lines gone wrong
    (d / "broken_first.jsonl").write_text('{"text": broken\n' + lines)
    (d / "broken_late.jsonl").write_text(lines + '{"text": "unterminated\n')
    (d / "list_text.jsonl").write_text(lines + json.dumps({"text": ["a", "b"]}) + "\n")
    (d / "int_text.jsonl").write_text(json.dumps({"text": 7}) + "\n")
    (d / "body.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in docs))
    (d / "array.jsonl").write_text("[1, 2, 3]\n")
    (d / "whole.json").write_text(json.dumps([{"text": t} for t in docs[:3]]))
    (d / "latin1.jsonl").write_bytes('{"text": "caf\xe9"}\n'.encode("latin-1"))
    (d / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (d / "empty.jsonl").write_text('\n{"text": ""}\n{"text": null}\n')
    # compressed and columnar files gone wrong
    (d / "plain.jsonl.gz").write_text(lines)  # not gzip at all
    (d / "cut.jsonl.gz").write_bytes(gzip.compress(lines.encode())[:200])
    (d / "plain.txt.gz").write_text(docs[0])
    pq.write_table(pa.table({"text": [1, 2, 3]}), d / "ints.parquet")
    (d / "junk.parquet").write_text("not parquet\n")
    (d / "table.csv").write_text("text\nhello\n")
    # directories and files in the wrong places
    (d / "a_file").write_text("a file, not a directory\n")
    (d / "a_dir").mkdir()
    (d / "out_bad_manifest").mkdir()
    (d / "out_bad_manifest" / "manifest.json").write_text("{truncated")
    (d / "out_bad_plan" / ".work").mkdir(parents=True)
    (d / "out_bad_plan" / ".work" / "plan.json").write_text("{truncated")
    return d


def _tokenize(d: Path, *args: str, tokenizer: str = "tok.json", out: str = "out") -> list[str]:
    argv = ["data", "tokenize", "--tokenizer", str(d / tokenizer), "--out", str(d / out)]
    if "--input" not in args:
        argv += ["--input", str(d / "good.jsonl")]
    return [*argv, *args]


def _in(d: Path, name: str, *args: str, **kw) -> list[str]:
    return _tokenize(d, "--input", str(d / name), *args, **kw)


def _prepare(d: Path, *overrides: str, action: str = "prepare") -> list[str]:
    return ["data", action, "--config", BASE, "--quiet", f"--config.data.cache_dir={d / 'cache'}",
            "--config.train.seq_len=16", "--config.train.batch_size=4",
            "--config.data.val_windows=4", "--config.data.val_fraction=0.2",
            "--config.model.vocab_size=300", "--config.data.corpus=text",
            f"--config.data.paths={d / 'corpus.txt'}", "--config.data.split_by=paragraph",
            *overrides]


def _prep_with(d: Path, field: str, *parts: str) -> list[str]:
    return _prepare(d, f"--config.data.{field}={d.joinpath(*parts)}")


def _prep_file(d: Path, name: str) -> list[str]:
    corpus = "text" if ".txt" in name else "jsonl"
    return _prepare(d, f"--config.data.corpus={corpus}", f"--config.data.paths={d / name}")


# Files the one reader of each format refuses, whichever command reads them: (what,
# file, pattern with {paths} / {field} for how the command names the input / text field).
READER_CASES = [
    ("a malformed JSON line", "broken_first.jsonl",
     r"{paths}: .*broken_first\.jsonl:1 is not JSON \(Expecting value at column 10\)"),
    ("a malformed JSON line further on", "broken_late.jsonl",
     r"{paths}: .*broken_late\.jsonl:121 is not JSON \(Unterminated string starting at "
     r"column 10\)"),
    ("a text field that is a list", "list_text.jsonl",
     r"{field}: .*list_text\.jsonl:121 field 'text' is list, not a string"),
    ("a text field that is a number", "int_text.jsonl",
     r"{field}: .*int_text\.jsonl:1 field 'text' is int, not a string"),
    ("no such text field", "body.jsonl",
     r"{field}: .*body\.jsonl:1 has no field 'text' \(it has: body\)"),
    ("a JSON line that is an array", "array.jsonl",
     r"{field}: .*array\.jsonl:1 is a JSON list, not an object with a 'text' field"),
    ("a .json file holding one array", "whole.json",
     r"{field}: .*whole\.json:1 is a JSON list, not an object"),
    ("JSON lines not in UTF-8", "latin1.jsonl",
     r"{paths}: .*latin1\.jsonl:1 is not UTF-8 text \(byte 0xe9 at offset 13\)"),
    ("a text file not in UTF-8", "latin1.txt",
     r"{paths}: .*latin1\.txt is not UTF-8 text \(byte 0xe9 at offset 3\)"),
    (".jsonl.gz that is not gzip", "plain.jsonl.gz",
     r"{paths}: .*plain\.jsonl\.gz is not a readable gzip file \(BadGzipFile"),
    ("a truncated .jsonl.gz", "cut.jsonl.gz",
     r"{paths}: .*cut\.jsonl\.gz is not a readable gzip file \(EOFError"),
    (".txt.gz that is not gzip", "plain.txt.gz",
     r"{paths}: .*plain\.txt\.gz is not a readable gzip file"),
]
NAMES = {"tokenize": {"paths": "--input", "field": "--text-field"},
         "prepare": {"paths": r"config\.data\.paths", "field": r"config\.data\.text_field"}}


def _reader_cases() -> list[tuple]:
    build = {"tokenize": _in, "prepare": _prep_file}
    return [(f"{command}: {what}", lambda d, f=file, c=command: build[c](d, f),
             pattern.format(**NAMES[command]))
            for command in build for what, file, pattern in READER_CASES]


# (id, argv(disk), pattern of the one stderr line after "depthbench: error: ")
CASES = [
    *_reader_cases(),  # the three data tokenize cases among them
    ("tokenize: --text-field names a missing field", lambda d: _tokenize(d, "--text-field", "x"),
     r"--text-field: .*good\.jsonl:1 has no field 'x' \(it has: text\)"),
    ("tokenize: inputs without a document", lambda d: _in(d, "empty.jsonl"),
     r"--input: the 1 file\(s\) hold no documents .*; nothing written"),
    # ------------------------------------------------ data tokenize: files
    ("tokenize: a Parquet column of numbers", lambda d: _in(d, "ints.parquet"),
     r"--text-field: .*ints\.parquet column 'text' is int64, not a string"),
    ("tokenize: a file that is not Parquet", lambda d: _in(d, "junk.parquet"),
     r"--input: .*junk\.parquet is not a Parquet file"),
    ("tokenize: a file kind it does not read", lambda d: _in(d, "table.csv"),
     r"--input: .*table\.csv is not a file kind data tokenize reads \(\.parquet, \.jsonl"),
    ("tokenize: a directory as --input", lambda d: _in(d, "a_dir"),
     r"--input: '.*a_dir' is a directory; give a glob such as"),
    # ------------------------------------------------ data tokenize: tokenizer
    ("tokenize: a directory as --tokenizer", lambda d: _tokenize(d, tokenizer="a_dir"),
     r"--tokenizer: '.*a_dir' is a directory, not a tokenizer file"),
    ("tokenize: a tokenizer.json that does not parse",
     lambda d: _tokenize(d, tokenizer="garbage.json"),
     r"--tokenizer: .*garbage\.json is not a Hugging Face tokenizer\.json"),
    ("tokenize: a tokenizer.json without EOS", lambda d: _tokenize(d, tokenizer="no_eos.json"),
     r"--tokenizer: .*no_eos\.json has no EOS token .*--eos-token"),
    ("tokenize: --eos-token not in the vocabulary", lambda d: _tokenize(d, "--eos-token", "</s>"),
     r"--eos-token: '</s>' is not in .*tok\.json's vocabulary"),
    ("tokenize: --eos-token with a SentencePiece model",
     lambda d: _tokenize(d, "--eos-token", "</s>", tokenizer="spm.model"),
     r"--eos-token: only for tokenizer\.json files"),
    # ------------------------------------------------ data tokenize: options and --out
    ("tokenize: --workers 0", lambda d: _tokenize(d, "--workers", "0"),
     r"--workers: must be a positive integer, got 0"),
    ("tokenize: --shard-tokens 0", lambda d: _tokenize(d, "--shard-tokens", "0"),
     r"--shard-tokens: must be a positive integer, got 0"),
    ("tokenize: --val-fraction nan", lambda d: _tokenize(d, "--val-fraction", "nan"),
     r"--val-fraction: must be in \[0, 1\), got nan"),
    ("tokenize: --val-fraction 1", lambda d: _tokenize(d, "--val-fraction", "1"),
     r"--val-fraction: must be in \[0, 1\), got 1\.0"),
    ("tokenize: --out is a file", lambda d: _tokenize(d, out="a_file"),
     r"--out: .*a_file exists and is not a directory"),
    ("tokenize: --out inside a file", lambda d: _tokenize(d, out="a_file/sub"),
     r"--out: .*a_file is a file, so .*a_file/sub cannot be a directory"),
    ("tokenize: --out with a damaged manifest", lambda d: _tokenize(d, out="out_bad_manifest"),
     r"--out: .*out_bad_manifest/manifest\.json is unreadable \(JSONDecodeError\)"),
    ("tokenize: --out with a damaged plan", lambda d: _tokenize(d, out="out_bad_plan"),
     r"--out: .*out_bad_plan/\.work/plan\.json is unreadable \(JSONDecodeError\)"),
    ("tokenize: --out holding other files", lambda d: _tokenize(d, out="."),
     r"--out: .* is not empty and holds no data tokenize output"),
    # ------------------------------------------------ data show
    ("show: --windows 10000000 (bounded work)", lambda d: _prepare(d, "--windows", "10000000",
                                                                 action="show"),
     r"--windows: must be in \[1, 1000\], got 10000000"),
    ("show: --windows 0", lambda d: _prepare(d, "--windows", "0", action="show"),
     r"--windows: must be in \[1, 1000\], got 0"),
    ("show: --windows -3", lambda d: _prepare(d, "--windows", "-3", action="show"),
     r"--windows: must be in \[1, 1000\], got -3"),
    # ------------------------------------------------ data prepare
    ("prepare: data.cache_dir is a file", lambda d: _prep_with(d, "cache_dir", "a_file"),
     r"config\.data\.cache_dir: .*a_file exists and is not a directory"),
    ("prepare: data.cache_dir inside a file",
     lambda d: _prep_with(d, "cache_dir", "a_file", "cache"),
     r"config\.data\.cache_dir: .*a_file is a file, so .* cannot be a directory"),
    ("prepare: data.tokenizer is a directory", lambda d: _prep_with(d, "tokenizer", "a_dir"),
     r"config\.data\.tokenizer: '.*a_dir' is a directory, not a tokenizer file"),
    ("prepare: data.tokenizer without EOS", lambda d: _prep_with(d, "tokenizer", "no_eos.json"),
     r"config\.data\.tokenizer: .*no_eos\.json has no EOS token"),
]


def _snapshot(root: Path) -> dict[str, object]:
    snap: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel == "cache" or rel.startswith("cache/"):
            assert ".tmp-" not in p.name, rel  # the cache never keeps a half-built entry
            continue
        snap[rel] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) \
            if p.is_file() else "dir"
    return snap


def test_there_are_enough_cases_and_each_once():
    assert len(CASES) >= 19 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_data_input(case, disk):
    _, argv, pattern = case
    before = _snapshot(disk)
    env = {**os.environ, "DEPTHBENCH_CACHE": str(disk / "cache")}
    done = subprocess.run([sys.executable, "-m", "depthbench", *argv(disk)], cwd=disk, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    assert len(lines) == 1, f"stderr is {len(lines)} lines:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    prefix = "depthbench: error: "
    assert lines[0].startswith(prefix), lines[0]
    assert re.match(pattern, lines[0][len(prefix):]), lines[0]
    assert _snapshot(disk) == before
