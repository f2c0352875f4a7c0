"""Every reader of a run directory on every kind of run a user has (issue 47).

The runs: trained with the bundled specs a user starts from, their shape
fields left at 0 ("the suite's value": ``micro``, the quickstart's routing
families, ``micro_depth``'s shape rule), imported with ``import-hf`` (a
random Llama saved by transformers) and with ``import-olmo`` (the original's
own hc checkpoint), and fine-tuned.  On each, through the commands, in this
process: ``generate``, ``eval``, ``analyze``, ``finetune`` with it as the
parent, and the exports that apply (``export-hf`` for the baseline family;
``export-olmo`` for every design the original trained), each export read
back by its import to the same logits (``==``).  One test per kind, so
pytest-xdist spreads the kinds over its workers and each run is made once.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from eval_tiny import write_records
from original_outputs import step_dir
from paths import REPO

from depthbench import load_run
from depthbench.cli import main as cli_main
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.original_format import OriginalFormat
from depthbench.rundir.io import read_json

pytest.importorskip("torch", reason="export-olmo writes with torch: the test-olmo extra")
pytest.importorskip("transformers", reason="the import-hf source: the test-hf extra")
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")]

TINY = ["--config.train.steps=1", "--config.train.batch_size=2", "--config.train.seq_len=32",
        "--config.train.log_every=1", "--config.train.eval_every=1",
        "--config.train.checkpoint_every=1", "--config.train.layer_stats_every=0",
        "--config.data.val_windows=2", "--no-progress"]
RECORDS = [{"instruction": "Name the colour of the sky.", "input": "", "output": "blue"},
           {"instruction": "Add two and three.", "input": "", "output": "five"}]
# kind -> (spec, overrides): trained with the spec, shape fields as the spec leaves them.
TRAINED = {
    "micro": ("micro", ()),
    "quickstart-hc": ("quickstart", ("--config.model.family=hc", "--config.model.depth=2")),
    "quickstart-mhc": ("quickstart", ("--config.model.family=mhc", "--config.model.depth=2")),
    "quickstart-attnres_full": ("quickstart", ("--config.model.family=attnres_full",
                                               "--config.model.depth=2")),
    "micro_depth": (str(REPO / "experiments" / "micro_depth.py"), ("--config.model.depth=2",)),
}
KINDS = [*TRAINED, "import-hf", "import-olmo", "finetuned"]


def _ok(*argv: str) -> None:
    assert cli_main([*argv]) == 0, argv


def _train(root: Path, kind: str) -> Path:
    spec, overrides = TRAINED[kind]
    out = root / kind
    _ok("train", "--config", spec, "--workdir", str(out), *overrides, *TINY)
    saved = read_json(out / "config.json")["model"]
    assert saved["d_model"] == 0  # the shape left to the suite or the rule
    return out


def _finetune(parent: Path, out: Path, root: Path) -> Path:
    _ok("finetune", str(parent), "--records", str(root / "records.jsonl"), "--workdir", str(out),
        "--config.train.batch_size=2", "--config.train.seq_len=128",
        "--config.finetune.max_seq_len=129", "--config.finetune.val_fraction=0.5",
        "--config.finetune.epochs=1", "--config.model.compute_dtype=float32",
        f"--config.data.cache_dir={root / 'cache'}", "--no-progress")
    return out


def _word_tokenizer(directory: Path, vocab_size: int, eos_id: int) -> None:
    """A word-level tokenizer.json of ``vocab_size`` ids (``</s>`` at ``eos_id``): the
    original's tiny checkpoints carry none, and byte-level BPE needs 259 ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "the sky is blue name colour of add two and three say hello five".split()
    vocab = {"<unk>": 0, "<pad>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size) if i != eos_id})
    vocab["</s>"] = eos_id
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))


def _import_hf(root: Path) -> Path:
    import torch
    import transformers
    from eval_tiny import tiny_tokenizer

    hf = root / "hf-source"
    tiny_tokenizer(hf)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    transformers.LlamaForCausalLM(config).save_pretrained(hf)
    _ok("import-hf", str(hf), "--out", str(root / "import-hf"), "--no-progress")
    return root / "import-hf"


def _import_olmo(root: Path) -> Path:
    import shutil

    source = root / "olmo-source" / "step1"
    shutil.copytree(step_dir("hc"), source)
    saved = json.loads((source / "config.json").read_text())
    tok = saved["dataset"]["tokenizer"]
    _word_tokenizer(source / "tokenizer", tok["vocab_size"], tok["eos_token_id"])
    _ok("import-olmo", str(source), "--out", str(root / "import-olmo"), "--no-progress")
    return root / "import-olmo"


def _make(root: Path, kind: str) -> Path:
    if kind in TRAINED:
        return _train(root, kind)
    if kind == "import-hf":
        return _import_hf(root)
    if kind == "import-olmo":
        return _import_olmo(root)
    return _finetune(_train(root, "micro"), root / "finetuned", root)


def _val_tokens(root: Path, run: Path) -> list[str]:
    """``--val-tokens`` for a run that records no validation split (the imports)."""
    tokenizer = read_json(run / "config.json")["resolved"]["tokenizer"]
    if tokenizer["val_tokens_path"]:
        return []
    ids = np.arange(256) % min(int(tokenizer["vocab_size"]), 100)
    np.save(root / "val.npy", ids.astype(np.uint16))
    return ["--val-tokens", str(root / "val.npy")]


def _same_logits(a: Path, b: Path) -> None:
    ours, back = load_run(a), load_run(b)
    assert back.spec.shape == ours.spec.shape and back.family.cfg == ours.family.cfg
    x = (np.arange(26).reshape(2, 13) * 7) % ours.spec.vocab_size
    assert np.array_equal(back.logits(x), ours.logits(x))


@pytest.mark.parametrize("kind", KINDS)
def test_every_reader_opens_the_run(tmp_path, kind):
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    run = _make(tmp_path, kind)
    out = tmp_path / "completions.jsonl"
    _ok("generate", str(run), "--prompt", "the sky is", "--max-new-tokens", "3", "--out",
        str(out), "--no-progress")
    assert json.loads(out.read_text())["new_tokens"] >= 1

    _ok("eval", str(run), "--suite", "nll-code-stem-math", "--data-dir",
        str(write_records(tmp_path / "nll")), "--limit", "1", "--no-progress")
    evaluated = json.loads(next((run / "eval").glob("*.json")).read_text())
    assert evaluated["suite"] == "nll-code-stem-math"

    _ok("analyze", str(run), "--windows", "2", "--seq-len", "16", "--metrics",
        "angular_distance", "--no-plots", "--no-progress", *_val_tokens(tmp_path, run))
    analysis = read_json(run / "analysis" / "analysis.json")
    assert analysis["meta"]["depth"] == load_run(run).spec.depth

    child = _finetune(run, tmp_path / "child", tmp_path)
    assert np.isfinite(read_json(child / "result.json")["final_val_loss"])

    family = load_run(run).family
    if family.name == registry.baseline():
        _ok("export-hf", str(run), "--out", str(tmp_path / "hf"), "--no-progress")
        _ok("import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "hf-back"),
            "--no-progress")
        _same_logits(run, tmp_path / "hf-back")
    assert isinstance(family, OriginalFormat)  # every design here is one the original trained
    _ok("export-olmo", str(run), "--out", str(tmp_path / "olmo" / "step1"), "--no-progress")
    _ok("import-olmo", str(tmp_path / "olmo" / "step1"), "--out", str(tmp_path / "olmo-back"),
        "--no-progress")
    _same_logits(run, tmp_path / "olmo-back")
