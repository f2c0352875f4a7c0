"""docs/REPRODUCE.md runs as written on a small checkpoint written by upstream OLMo-core.

The page's downloads are the only commands it cannot run here: in their place
this test writes, at the page's paths, a released-model look-alike (a Pre-LN
checkpoint saved by OLMo-core's own writer after an AdamW step, ``step7600/``
and ``tokenizer/`` beside it) and a FineWeb-Edu-shaped parquet shard.  Then
every other command block of the page runs in that directory, in order, as
written, except for the window counts and lengths (``SMALL``: the page's are
sized for a 400M model; each substitution must apply).  The page's python
block is written to the file it names, as a reader would.

Integration test (subprocesses); needs the ``test-olmo`` extra.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the test-olmo extra")
pytest.importorskip("olmo_core", reason="needs the test-olmo extra (ai2-olmo-core)")
pytest.importorskip("pyarrow", reason="writes the parquet shard")

from eval_tiny import write_records  # noqa: E402
from olmo_reference import original  # noqa: E402
from olmo_reference.step_dir import randomize, save_step_dir  # noqa: E402
from paths import REPO  # noqa: E402
from readme_blocks import parse  # noqa: E402

PAGE = REPO / "docs" / "REPRODUCE.md"
VOCAB = 50280  # the original's: the EOS id 50279 is a token of the vocabulary
WORDS = 200
EOS = "|||IP_ADDRESS|||"  # any name: the page reads the name of id 50279 from the tokenizer
DOWNLOAD = "downloads from the hub"
INSTALL = "installs into your environment"
# The page's sizes are for a 400M model; the tiny one takes these (each must apply).
SMALL = {"val_loss.py runs/preln-L32 256 2048": "val_loss.py runs/preln-L32 4 16",
         "--windows 128 --seq-len 512": "--windows 4 --seq-len 16"}


def _tokenizer(path: Path) -> Path:
    """A WordLevel tokenizer.json: ``w0 .. w{WORDS-1}``, ``<unk>``, and the EOS
    at id 50279 as the original's vocabulary has it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {f"w{i}": i for i in range(WORDS)} | {"<unk>": WORDS, EOS: VOCAB - 1}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    assert Tokenizer.from_file(str(path)).id_to_token(VOCAB - 1) == EOS
    return path


def _released(root: Path, tmp: Path) -> None:
    """``ckpt/preln-400M-L32/{step7600,tokenizer}`` as the hub repository holds them."""
    torch.manual_seed(0)
    model, config = original.build("pre_ln", 2, vocab=VOCAB)
    randomize(model, 0)
    save_step_dir(model, config, root / "ckpt" / "preln-400M-L32", step=7600, seq_len=64,
                  tokenizer=_tokenizer(tmp / "tokenizer.json"))


def _shard(path: Path) -> None:
    """A FineWeb-Edu-shaped parquet file: a ``text`` column of documents."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    docs = [" ".join(f"w{i}" for i in rng.integers(0, WORDS, int(rng.integers(20, 60))))
            for _ in range(40)]
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"text": docs, "id": [str(i) for i in range(len(docs))]}), path)


def _env(root: Path) -> dict[str, str]:
    """PATH with this interpreter first, and ``depthbench`` on it (the console
    script of an installed depthbench; a shim where this venv has none)."""
    bin_dir = Path(sys.executable).parent
    path = [str(bin_dir)]
    if not (bin_dir / "depthbench").exists():
        shim = root / ".bin" / "depthbench"
        shim.parent.mkdir()
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m depthbench \"$@\"\n")
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
        path.insert(0, str(shim.parent))
    return {**os.environ, "PATH": os.pathsep.join([*path, os.environ["PATH"]]),
            "JAX_PLATFORMS": "cpu"}


def test_every_command_of_the_page_runs(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    blocks = parse(PAGE, REPO)
    downloads = [b for b in blocks if b.skip and DOWNLOAD in b.skip]
    assert len(downloads) == 1 and len(downloads[0].commands()) == 2
    _released(root, tmp_path)
    _shard(root / "data" / "fineweb-edu" / "sample" / "100BT" / "013_00008.parquet")
    write_records(root / "data" / "nll")
    env = _env(root)
    used: set[str] = set()
    ran = []
    for block in blocks:
        if block.file:  # the page's python file, written where the reader writes it
            (root / block.file).write_text(block.body + "\n")
            continue
        if not block.commands() or (block.skip and (DOWNLOAD in block.skip
                                                    or INSTALL in block.skip)):
            continue
        assert block.skip and "tests/integration/test_olmo_reproduce.py" in block.skip, block.where
        for command in block.commands():
            text = command.text
            for big, small in SMALL.items():
                if big in text:
                    text, _ = text.replace(big, small), used.add(big)
            r = subprocess.run(["bash", "-c", text], cwd=root, env=env, capture_output=True,
                               text=True, timeout=900)
            assert r.returncode == command.expect_status, (
                f"{block.where}: `{text}` exited {r.returncode}\n{r.stdout[-3000:]}\n"
                f"{r.stderr[-3000:]}")
            ran.append((text, r.stdout))
    assert used == set(SMALL), f"stale substitutions: {set(SMALL) - used}"
    assert [t.split()[:2] for t, _ in ran] == [
        ["depthbench", "data"], ["depthbench", "import-olmo"], ["python", "val_loss.py"],
        ["depthbench", "analyze"], ["depthbench", "eval"]]

    # What the commands left: the held-out shard with the original's EOS id, the
    # run recording it, a loss near the reference model's, the analyses, the eval.
    manifest = json.loads((root / "data" / "fineweb-edu-eval" / "manifest.json").read_text())
    assert manifest["eos_id"] == VOCAB - 1
    saved = json.loads((root / "runs" / "preln-L32" / "config.json").read_text())
    assert saved["model"]["family"] == "pre_ln"
    assert saved["resolved"]["olmo"]["step"] == 7600
    assert saved["resolved"]["tokenizer"]["val_tokens_path"].endswith("train_00000.npy")
    assert "pre_ln L2: validation loss" in ran[2][1] and "published" in ran[2][1]
    analysis = json.loads((root / "runs" / "preln-L32" / "analysis" / "analysis.json")
                          .read_text())
    assert 0.0 <= analysis["late_layer_interaction"]["skip_fraction"] <= 1.0
    assert (root / "runs" / "preln-L32" / "eval" / "nll-code-stem-math.json").is_file()
    shutil.rmtree(root / "runs")
