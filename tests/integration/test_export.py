"""export-olmo and export-hf, through the commands, against references no one here wrote.

* export-olmo of a run whose design upstream OLMo-core has blocks for (pre_ln:
  ``default``, lns: ``default_scaled``, sandwich_ln: ``peri_norm``): upstream
  builds its model from the exported config.json (``TransformerConfig.from_dict``)
  and loads the checkpoint with its own loader (``load_model_and_optim_state``,
  which wants every key of its state dict), and its logits are the run's
  within 1e-4 relative; import-olmo of the export gives the run's logits bit
  for bit.  Likewise for mhc (Liger's form: a bf16 leaf), whose blocks upstream
  lacks: the import's logits.  (Every design's export is the original's own
  checkpoint again: tests/unit/test_export_olmo.py.)
* export-hf of a pre_ln run: transformers' ``LlamaForCausalLM`` loads it with
  logits within 1e-4, its tokenizer encodes as the run's does, and import-hf of
  it gives the run's parameters bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from analysis_tiny import tiny_config, tokens, write_run

torch = pytest.importorskip("torch", reason="needs the test-olmo extra")
# torch's loader, run without a process group, says it assumes one process: it is one
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

from depthbench import load_run  # noqa: E402
from depthbench.cli import main as cli_main  # noqa: E402


def relative(ours, ref) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _exported(tmp_path, family: str):
    """(source run, step directory) of a tiny run of ``family`` (weights off init)."""
    write_run(tmp_path / "run", tiny_config(family, 3), noise=0.3)
    step = tmp_path / "ckpt" / "step7"
    assert cli_main(["export-olmo", str(tmp_path / "run"), "--out", str(step),
                     "--no-progress"]) == 0
    return load_run(tmp_path / "run"), step


def _import_gives_the_same_logits(tmp_path, run, step) -> None:
    assert cli_main(["import-olmo", str(step), "--out", str(tmp_path / "back"),
                     "--no-progress"]) == 0
    back = load_run(tmp_path / "back")
    assert back.spec.family == run.spec.family and back.family.cfg == run.family.cfg
    x = tokens(2, 13)
    assert np.array_equal(back.logits(x), run.logits(x))


@pytest.mark.parametrize("family", ["pre_ln", "lns", "sandwich_ln"])
def test_upstream_olmo_core_loads_the_export(tmp_path, family):
    pytest.importorskip("olmo_core", reason="needs the test-olmo extra (ai2-olmo-core)")
    from olmo_core.distributed.checkpoint import load_model_and_optim_state
    from olmo_core.nn.transformer import TransformerConfig

    run, step = _exported(tmp_path, family)
    saved = json.loads((step / "config.json").read_text())
    model = TransformerConfig.from_dict(saved["model"]).build(init_device="cpu")
    load_model_and_optim_state(str(step / "model_and_optim"), model)
    x = tokens(2, 13)
    with torch.no_grad():
        ref = model(torch.as_tensor(x, dtype=torch.long)).float().numpy()
    assert relative(run.logits(x), ref) <= 1e-4
    _import_gives_the_same_logits(tmp_path, run, step)


def test_a_stream_family_with_a_bf16_leaf_round_trips(tmp_path):
    run, step = _exported(tmp_path, "mhc")
    assert str(run.params["blocks"]["residual"]["phi"].dtype) == "bfloat16"
    _import_gives_the_same_logits(tmp_path, run, step)


def test_export_hf_loads_in_transformers_and_imports_back(tmp_path):
    transformers = pytest.importorskip("transformers", reason="needs the test-hf extra")
    from eval_tiny import tiny_run

    source = tiny_run(tmp_path / "run")
    assert cli_main(["export-hf", str(source), "--out", str(tmp_path / "hf"),
                     "--no-progress"]) == 0
    run = load_run(source)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = tokens(2, 13, vocab=320)
    with torch.no_grad():
        ref = model(torch.as_tensor(x, dtype=torch.long)).logits.float().numpy()
    assert relative(run.logits(x), ref) <= 1e-4
    text = "The mitochondria is the powerhouse of the cell."
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok(text)["input_ids"] == run.tokenizer.encode(text)
    assert cli_main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back"),
                     "--no-progress"]) == 0
    back = load_run(tmp_path / "back")
    ours, theirs = (jax.tree.leaves(jax.device_get(r.params)) for r in (run, back))
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_a_full_disk_under_either_export_is_one_line_and_leaves_nothing(tmp_path, monkeypatch,
                                                                         capsys):
    """The one output rule's full disk (output_paths.built_aside): exit 4, one line
    naming --out, and neither --out nor the hidden folder it was built in is left."""
    import errno

    from depthbench.formats import hf
    from depthbench.formats.olmo import step_dir as olmo

    def full(path: Path):  # a file begun, then the disk is full
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    write_run(tmp_path / "run", tiny_config("pre_ln", 2))
    monkeypatch.setattr(hf, "_save_file", lambda: lambda tensors, path, **kw: full(Path(path)))
    monkeypatch.setattr(olmo, "write_model", lambda directory, *a: full(directory / "x.distcp"))
    for command in ("export-hf", "export-olmo"):
        capsys.readouterr()
        out = tmp_path / "exports" / command
        assert cli_main([command, str(tmp_path / "run"), "--out", str(out), "--no-progress"]) == 4
        err = capsys.readouterr().err.splitlines()
        assert err == [f"depthbench: error: {command}: could not write --out {out} (No space "
                       "left on device); nothing was written there: free space and re-run the "
                       "same command"]
        assert not out.exists() and list((tmp_path / "exports").iterdir()) == []
