"""import-hf: a local Hugging Face Llama checkpoint becomes a pre_ln run whose
logits equal transformers' own LlamaForCausalLM (fp32, relative 1e-4); a damaged
checkpoint, a bad --out or a missing safetensors package is one line, exit 2,
nothing written."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from depthbench.cli import main as cli_main
from depthbench.config import ConfigError
from depthbench.formats import hf as hf_import

torch = pytest.importorskip("torch", reason="torch not installed (pip install -e '.[test-hf]')")
transformers = pytest.importorskip(
    "transformers", reason="transformers not installed (pip install -e '.[test-hf]')")


def save_random_llama(path, *, seed=0, dtype=None, max_shard_size=None, **overrides):
    """A small random LlamaForCausalLM saved with save_pretrained (safetensors).
    Norm weights are perturbed too, so a mis-mapped norm cannot pass."""
    fields = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  rope_theta=5000.0, max_position_embeddings=64, initializer_range=0.1,
                  tie_word_embeddings=False)
    fields.update(overrides)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return model


def restored_logits(run_dir, tokens_bt):
    """Logits of the imported run through the public loader (as analyze and eval use it)."""
    from depthbench import load_run

    run = load_run(run_dir)
    assert run.step == 0 and run.spec.family == "pre_ln"
    return run.logits(tokens_bt)


def hf_logits(model, tokens_bt):
    with torch.no_grad():
        return model(torch.tensor(tokens_bt)).logits.float().numpy()


@pytest.mark.parametrize("overrides", [
    dict(num_key_value_heads=2, tie_word_embeddings=False),  # GQA, untied
    dict(num_key_value_heads=4, tie_word_embeddings=True, rope_theta=500000.0,
         rms_norm_eps=1e-6),  # MHA, tied, another theta/eps
    dict(num_key_value_heads=1, tie_word_embeddings=True),  # MQA, tied
    dict(num_key_value_heads=2, tie_word_embeddings=False, max_shard_size="40KB"),  # sharded
], ids=["gqa-untied", "mha-tied", "mqa-tied", "gqa-sharded"])
def test_logits_match_transformers(tmp_path, overrides):
    model = save_random_llama(tmp_path / "hf", **overrides)
    if "max_shard_size" in overrides:
        assert len(list((tmp_path / "hf").glob("*.safetensors"))) > 1
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert cli_main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    tokens = np.random.default_rng(1).integers(0, 97, size=(2, 19)).astype(np.int32)
    ours, ref = restored_logits(tmp_path / "run", tokens), hf_logits(model, tokens)
    assert ours.shape == ref.shape == (2, 19, 97)
    assert np.max(np.abs(ours - ref)) <= 1e-4 * np.max(np.abs(ref))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    m = saved["model"]
    assert (m["family"], m["n_kv_heads"], m["rope_theta"], m["norm_eps"]) == (
        "pre_ln", overrides["num_key_value_heads"], model.config.rope_parameters["rope_theta"]
        if hasattr(model.config, "rope_parameters") else model.config.rope_theta,
        model.config.rms_norm_eps)
    assert saved["resolved"]["hf"]["tie_word_embeddings"] == overrides["tie_word_embeddings"]


def test_an_imported_llama_decodes_with_the_cache_as_its_forward(tmp_path):
    """import-hf's run through generation.Decoder (prefill of 7 and 11 tokens, 6
    teacher-forced steps) gives its forward's logits within 1e-5 (issue 40)."""
    from decode_checks import decoded_run, relative

    from depthbench import load_run

    save_random_llama(tmp_path / "hf")  # GQA, untied
    assert cli_main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    tokens = np.random.default_rng(1).integers(0, 97, size=(2, 19)).astype(np.int32)
    got, want = decoded_run(load_run(tmp_path / "run"), tokens, np.array([7, 11]), 6)
    assert relative(got, want) < 1e-5 and float(np.std(want)) > 0.1


def test_bf16_checkpoint_reads_exactly_without_torch(tmp_path):
    model = save_random_llama(tmp_path / "hf", dtype=torch.bfloat16)
    tensors = hf_import.read_tensors(tmp_path / "hf")
    for name, p in model.state_dict().items():
        if name in tensors:
            np.testing.assert_array_equal(tensors[name], p.float().numpy())


def test_rope_scaling_is_one_clear_line(tmp_path, capsys):
    save_random_llama(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()  # transformers' own progress output while saving
    assert cli_main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rope_scaling" in err and "llama3" in err
    assert not (tmp_path / "run").exists()


def test_bad_inputs_refused(tmp_path):
    save_random_llama(tmp_path / "hf")
    with pytest.raises(ConfigError, match="not a local directory"):
        hf_import.import_hf("hf://meta-llama/Llama-3", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        hf_import.import_hf(tmp_path / "hf", tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, "attention_bias": True}))
    with pytest.raises(ConfigError, match="attention_bias"):
        hf_import.import_hf(tmp_path / "hf", tmp_path / "y")


def _snapshot(root):
    return {str(p.relative_to(root)): ("dir" if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path):
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


# (case, damage to a copy of the checkpoint directory, text the one line must contain)
HF_BAD = [
    ("truncated_safetensors", lambda d: _truncate(d / "model.safetensors"),
     "is not a readable safetensors file"),
    ("garbage_safetensors", lambda d: _garbage(d / "model.safetensors"),
     "is not a readable safetensors file"),
    ("empty_safetensors", lambda d: (d / "model.safetensors").write_bytes(b""),
     "is not a readable safetensors file"),
    ("header_only", lambda d: (d / "model.safetensors").write_bytes(
        (100).to_bytes(8, "little") + b"{"), "is not a readable safetensors file"),
    ("missing_config", lambda d: (d / "config.json").unlink(), "config.json does not exist"),
    ("config_not_json", lambda d: (d / "config.json").write_text("{"), "is not JSON ("),
    ("no_safetensors", lambda d: (d / "model.safetensors").unlink(), "holds no *.safetensors"),
]


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "llama"
    save_random_llama(path)
    return path


@pytest.mark.parametrize("case,damage,needle", HF_BAD, ids=[c[0] for c in HF_BAD])
def test_damaged_checkpoint_is_one_line(tmp_path, saved_llama, capsys, case, damage, needle):
    src = tmp_path / "hf"
    shutil.copytree(saved_llama, src)
    damage(src)
    before = _snapshot(tmp_path)
    capsys.readouterr()
    rc = cli_main(["import-hf", str(src), "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("depthbench: error: import-hf") and needle in err
    assert "Traceback" not in err and _snapshot(tmp_path) == before


def test_bad_out_and_missing_safetensors_are_one_line(tmp_path, saved_llama, capsys,
                                                      monkeypatch):
    (tmp_path / "file.txt").write_text("mine")
    before = _snapshot(tmp_path)
    cases = [(tmp_path / "file.txt", "is a file"),
             (tmp_path / "file.txt" / "run", "is a file, not a directory")]
    for out, needle in cases:
        rc = cli_main(["import-hf", str(saved_llama), "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an install without the eval extra
    rc = cli_main(["import-hf", str(saved_llama), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "pip install 'depthbench[eval]'" in err and "Traceback" not in err
    assert _snapshot(tmp_path) == before
