"""depthbench import-olmo on the command line: a released step as the original
saved it (bf16 weights, optimizer state, tokenizer beside the steps) becomes a run,
and every damaged or unsupported input is one line, exit 2, nothing written.

The checkpoints are written by upstream OLMo-core (``ai2-olmo-core``, the
``test-olmo`` extra).  Unit tests: the CLI runs in-process.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the test-olmo extra")
pytest.importorskip("olmo_core", reason="needs the test-olmo extra (ai2-olmo-core)")

from olmo_reference import original  # noqa: E402
from olmo_reference.step_dir import randomize, save_step_dir  # noqa: E402

from depthbench import load_run  # noqa: E402
from depthbench.cli import main as cli_main  # noqa: E402

VOCAB = 61


def write_tokenizer(path):
    """A small real tokenizer.json (WordLevel over VOCAB tokens)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A pre_ln checkpoint as the original released it: bf16 weights, AdamW state,
    ``tokenizer/`` beside ``step5/``; and its fp32 reference model."""
    root = tmp_path_factory.mktemp("released")
    torch.manual_seed(0)
    model, config = original.build("pre_ln", 2, vocab=VOCAB)
    randomize(model, 0)
    model = model.to(torch.bfloat16)
    config["dtype"] = "bfloat16"
    save_step_dir(model, config, root / "repo", tokenizer=write_tokenizer(root / "tok.json"))
    return root / "repo", model.float()


def snapshot(root):
    """Every path under ``root`` with its size and digest (directories as such)."""
    return {str(p.relative_to(root)): ("dir" if p.is_dir() else
                                       (p.stat().st_size, hashlib.sha256(p.read_bytes())
                                        .hexdigest()))
            for p in sorted(root.rglob("*"))}


def test_bf16_release_with_optimizer_state_imports(tmp_path, released, capsys):
    repo, model = released
    out = tmp_path / "run"
    assert cli_main(["import-olmo", str(repo / "step5"), "--out", str(out), "--no-progress"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[0]
    assert "pre_ln" in line and "original block 'default', step 5" in line
    assert "tokenizer.json" in line
    saved = json.loads((out / "config.json").read_text())
    olmo = saved["resolved"]["olmo"]
    assert olmo["dtypes"] == ["bfloat16"] and olmo["step"] == 5 and olmo["departures"] == []
    assert saved["model"]["norm_eps"] == original.EPS and saved["model"]["param_dtype"] == "float32"
    assert (out / "checkpoints" / "0" / "params").is_dir()  # the optimizer state was not read
    assert not (out / "checkpoints" / "0" / "state").exists()
    run = load_run(out)
    x = np.random.default_rng(1).integers(0, VOCAB, size=(2, 11)).astype(np.int32)
    ref = original.logits(model, torch.as_tensor(x, dtype=torch.long)).numpy()
    ours = run.logits(x)
    assert np.max(np.abs(ours - ref)) <= 1e-4 * np.max(np.abs(ref))
    assert run.tokenizer.encode("w3 w5 w7") == [3, 5, 7]
    assert run.resolved["tokenizer"]["eos_id"] == 0 and run.resolved["tokenizer"]["pad_id"] == 1


def _edit_config(step, change):
    saved = json.loads((step / "config.json").read_text())
    change(saved["model"])
    (step / "config.json").write_text(json.dumps(saved))


def _each_distcp(step, fn):
    for path in (step / "model_and_optim").glob("*.distcp"):
        fn(path)


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path):
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def _mhc_static(m):
    m["block"]["name"] = "mhc"
    m["block"]["hyper_connections"] = {"kind": "mhc_static", "num_residual_streams": 4}


# (case, damage applied to a copy of the step directory, text the one line must contain)
BAD = [
    ("truncated_distcp", lambda s: _each_distcp(s, _truncate), "is truncated"),
    ("garbage_distcp", lambda s: _each_distcp(s, _garbage), "the checkpoint is damaged"),
    ("missing_distcp", lambda s: _each_distcp(s, lambda p: p.unlink()), "is missing"),
    ("truncated_metadata", lambda s: _truncate(s / "model_and_optim" / ".metadata"),
     ".metadata is damaged"),
    ("garbage_metadata", lambda s: _garbage(s / "model_and_optim" / ".metadata"),
     ".metadata is damaged"),
    ("missing_metadata", lambda s: (s / "model_and_optim" / ".metadata").unlink(),
     ".metadata does not exist"),
    ("missing_config", lambda s: (s / "config.json").unlink(), "config.json does not exist"),
    ("config_not_json", lambda s: (s / "config.json").write_text("{model: "), "is not JSON"),
    ("unknown_block", lambda s: _edit_config(s, lambda m: m["block"].update(name="normalized")),
     "'normalized' is not a design the original trained"),
    ("mhc_static", lambda s: _edit_config(s, _mhc_static), "'mhc_static' is not one of"),
    ("qk_norm", lambda s: _edit_config(s, lambda m: m["block"]["sequence_mixer"].update(
        qk_norm={"name": "rms"})), "qk_norm"),
    ("depth_mismatch", lambda s: _edit_config(s, lambda m: m.update(n_layers=3)),
     "model.n_layers is 3; the checkpoint holds 2 blocks"),
    ("width_mismatch", lambda s: _edit_config(s, lambda m: m.update(d_model=48)),
     "model.vocab_size x model.d_model is 61 x 48; the checkpoint's embeddings.weight is "
     "61 x 32"),
    ("a_depthbench_run", lambda s: _edit_config(s, lambda m: m.update(family="pre_ln")),
     "is a depthbench run directory (its config.json names model.family), not an OLMo-core "
     "checkpoint"),
]


def _assert_one_line(capsys, rc, needle):
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("depthbench: error: import-olmo"), err
    assert needle in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("case,damage,needle", BAD, ids=[c[0] for c in BAD])
def test_damaged_or_unsupported_step_is_one_line(tmp_path, released, capsys, case, damage,
                                                 needle):
    step = tmp_path / "repo" / "step5"
    shutil.copytree(released[0] / "step5", step)
    damage(step)
    before = snapshot(tmp_path)
    rc = cli_main(["import-olmo", str(step), "--out", str(tmp_path / "run"), "--no-progress"])
    _assert_one_line(capsys, rc, needle)
    assert snapshot(tmp_path) == before  # nothing written, nothing left behind


def test_bad_out_is_one_line_and_neither_torch_nor_olmo_core_is_needed(tmp_path, released,
                                                                        capsys, monkeypatch):
    step = str(released[0] / "step5")
    (tmp_path / "file.txt").write_text("mine")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    before = snapshot(tmp_path)
    for out, needle in ((tmp_path / "file.txt", "is a file"),
                        (tmp_path / "full", "exists and is not empty"),
                        (tmp_path / "file.txt" / "run", "is a file, not a directory")):
        rc = cli_main(["import-olmo", step, "--out", str(out), "--no-progress"])
        _assert_one_line(capsys, rc, needle)
    rc = cli_main(["import-olmo", str(tmp_path / "absent"), "--out", str(tmp_path / "r")])
    _assert_one_line(capsys, rc, "is not a local directory")
    assert snapshot(tmp_path) == before
    for name in ("torch", "olmo_core"):  # an install without them: importing either fails
        monkeypatch.setitem(sys.modules, name, None)
    assert cli_main(["import-olmo", step, "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert load_run(tmp_path / "r").spec.family == "pre_ln"


def test_val_tokens_is_recorded_and_a_bad_file_is_one_line(tmp_path, released, capsys):
    """--val-tokens names the run's validation split (what analyze reads); a file
    that is missing, not tokens, or holds ids past the vocabulary is one line."""
    step = str(released[0] / "step5")
    good = tmp_path / "val.npy"
    np.save(good, np.arange(40, dtype=np.uint16) % VOCAB)
    big = tmp_path / "big.npy"
    np.save(big, np.array([1, 2, VOCAB], np.uint16))
    text = tmp_path / "text.npy"
    text.write_text("not an array")
    before = snapshot(tmp_path)
    for path, needle in ((tmp_path / "absent.npy", "absent.npy does not exist"),
                         (big, f"token ids reach {VOCAB}, beyond the model's vocabulary"),
                         (text, "is not a valid .npy file")):
        rc = cli_main(["import-olmo", step, "--out", str(tmp_path / "run"), "--no-progress",
                       "--val-tokens", str(path)])
        _assert_one_line(capsys, rc, needle)
    assert snapshot(tmp_path) == before
    assert cli_main(["import-olmo", step, "--out", str(tmp_path / "run"), "--no-progress",
                     "--val-tokens", str(good)]) == 0
    assert "validation split: " in capsys.readouterr().out
    run = load_run(tmp_path / "run")
    assert run.resolved["tokenizer"]["val_tokens_path"] == str(good.resolve())
    assert run.resolved["tokenizer"]["val_tokens"] == 40
