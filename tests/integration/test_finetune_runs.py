"""``depthbench finetune`` end to end, in-process: a tiny model memorises two
records, a resumed fine-tuning is bitwise the uninterrupted one, every reader
opens the result, a damaged latest parent checkpoint falls back, an import-hf
run fine-tunes as a trained one does, and packed rows start where padded ones
do (the loss and gradient of packed and padded rows: tests/unit/test_finetune.py).

(The pieces' known answers, the masked loss's among them: tests/unit/test_finetune.py;
bad input: tests/helpers/bad_input_commands.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from eval_tiny import tiny_run

from depthbench.cli import main as cli_main
from depthbench.finetune.records import open_sft
from depthbench.run import load_run
from depthbench.rundir.io import read_jsonl
from depthbench.rundir.restore import read_params

# Three records: two to train on, one held out (val_fraction 0.34 of 3).
RECORDS = [{"instruction": "Name the colour of the sky.", "input": "", "output": "blue"},
           {"instruction": "Add two and three.", "input": "", "output": "five"},
           {"instruction": "Say hello.", "input": "", "output": "hello there"}]
STEPS = 40
RECIPE = ["--config.train.batch_size=2", "--config.train.seq_len=128",
          "--config.finetune.max_seq_len=129", "--config.finetune.val_fraction=0.34",
          f"--config.finetune.epochs={STEPS}", "--config.train.lr=1e-2",
          "--config.model.compute_dtype=float32", "--config.train.checkpoint_every=10",
          "--no-progress"]


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    tiny_run(root / "parent")
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return root


def _finetune(disk: Path, parent: Path, out: Path, *extra: str) -> int:
    return cli_main(["finetune", str(parent), "--records", str(disk / "records.jsonl"),
                     "--workdir", str(out), *RECIPE, f"--config.data.cache_dir={disk / 'cache'}",
                     *extra])


@pytest.fixture(scope="module")
def finetuned(disk):
    out = disk / "sft"
    assert _finetune(disk, disk / "parent", out) == 0
    return out


def _losses(run_dir: Path) -> list[tuple]:
    return [(r["step"], r.get("loss"), r.get("grad_norm"), r.get("lr"), r.get("val_loss"))
            for r in read_jsonl(run_dir / "metrics.jsonl")]


def test_a_tiny_model_memorises_two_records(finetuned):
    result = json.loads((finetuned / "result.json").read_text())
    assert result["status"] == "finished" and result["steps"] == STEPS
    assert result["final_train_loss"] < 0.02
    run = load_run(finetuned)  # the reader every command uses
    config = json.loads((finetuned / "config.json").read_text())
    data = open_sft(config["resolved"]["finetune"]["data"])
    assert config["finetune"]["data_digest"] == data.digest == result["finetune"]["data_digest"]
    assert config["finetune"]["parent"] == str((finetuned.parent / "parent").resolve())
    for ids, mask in data.records("train"):
        logits = run.logits(ids[None, :-1].astype(np.int32))[0]
        supervised = mask[1:]
        # every response token and the EOS is the model's first choice
        assert np.array_equal(logits.argmax(-1)[supervised], ids[1:][supervised])
    assert run.tokenizer.decode(data.records("train")[0][0][-3:-1].tolist())  # its own tokenizer
    # the held-out loss before (the parent's, at step 0) and after
    rows = read_jsonl(finetuned / "metrics.jsonl")
    assert rows[0] == {"step": 0, "val_loss": result["finetune"]["initial_val_loss"]}
    assert result["finetune"]["parent_step"] == 7 and np.isfinite(result["final_val_loss"])


def test_a_resumed_finetuning_is_bitwise_the_uninterrupted_one(finetuned, tmp_path, capsys):
    again = tmp_path / "again"
    shutil.copytree(finetuned, again)
    (again / "result.json").unlink()
    shutil.rmtree(again / "checkpoints" / str(STEPS))  # back to step 30's checkpoint
    capsys.readouterr()
    assert _finetune(finetuned.parent, finetuned.parent / "parent", again) == 0
    assert "resuming" in capsys.readouterr().err
    assert _losses(again) == _losses(finetuned)
    like = load_run(finetuned).abstract_params
    a, _ = read_params(finetuned, like)
    b, step = read_params(again, like)
    assert step == STEPS
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(jax.device_get(a)),
                                                    jax.tree.leaves(jax.device_get(b)),
                                                    strict=True))
    # finished: the same command returns what is recorded
    assert _finetune(finetuned.parent, finetuned.parent / "parent", again) == 0
    assert "already holds this fine-tuning" in capsys.readouterr().out


def test_train_steps_given_cuts_the_run_short(finetuned, tmp_path, capsys, monkeypatch):
    """train.steps follows from the records, and a given one caps it, so that
    DEPTHBENCH_OVERRIDES='train.steps=3' makes a fine-tuning a smoke test (README)
    from the same start; one past the plan changes nothing."""
    monkeypatch.setenv("DEPTHBENCH_OVERRIDES", "train.steps=3")
    assert _finetune(finetuned.parent, finetuned.parent / "parent", tmp_path / "smoke") == 0
    result = json.loads((tmp_path / "smoke" / "result.json").read_text())
    assert result["steps"] == 3 and json.loads(
        (tmp_path / "smoke" / "config.json").read_text())["train"]["steps"] == 3
    # the parent's held-out loss at step 0, as the full run's
    assert read_jsonl(tmp_path / "smoke" / "metrics.jsonl")[0] == read_jsonl(
        finetuned / "metrics.jsonl")[0]
    monkeypatch.setenv("DEPTHBENCH_OVERRIDES", f"train.steps={10 * STEPS}")
    assert _finetune(finetuned.parent, finetuned.parent / "parent", tmp_path / "long",
                     "--config.finetune.epochs=1") == 0
    assert json.loads((tmp_path / "long" / "result.json").read_text())["steps"] == 1


def test_a_damaged_latest_parent_checkpoint_falls_back(disk, tmp_path, capsys):
    parent = tmp_path / "parent"
    shutil.copytree(disk / "parent", parent)
    newer = parent / "checkpoints" / "9"
    shutil.copytree(parent / "checkpoints" / "7", newer)
    victim = max((p for p in newer.rglob("*") if p.is_file() and p.name != "integrity.json"),
                 key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[::-1])  # same size, other bytes
    capsys.readouterr()
    assert _finetune(disk, parent, tmp_path / "sft", "--config.finetune.epochs=2") == 0
    err = capsys.readouterr().err
    assert err.count("skipped damaged checkpoint(s)") == 1 and "step 9" in err  # said once
    result = json.loads((tmp_path / "sft" / "result.json").read_text())
    assert result["finetune"]["parent_step"] == 7


def test_an_import_hf_run_fine_tunes(disk, tmp_path):
    import torch
    import transformers
    from eval_tiny import tiny_tokenizer

    hf_dir = tmp_path / "hf"
    tok = tiny_tokenizer(hf_dir)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok), bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(hf_dir)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id)
    transformers.LlamaForCausalLM(config).save_pretrained(hf_dir)
    assert cli_main(["import-hf", str(hf_dir), "--out", str(tmp_path / "run")]) == 0
    out = tmp_path / "sft"
    assert _finetune(disk, tmp_path / "run", out, "--config.finetune.epochs=3") == 0
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 3 and result["finetune"]["parent_step"] == 0
    assert result["final_val_loss"] < result["finetune"]["initial_val_loss"]
    assert (out / "tokenizer.json").read_bytes() == (tmp_path / "run" / "tokenizer.json"
                                                     ).read_bytes()
    assert load_run(out).step == 3


def test_packed_rows_start_where_padded_ones_do(disk, finetuned, tmp_path):
    out = tmp_path / "packed"
    assert _finetune(disk, disk / "parent", out, "--config.finetune.layout=packed",
                     "--config.train.seq_len=256", "--config.finetune.epochs=4") == 0
    result = json.loads((out / "result.json").read_text())
    padded = json.loads((finetuned / "result.json").read_text())
    assert result["steps"] == 2  # 4 epochs of two records, two records a row, two rows a batch
    # the held-out record scored alone in a row of 128 or in a packed row of 256
    assert result["finetune"]["initial_val_loss"] == pytest.approx(
        padded["finetune"]["initial_val_loss"], rel=1e-5)
    assert np.isfinite(result["final_train_loss"]) and np.isfinite(result["final_val_loss"])
