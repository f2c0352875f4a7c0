"""Bad input, table-driven: every case exits 2 with exactly one line on
stderr that names the field or file and what is allowed, and changes nothing
already on disk.

Each case is ``(id, argv, pattern)``: ``argv`` is built from the files of a
scratch "disk" (specs, corpora, tokenizers, run directories; see
:func:`disk`), and the one stderr line must match ``pattern`` (a regex).  The
disk is snapshotted (every file's size and SHA-256, every directory) before
and after; only the data cache may gain files.  Cases run in-process through
``depthbench.cli.main`` (the console script is one call to it).
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import numpy as np
import pytest
from bad_input_commands import snapshot

from depthbench import config as config_lib
from depthbench.cli import main as cli_main
from depthbench.rundir.names import LOCK_FILE

BASE = str(config_lib.base_spec_path())


def _tiny(root: Path) -> list[str]:
    return [
        "--config.model.suite=",
        "--config.model.d_model=32",
        "--config.model.d_ff=64",
        "--config.model.depth=2",
        "--config.model.n_heads=2",
        "--config.model.vocab_size=64",
        "--config.model.remat_policy=none",
        "--config.data.corpus=tokens",
        f"--config.data.paths={root / 'shard.npy'}",
        "--config.data.eos_id=0",
        "--config.data.val_fraction=0.1",
        "--config.data.val_windows=4",
        f"--config.data.cache_dir={root / 'cache'}",
        "--config.train.steps=8",
        "--config.train.batch_size=4",
        "--config.train.seq_len=16",
        "--config.train.checkpoint_every=4",
        "--config.train.eval_every=4",
    ]


def _spec(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def _run_dir(root: Path, name: str, config: dict | None = None, **files: str) -> Path:
    run = root / name
    run.mkdir()
    if config is not None:
        (run / "config.json").write_text(json.dumps(config))
    for rel, text in files.items():
        path = run / rel.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return run


@pytest.fixture(scope="module")
def disk(tmp_path_factory) -> Path:
    """Inputs good and bad, and run directories in assorted states."""
    root = tmp_path_factory.mktemp("disk")
    rng = np.random.default_rng(0)
    ids = np.concatenate([np.append(rng.integers(1, 64, n), 0) for n in rng.integers(20, 80, 300)])
    np.save(root / "shard.npy", ids.astype(np.uint16))
    np.save(root / "big_ids.npy", (ids * 100).astype(np.uint16))  # ids >= vocab_size 64
    np.save(root / "floats.npy", ids.astype(np.float32))
    np.save(root / "empty.npy", np.zeros(0, np.uint16))
    (root / "garbage.npy").write_bytes(b"not a numpy file at all\n" * 10)
    (root / "docs.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    (root / "no_field.jsonl").write_text('{"body": "a document"}\n' * 20)
    (root / "junk.model").write_bytes(b"\x00\x01 not a sentencepiece model" * 50)
    (root / "a_file").write_text("I am a file, not a directory\n")
    _spec(root / "syntax.py", "def get_config(:\n")
    _spec(root / "no_get_config.py", "X = 1\n")
    _spec(root / "raises.py", "def get_config():\n    raise RuntimeError('boom')\n")
    _spec(root / "returns_dict.py", "def get_config():\n    return {'model': {}}\n")
    _spec(
        root / "no_sweep.py",
        "from depthbench.config import base_config\n\n"
        "def get_config():\n    return base_config()\n",
    )
    _spec(
        root / "bad_sweep.py",
        "from depthbench.config import base_config\n\n"
        "def get_config():\n    return base_config()\n\n"
        "def get_sweep():\n    return [{'model.nope': 1}]\n",
    )

    good = config_lib.load(BASE, _tiny(root)).to_dict()
    other = {**good, "train": {**good["train"], "lr": 0.5}}
    _run_dir(root, "run_other", other)
    _run_dir(root, "run_corrupt_config").joinpath("config.json").write_text("{not json")
    _run_dir(root, "run_no_config", None, checkpoints__4__junk="x")
    _run_dir(root, "run_bad_result", good, **{"result.json": "{truncated"})
    _run_dir(
        root,
        "run_damaged",
        good,
        checkpoints__4__state__junk="not orbax",
        checkpoints__8__state__junk="not orbax either",
    )
    _run_dir(
        root,
        "run_locked",
        good,
        **{LOCK_FILE: json.dumps({"host": socket.gethostname(), "pid": os.getppid()})},
    )  # a live process
    _run_dir(root, "not_a_sweep", None, **{"notes.txt": "hello"})
    (root / "loop").symlink_to(root / "loop")  # a link to itself
    return root


def _train(d: Path, *extra: str, workdir: str = "new_run") -> list[str]:
    return [
        "train",
        "--config",
        BASE,
        "--workdir",
        str(d / workdir),
        "--no-progress",
        *_tiny(d),
        *extra,
    ]


# (id, argv(disk), pattern of the one stderr line)
CASES = [
    # ---------------------------------------------------------------- CLI
    ("unknown command", lambda d: ["frobnicate"], r"invalid choice: 'frobnicate' \(choose from"),
    (
        "train without --workdir",
        lambda d: ["train", "--config", BASE],
        r"the following arguments are required: --workdir",
    ),
    ("unknown flag", lambda d: [*_train(d), "--fast"], r"unrecognized arguments: --fast"),
    (
        "overrides to report",
        lambda d: ["report", str(d), "--config.train.lr=1"],
        r"'report' takes no --config\.\* overrides",
    ),
    (
        "shapes: depth not a number",
        lambda d: ["shapes", "--suite", "micro", "--depths", "x"],
        r"--depths: expected comma-separated positive integers like 16,24,70, got 'x'",
    ),
    (
        "costs: seq-len not a number",
        lambda d: ["costs", "--suite", "micro", "--seq-len", "long"],
        r"--seq-len: expected a positive integer, got 'long'",
    ),
    (
        "costs: unknown family",
        lambda d: ["costs", "--suite", "micro", "--seq-len", "64", "--family", "resnet"],
        r"--family: 'resnet' is not one of pre_ln, .*, all$",
    ),
    (
        "shapes: unknown suite",
        lambda d: ["shapes", "--suite", "huge"],
        r"--suite: 'huge' is unknown; allowed: .*micro",
    ),
    (
        "sweep: shard out of range",
        lambda d: [
            "sweep",
            "--config",
            str(d / "bad_sweep.py"),
            "--workdir",
            str(d / "sw"),
            "--shard",
            "3/2",
        ],
        r"--shard: expected i/N with 0 <= i < N .*, got '3/2'",
    ),
    # -------------------------------------------------------------- specs
    (
        "spec file missing",
        lambda d: _train(d)[:2] + [str(d / "nope.py")] + _train(d)[3:],
        r"spec file '.*nope\.py' does not exist",
    ),
    (
        "spec syntax error",
        lambda d: ["train", "--config", str(d / "syntax.py"), "--workdir", str(d / "new_run")],
        r"syntax\.py.*failed to load",
    ),
    (
        "spec without get_config",
        lambda d: [
            "train",
            "--config",
            str(d / "no_get_config.py"),
            "--workdir",
            str(d / "new_run"),
        ],
        r"no_get_config\.py.* has no get_config\(\)",
    ),
    (
        "spec get_config raises",
        lambda d: ["train", "--config", str(d / "raises.py"), "--workdir", str(d / "new_run")],
        r"config: get_config\(\) in '.*raises\.py' failed: RuntimeError: boom",
    ),
    (
        "spec returns a dict",
        lambda d: [
            "train",
            "--config",
            str(d / "returns_dict.py"),
            "--workdir",
            str(d / "new_run"),
        ],
        r"returns_dict\.py.* must return a ConfigDict",
    ),
    (
        "sweep spec without get_sweep",
        lambda d: ["sweep", "--config", str(d / "no_sweep.py"), "--workdir", str(d / "sw")],
        r"no_sweep\.py' has no get_sweep\(\)",
    ),
    (
        "sweep spec with an unknown field",
        lambda d: ["sweep", "--config", str(d / "bad_sweep.py"), "--workdir", str(d / "sw")],
        r"sweep run 0 .*--config\.model\.nope: unknown field; known fields here: ",
    ),
    # ---------------------------------------------------------- overrides
    (
        "unknown field",
        lambda d: _train(d, "--config.model.widht=3"),
        r"--config\.model\.widht: unknown field; known fields here: .*depth",
    ),
    (
        "unknown section",
        lambda d: _train(d, "--config.optim.lr=3"),
        r"--config\.optim\.lr: unknown section 'optim'; known: .*data, .*model",
    ),
    (
        "section as a field",
        lambda d: _train(d, "--config.model=3"),
        r"--config\.model: is a section, not a field",
    ),
    (
        "override without a value",
        lambda d: _train(d, "--config.train.lr"),
        r"--config\.train\.lr.*expected --config\.section\.field=value",
    ),
    (
        "unknown family",
        lambda d: _train(d, "--config.model.family=resnet"),
        r"config\.model\.family: 'resnet' is not one of .*pre_ln",
    ),
    (
        "integer field given text",
        lambda d: _train(d, "--config.train.steps=ten"),
        r"--config\.train\.steps: expected an integer, got 'ten'",
    ),
    (
        "integer field given a fraction",
        lambda d: _train(d, "--config.train.steps=2.5"),
        r"--config\.train\.steps: expected an integer, got '2\.5'",
    ),
    (
        "boolean field",
        lambda d: _train(d, "--config.model.residual.hc_tanh=maybe", "--config.model.family=hc"),
        r"--config\.model\.residual\.hc_tanh: expected true or false, got 'maybe'",
    ),
    (
        "another family's field",
        lambda d: _train(d, "--config.model.residual.hc_n=8"),
        r"config\.model\.residual\.hc_n: pre_ln has no field hc_n; its fields: \(none\)",
    ),
    (
        "negative learning rate",
        lambda d: _train(d, "--config.train.lr=-1"),
        r"config\.train\.lr: must be a number",
    ),
    (
        "learning rate NaN",
        lambda d: _train(d, "--config.train.lr=nan"),
        r"config\.train\.lr: must be a number",
    ),
    (
        "zero depth",
        lambda d: _train(d, "--config.model.depth=0"),
        r"config\.model\.depth: must be a number > 0, got 0",
    ),
    (
        "heads do not divide the width",
        lambda d: _train(d, "--config.model.n_heads=3"),
        r"config\.model\.n_heads: 3 heads do not divide d_model 32",
    ),
    (
        "batch not divisible by microbatches",
        lambda d: _train(d, "--config.train.microbatches=3"),
        r"config\.train\.microbatches: 3 must divide train\.batch_size 4",
    ),
    (
        "unknown compute dtype",
        lambda d: _train(d, "--config.model.compute_dtype=float8"),
        r"config\.model\.compute_dtype: 'float8' is not one of .*bfloat16",
    ),
    (
        "unknown remat policy",
        lambda d: _train(d, "--config.model.remat_policy=sometimes"),
        r"config\.model\.remat_policy: 'sometimes' is not one of",
    ),
    (
        "warmup fraction above 1",
        lambda d: _train(d, "--config.train.warmup_fraction=1.5"),
        r"config\.train\.warmup_fraction: must be in \[0, 1\)",
    ),
    # --------------------------------------------------------------- data
    (
        "unknown corpus",
        lambda d: _train(d, "--config.data.corpus=wikipedia"),
        r"config\.data\.corpus: 'wikipedia' is not one of",
    ),
    (
        "text corpus without paths",
        lambda d: _train(d, "--config.data.corpus=text", "--config.data.paths="),
        r"config\.data\.paths: empty; give comma-separated files or globs",
    ),
    (
        "paths match nothing",
        lambda d: _train(d, f"--config.data.paths={d / 'none_*.npy'}"),
        r"config\.data\.paths: '.*none_\*\.npy' matches no file",
    ),
    (
        "tokens file is not .npy",
        lambda d: _train(d, f"--config.data.paths={d / 'garbage.npy'}"),
        r"config\.data\.paths: .*garbage\.npy is not a valid \.npy file",
    ),
    (
        "tokens of floats",
        lambda d: _train(d, f"--config.data.paths={d / 'floats.npy'}"),
        r"config\.data\.paths: .*floats\.npy holds float32, not integer token ids",
    ),
    (
        "token ids beyond the vocabulary",
        lambda d: _train(d, f"--config.data.paths={d / 'big_ids.npy'}"),
        r"config\.data\.paths: the shards hold token id 6300, not below model\.vocab_size 64",
    ),
    (
        "empty tokens file",
        lambda d: _train(d, f"--config.data.paths={d / 'empty.npy'}"),
        r"config\.data\.paths: the 1 shard\(s\) hold no tokens",
    ),
    (
        "unknown tokens dtype",
        lambda d: _train(d, "--config.data.tokens_dtype=int8"),
        r"config\.data\.tokens_dtype: 'int8' is not one of",
    ),
    (
        "jsonl with a broken line",
        lambda d: _train(
            d,
            "--config.data.corpus=jsonl",
            f"--config.data.paths={d / 'docs.jsonl'}",
            "--config.model.vocab_size=512",
        ),
        r"config\.data\.paths: .*docs\.jsonl:2 is not JSON",
    ),
    (
        "jsonl without the text field",
        lambda d: _train(
            d,
            "--config.data.corpus=jsonl",
            f"--config.data.paths={d / 'no_field.jsonl'}",
            "--config.model.vocab_size=512",
        ),
        r"config\.data\.text_field: .*no_field\.jsonl:1 has no field 'text'",
    ),
    (
        "vocabulary too small for a trained tokenizer",
        lambda d: _train(
            d, "--config.data.corpus=jsonl", f"--config.data.paths={d / 'no_field.jsonl'}"
        ),
        r"config\.model\.vocab_size: 64 .*more than 260",
    ),
    (
        "eos id beyond the vocabulary",
        lambda d: _train(d, "--config.data.eos_id=64"),
        r"config\.data\.eos_id: 64 is not below model\.vocab_size 64",
    ),
    # --------------------------------------------------------- tokenizers
    (
        "tokenizer file missing",
        lambda d: _train(
            d,
            "--config.data.corpus=jsonl",
            f"--config.data.paths={d / 'docs.jsonl'}",
            f"--config.data.tokenizer={d / 'missing.model'}",
        ),
        r"config\.data\.tokenizer: file '.*missing\.model' does not exist",
    ),
    (
        "tokenizer file is not a model",
        lambda d: _train(
            d,
            "--config.data.corpus=text",
            f"--config.data.paths={d / 'a_file'}",
            f"--config.data.tokenizer={d / 'junk.model'}",
        ),
        r"config\.data\.tokenizer: .*junk\.model is not a SentencePiece model",
    ),
    # -------------------------------------------------------- checkpoints
    (
        "no checkpoint is intact",
        lambda d: _train(d, workdir="run_damaged"),
        r"checkpoints: none of the 2 checkpoint\(s\) in .*run_damaged/checkpoints is intact",
    ),
    (
        "checkpoints without config.json",
        lambda d: _train(d, workdir="run_no_config"),
        r"--workdir: .*run_no_config' holds a run without config\.json",
    ),
    # ----------------------------------------------------- run directories
    (
        "workdir is a file",
        lambda d: _train(d, workdir="a_file"),
        r"--workdir: .*a_file' exists and is not a directory",
    ),
    (
        "workdir holds another config",
        lambda d: _train(d, workdir="run_other"),
        r"config\.train\.lr: .*run_other' holds a run with train\.lr=0\.5",
    ),
    (
        "workdir config.json corrupt",
        lambda d: _train(d, workdir="run_corrupt_config"),
        r"--workdir: .*run_corrupt_config/config\.json is unreadable",
    ),
    (
        "workdir result.json corrupt",
        lambda d: _train(d, workdir="run_bad_result"),
        r"--workdir: .*run_bad_result/result\.json is unreadable .*; delete it to finish",
    ),
    (
        "workdir locked by a live process",
        lambda d: _train(d, workdir="run_locked"),
        r"--workdir: .*run_locked' is being trained by process",
    ),
    (
        "workdir is a link loop",
        lambda d: _train(d, workdir="loop"),
        r"--workdir: '\S+/loop' is a symbolic-link loop; give a path whose links end somewhere",
    ),
    (
        "a W&B mode that is none",
        lambda d: _train(d, "--config.train.wandb=cloud"),
        r"config\.train\.wandb: 'cloud' is not one of '', 'offline', 'online'$",
    ),
    (
        "workdir is a URL",
        lambda d: [*_train(d)[:4], "gs://bucket/run", *_train(d)[5:]],
        r"--workdir: 'gs://bucket/run' is a URL",
    ),
    (
        "report on a directory that is not a sweep",
        lambda d: ["report", str(d / "not_a_sweep")],
        r"report: '.*not_a_sweep' holds neither a sweep \(results\.csv\) nor a run",
    ),
    (
        "report on a missing directory",
        lambda d: ["report", str(d / "missing_dir")],
        r"report: directory '.*missing_dir' does not exist",
    ),
]


def test_there_are_at_least_30_cases():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


# What only the run itself finds: it needs the whole corpus read (every token id) or
# a checkpoint restored (one without an integrity record, whose files Orbax cannot read).
FOUND_BY_THE_RUN_ONLY = {"token ids beyond the vocabulary", "no checkpoint is intact"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, disk, capsys):
    _check(case, disk, capsys)


@pytest.mark.parametrize("case", [c for c in CASES if c[1](Path("d"))[0] == "train"
                                  and c[0] not in FOUND_BY_THE_RUN_ONLY], ids=lambda c: c[0])
def test_a_dry_run_refuses_what_the_run_refuses(case, disk, capsys):
    """``train --dry-run`` runs the run's own checks (train/preflight.py, the data's
    check_inputs, the lock): every train case above gives the same line."""
    name, argv, pattern = case
    _check((name, lambda d: [*argv(d), "--dry-run"], pattern), disk, capsys)


def _check(case, disk, capsys):
    _, argv, pattern = case
    before = snapshot(disk)
    capsys.readouterr()
    try:
        code = cli_main(argv(disk))
    except SystemExit as e:  # argparse errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}\nstdout: {out[-2000:]}\nstderr: {err[-3000:]}"
    lines = err.splitlines()
    assert len(lines) == 1, f"stderr is {len(lines)} lines:\n{err[-3000:]}"
    assert lines[0].startswith("depthbench"), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert snapshot(disk) == before
