"""One special-token policy for every consumer of a tokenizer (integration: runs data
tokenize's worker pool and the data command line).

The tokenizer.json here has a post-processor that prepends BOS, as a Llama
tokenizer's does, so the library's default ``encode`` adds a token that
depthbench's never adds.  ``data tokenize``, ``data prepare``, ``data show``,
a run's tokenizer (eval, analyses) and the lm-eval backend must all give the
text's own ids: documents followed by EOS, BOS only where scoring asks for it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from eval_tiny import CORPUS, tiny_run

from depthbench import config as config_lib
from depthbench import data
from depthbench.cli import main
from depthbench.data import split, token_cache
from depthbench.data import tokenize as tokenize_lib
from depthbench.data.tokenizer import open_tokenizer

DOCS = [f"{text} (copy {i})" for i, text in enumerate(CORPUS * 6)]
FRACTION = 0.2


def _bos_tokenizer(directory: Path) -> Path:
    """A byte-level BPE tokenizer.json whose post-processor adds BOS ``<s>``; EOS ``</s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return directory / "tokenizer.json"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(tokenizer.json, jsonl corpus, the library, BOS id, EOS id, each document's own ids)."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("policy")
    path = _bos_tokenizer(root / "tok")
    corpus = root / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    lib = Tokenizer.from_file(str(path))
    bos, eos = lib.token_to_id("<s>"), lib.token_to_id("</s>")
    own = [lib.encode(d, add_special_tokens=False).ids for d in DOCS]
    # The fixture is what it claims: the library's default adds BOS.
    assert all(lib.encode(d).ids == [bos, *ids] for d, ids in zip(DOCS, own, strict=True))
    return path, corpus, lib, bos, eos, own


def _expected(own, eos, is_val) -> list[int]:
    """Each document's ids + EOS, in order, for the documents of one split."""
    return [t for ids, v in zip(own, is_val, strict=True) if v for t in (*ids, eos)]


def test_open_tokenizer_encodes_without_the_post_processors_bos(setup):
    path, _, _, bos, eos, own = setup
    tk = open_tokenizer(path, field="--tokenizer")
    assert tk.adds_specials_by_default
    assert (tk.bos_id, tk.eos_id) == (bos, eos)
    assert tk.encode_batch(DOCS) == own
    assert [tk.encode(d) for d in DOCS[:5]] == own[:5]
    assert tk.decode(own[0]) == DOCS[0]


def test_data_tokenize_writes_each_documents_own_ids_and_eos(setup, tmp_path):
    path, corpus, _, bos, eos, own = setup
    out = tmp_path / "shards"
    manifest = tokenize_lib.run(str(corpus), str(path), out,
                                tokenize_lib.Options(shard_tokens=10_000, val_fraction=FRACTION),
                                progress=False, log=lambda m: None)
    is_val = [split.is_validation(np.asarray(ids, np.uint32), FRACTION) for ids in own]
    assert 0 < sum(is_val) < len(DOCS)
    for name, want in (("train", [not v for v in is_val]), ("val", is_val)):
        stream = np.concatenate([token_cache.open_tokens(f) for f in sorted(out.glob(f"{name}_*"))])
        np.testing.assert_array_equal(stream, _expected(own, eos, want))
        assert bos not in stream
    assert manifest["eos_id"] == eos and manifest["tokenizer"]["eos_token"] == "</s>"


def _prepare_config(path, corpus, cache):
    return config_lib.apply_overrides(config_lib.base_config(), {
        "data.cache_dir": str(cache), "data.corpus": "jsonl", "data.paths": str(corpus),
        "data.tokenizer": str(path), "data.val_fraction": FRACTION, "model.vocab_size": 320,
        "train.seq_len": 32, "train.batch_size": 2, "data.val_windows": 2})


def test_data_prepare_and_data_show_use_the_same_ids(setup, tmp_path, capsys):
    path, corpus, _, bos, eos, own = setup
    p = data.prepare(_prepare_config(path, corpus, tmp_path / "cache"), progress=False)
    is_val = [split.is_validation(d, FRACTION) for d in DOCS]  # text corpora split by text
    train = np.load(p.train_tokens_path)
    np.testing.assert_array_equal(train, _expected(own, eos, [not v for v in is_val]))
    np.testing.assert_array_equal(np.load(p.val_tokens_path), _expected(own, eos, is_val))
    assert (p.bos_id, p.eos_id) == (bos, eos)
    # data show: the windows are the cache's tokens, and decode back to the documents.
    assert main(["data", "show", "--json", "--quiet", "--windows", "4",
                 f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.data.corpus=jsonl",
                 f"--config.data.paths={corpus}", f"--config.data.tokenizer={path}",
                 f"--config.data.val_fraction={FRACTION}", "--config.model.vocab_size=320",
                 "--config.train.seq_len=32", "--config.train.batch_size=2"]) == 0
    windows = json.loads(capsys.readouterr().out)
    joined = train.tobytes()
    for w in windows:
        assert np.asarray(w["tokens"], train.dtype).tobytes() in joined
    inner = [t for w in windows for t in w["text"].split("\n<|eos|>\n")[1:-1]]
    assert all(t in DOCS for t in inner)


def test_a_runs_tokenizer_and_the_lm_eval_backend_use_the_same_ids(setup, tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]')")
    from depthbench.evaluation import runner
    from depthbench.evaluation.lm_backend import DepthbenchLM
    from depthbench.run import load_run

    path, _, _, bos, eos, own = setup
    run_dir = tiny_run(tmp_path / "run")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(path.with_name(name), run_dir / name)
    run = load_run(run_dir)
    assert [run.tokenizer.encode(d) for d in DOCS[:8]] == own[:8]
    assert runner.prefix_token_id(run.tokenizer) == bos  # scoring adds it, explicitly
    lm = DepthbenchLM(run=run, progress=False)
    assert [lm.tok_encode(d) for d in DOCS[:8]] == own[:8]
    bos_lm = DepthbenchLM(run=run, add_bos_token=True, progress=False)
    assert [bos_lm.tok_encode(d) for d in DOCS[:8]] == [[bos, *ids] for ids in own[:8]]
    assert lm.eot_token_id == eos
