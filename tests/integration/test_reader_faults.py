"""Every reader of a run directory under a damaged checkpoint (integration).

Readers: ``depthbench analyze``, ``depthbench eval``, ``depthbench lm-eval``,
``depthbench report``, ``depthbench generate`` (each a real process, so that
what a user sees on stderr is what is checked; generate under two of the
damages: it opens runs as eval does; lm-eval with the eval extra's packages
alone, as a user of the backend installs it) and ``load_run`` (the notebook's
entry, in this process).  Damages: the latest checkpoint's state file overwritten in part,
its ``_METADATA`` truncated, its ``ocdbt.process_0/`` deleted, and every
checkpoint damaged.

A damaged latest checkpoint: the reader falls back to the newest intact one
with one warning line naming the skipped step, and does its job.  None
intact: one ``depthbench: error: checkpoints: none of ...`` line, exit 2
(the report, whose job does not need a checkpoint, says it in one warning
line, marks it in report.md and exits 0).  Always: no traceback, no absl or
Orbax line, and nothing in the run directory changed but the reader's own
output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from core_only import hide_extras
from eval_tiny import tiny_tokenizer, write_records
from fast_xla import subprocess_flags
from toy_corpus import write_progressions

from depthbench import config as config_lib
from depthbench.digest import file_sha256 as file_digest
from depthbench.run import load_run
from depthbench.rundir.restore import DamagedCheckpoints
from depthbench.train import loop

STEPS, EVERY = 4, 2  # checkpoints at steps 2 and 4
LATEST, INTACT = STEPS, STEPS - EVERY


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A trained run (two sealed checkpoints, a tokenizer.json), NLL records and
    an lm-eval task defined by local files."""
    root = tmp_path_factory.mktemp("readers")
    write_progressions(root / "shard.npy", 300)
    overrides = [
        "model.suite=", "model.d_model=16", "model.d_ff=32", "model.depth=2", "model.n_heads=2",
        "model.vocab_size=320", "model.remat_policy=none", "data.corpus=tokens",
        f"data.paths={root / 'shard.npy'}", "data.eos_id=0", "data.val_fraction=0.1",
        "data.val_windows=4", f"data.cache_dir={root / 'cache'}", f"train.steps={STEPS}",
        "train.batch_size=4", "train.seq_len=16", "train.log_every=1",
        f"train.eval_every={EVERY}", f"train.checkpoint_every={EVERY}",
        "train.layer_stats_every=0"]
    run = root / "run"
    result = loop.run(config_lib.load(config_lib.base_spec_path(), overrides), run,
                      progress=False)
    assert result["status"] == "finished"
    shutil.copy(tiny_tokenizer(root / "tok"), run / "tokenizer.json")
    tasks = root / "tasks"
    tasks.mkdir()
    records = [{"question": "What boils at 100 degrees?", "choices": ["water", "iron"],
                "label": 0}, {"question": "What is 5 - 2?", "choices": ["2", "3"], "label": 1}]
    (tasks / "tiny_mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tasks / "tiny_mc.yaml").write_text(
        "task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'tiny_mc.jsonl'}\ntest_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_target: "{{label}}"\ndoc_to_choice: "{{choices}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    return {"run": run, "records": write_records(root / "records"), "tasks": tasks,
            "root": root}


# ------------------------------------------------------------------ damages


def _state(run: Path, step: int) -> Path:
    return run / "checkpoints" / str(step) / "state"


def _overwrite_part(run: Path, step: int) -> None:
    """The largest file of the step's state: 64 bytes in its middle inverted (same size)."""
    files = [p for p in _state(run, step).rglob("*") if p.is_file()]
    path = max(files, key=lambda p: p.stat().st_size)
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(b ^ 0xFF for b in raw[mid:mid + 64])
    path.write_bytes(bytes(raw))


def _truncate_metadata(run: Path, step: int) -> None:
    path = _state(run, step) / "_METADATA"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _delete_ocdbt(run: Path, step: int) -> None:
    shutil.rmtree(_state(run, step) / "ocdbt.process_0")


def _every_checkpoint(run: Path) -> None:
    _overwrite_part(run, LATEST)
    _delete_ocdbt(run, INTACT)


DAMAGES = {
    "state file overwritten in part": lambda run: _overwrite_part(run, LATEST),
    "truncated _METADATA": lambda run: _truncate_metadata(run, LATEST),
    "deleted ocdbt.process_0/": lambda run: _delete_ocdbt(run, LATEST),
    "every checkpoint damaged": _every_checkpoint,
}


def _damaged_copy(made, tmp_path, damage: str) -> Path:
    run = tmp_path / "run"
    shutil.copytree(made["run"], run)
    DAMAGES[damage](run)
    return run


def _snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, str]]:
    """Every file (size, SHA-256), except those under the top-level names ``skip``."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, file_digest(p))
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in skip}


# ------------------------------------------------------------------ readers

# argv of each reader (RUN: the run directory) and what it writes into it.
READERS = {
    "analyze": (lambda m, run: ["analyze", str(run), "--windows", "2", "--seq-len", "16",
                                "--metrics", "angular_distance", "--no-plots"], ("analysis",)),
    "eval": (lambda m, run: ["eval", str(run), "--suite", "nll-code-stem-math", "--data-dir",
                             str(m["records"]), "--limit", "1", "--no-progress"], ("eval",)),
    "lm-eval": (lambda m, run: ["lm-eval", "--model", "depthbench", "--model_args",
                                f"run={run}", "--batch_size", "2", "--tasks", "tiny_mc",
                                "--include_path", str(m["tasks"])], ()),
    "report": (lambda m, run: ["report", str(run), "--no-plots"], ("report.md",)),
    "generate": (lambda m, run: ["generate", str(run), "--prompt", "The sky is",
                                 "--max-new-tokens", "4", "--no-progress"], ()),
}
# The damages each reader meets (default: all of them).
READER_DAMAGES = {"generate": ("state file overwritten in part", "every checkpoint damaged")}


def _depthbench(argv: list[str], home: Path, first_on_path: Path | None = None
                ) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": subprocess_flags(),
           "HF_HOME": str(home), "HF_DATASETS_OFFLINE": "1"}
    if first_on_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(first_on_path),
                                                           env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "depthbench", *argv], env=env,
                          capture_output=True, text=True, timeout=300)


def _cases():
    lm_eval_missing = pytest.mark.skipif(
        __import__("importlib.util").util.find_spec("lm_eval") is None,
        reason="lm-eval not installed (pip install -e '.[eval]')")
    for reader in READERS:
        for damage in READER_DAMAGES.get(reader, DAMAGES):
            marks = [pytest.mark.slow] + ([lm_eval_missing] if reader == "lm-eval" else [])
            yield pytest.param(reader, damage, id=f"{reader}-{damage}", marks=marks)


@pytest.fixture(scope="module")
def eval_extra_only(tmp_path_factory) -> Path:
    """A ``PYTHONPATH`` folder under which a process sees what ``pip install -e
    '.[eval]'`` installs and nothing more (tests/helpers/core_only.py): no torch,
    which lm-eval imports when it is there (to seed it and to describe it, 4 s of
    each command) and which the depthbench backend never needs."""
    folder = hide_extras(tmp_path_factory.mktemp("eval-extra-only"), keep=("eval",))
    probe = ("import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None "
             "or u.find_spec('lm_eval') is None)")
    env = {**os.environ, "PYTHONPATH": str(folder)}
    assert subprocess.run([sys.executable, "-c", probe], env=env).returncode == 0
    return folder


@pytest.mark.parametrize(("reader", "damage"), list(_cases()))
def test_reader_under_damage(made, tmp_path, reader, damage, request):
    run = _damaged_copy(made, tmp_path, damage)
    argv, outputs = READERS[reader]
    before = _snapshot(run)
    # lm-eval as a user of the backend has it: the eval extra alone.
    first = request.getfixturevalue("eval_extra_only") if reader == "lm-eval" else None
    proc = _depthbench(argv(made, run), tmp_path / "home", first)
    err = proc.stderr
    assert "Traceback" not in err and "absl" not in err and "orbax" not in err.lower(), err
    ours = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("depthbench")]
    ckpts = run / "checkpoints"
    if damage == "every checkpoint damaged" and reader != "report":
        assert proc.returncode == 2, err[-3000:]
        assert err.splitlines() == ours and len(ours) == 1, err  # one line, nothing else
        assert ours[0].startswith(f"depthbench: error: checkpoints: none of the 2 checkpoint(s) "
                                  f"in {ckpts} is intact (step {LATEST}: "), ours
        assert f"; step {INTACT}: " in ours[0]
        assert _snapshot(run) == before  # nothing written, nothing moved
        return
    assert proc.returncode == 0, err[-3000:]
    assert len(ours) == 1, err
    if damage == "every checkpoint damaged":  # the report
        assert ours[0].startswith(f"depthbench: warning: checkpoints: none of the 2 "
                                  f"checkpoint(s) in {ckpts} is intact (step {LATEST}: "), ours
        assert "none of the 2 checkpoint(s)" in (run / "report.md").read_text()
    else:
        assert ours[0].startswith(f"depthbench: warning: skipped damaged checkpoint(s) in "
                                  f"{ckpts} (step {LATEST}: "), ours
        assert f"step {INTACT}:" not in ours[0]
        assert ours[0].endswith(f"newest intact: step {INTACT}" if reader == "report"
                                else f"reading step {INTACT}"), ours
        # The warning comes before anything else the reader (or lm-eval) prints.
        assert err.lstrip().startswith(ours[0]), err[:2000]
    _check_output(reader, run, proc)
    assert _snapshot(run, skip=outputs) == before  # only the reader's own output added
    assert not (run / "checkpoints.damaged").exists()


def _check_output(reader: str, run: Path, proc: subprocess.CompletedProcess) -> None:
    """The reader did its job on the intact step."""
    if reader == "analyze":
        meta = json.loads((run / "analysis" / "analysis.json").read_text())["meta"]
        assert meta["step"] == INTACT
    elif reader == "eval":
        result = json.loads((run / "eval" / "nll-code-stem-math.json").read_text())
        assert result["step"] == INTACT and result["aggregate"]["num_target_tokens"] > 0
    elif reader == "lm-eval":
        assert "tiny_mc" in proc.stdout and "acc" in proc.stdout
    elif reader == "generate":
        assert proc.stdout.startswith("The sky is") and "time to first token" in proc.stdout
    else:
        assert "status            finished" in proc.stdout


# ------------------------------------------------- load_run, the notebook's entry


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_load_run_under_damage(made, tmp_path, damage, capfd):
    run = _damaged_copy(made, tmp_path, damage)
    before = _snapshot(run)
    capfd.readouterr()
    if damage == "every checkpoint damaged":
        with pytest.raises(DamagedCheckpoints) as e:
            load_run(run)
        assert str(e.value).startswith(f"checkpoints: none of the 2 checkpoint(s) in "
                                       f"{run / 'checkpoints'} is intact (step {LATEST}: ")
    else:
        loaded = load_run(run)
        assert loaded.step == INTACT
        err = capfd.readouterr().err
        assert err.startswith(f"depthbench: warning: skipped damaged checkpoint(s) in "
                              f"{run / 'checkpoints'} (step {LATEST}: ")
        assert err.endswith(f"reading step {INTACT}\n") and err.count("\n") == 1, err
        intact = load_run(made["run"], step=INTACT)  # the same parameters as the intact step
        assert all((a == b).all() for a, b in zip(
            jax_leaves(loaded.params), jax_leaves(intact.params), strict=True))
    assert _snapshot(run) == before


def jax_leaves(tree):
    import jax
    import numpy as np

    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_asking_for_a_damaged_step_names_it(made, tmp_path):
    run = _damaged_copy(made, tmp_path, "truncated _METADATA")
    with pytest.raises(DamagedCheckpoints, match=rf"^--step: checkpoint {LATEST} in .* is "
                       r"damaged \(state/_METADATA has \d+ bytes, not \d+\); omit --step"):
        load_run(run, step=LATEST)
    assert load_run(run, step=INTACT).step == INTACT
