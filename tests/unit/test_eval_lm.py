"""The lm-eval ``depthbench`` backend against lm-eval's own ``hf`` backend on a small
random Hugging Face Llama (saved locally with a tokenizer, imported with import-hf):
same loglikelihoods, rolling loglikelihoods and greedy generations (the accuracies of
lm-eval's task runs: tests/integration/test_eval_lm_tasks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from eval_tiny import CORPUS
from lm_eval_tiny import MAX_LEN

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]')")
torch = pytest.importorskip("torch", reason="torch not installed (pip install -e '.[test-hf]')")
transformers = pytest.importorskip(
    "transformers", reason="transformers not installed (pip install -e '.[test-hf]')")

from lm_eval.api.instance import Instance  # noqa: E402

from depthbench.evaluation.lm_backend import DepthbenchLM  # noqa: E402


def _requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_registered_in_lm_eval_and_as_an_entry_point():
    import importlib.metadata as md

    from lm_eval.api.registry import get_model

    assert get_model("depthbench") is DepthbenchLM
    points = {e.name: e.value for e in md.entry_points(group="lm_eval.models")}
    assert points.get("depthbench") == "depthbench.evaluation.lm_backend:DepthbenchLM"


def test_loglikelihoods_match_the_hf_backend(models):
    hf, ours, _, _ = models
    assert (ours.max_length, ours.prefix_token_id, ours.eot_token_id) == (
        hf.max_length, hf.prefix_token_id, hf.eot_token_id)
    args = [("Question: What boils at 100 degrees?\nAnswer:", " water"),
            ("Question: What is 5 - 2? Answer: ", "3"),  # trailing space moves to the target
            ("", "def add(a, b):\n    return a + b"),  # empty context: the prefix token
            (CORPUS[0] * 3, " the end of a long context, cut from the left")]
    a = hf.loglikelihood(_requests("loglikelihood", args), disable_tqdm=True)
    b = ours.loglikelihood(_requests("loglikelihood", args), disable_tqdm=True)
    for (la, ga), (lb, gb) in zip(a, b, strict=True):
        assert abs(la - lb) <= 1e-4 * max(1.0, abs(la))
        assert ga == gb
    assert len({round(x, 3) for x, _ in a}) == len(a)  # distinct, informative scores


def test_rolling_loglikelihoods_match_the_hf_backend(models):
    hf, ours, _, _ = models
    texts = [(CORPUS[1],), (" ".join(CORPUS[:3]),)]  # the second spans several windows
    assert len(ours.tok_encode(texts[1][0])) > 2 * MAX_LEN
    a = hf.loglikelihood_rolling(_requests("loglikelihood_rolling", texts), disable_tqdm=True)
    b = ours.loglikelihood_rolling(_requests("loglikelihood_rolling", texts), disable_tqdm=True)
    np.testing.assert_allclose(b, a, rtol=1e-4)


def test_generate_until_greedy_stops_and_max_length(models):
    hf, ours, model, _ = models

    def hf_greedy(text, n):
        ids = torch.tensor([ours.tok_encode(text)])
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0,
                             eos_token_id=ours.eot_token_id)
        return out[0, ids.shape[1]:].tolist()

    # A prompt whose greedy continuation runs 8 tokens without EOS (the model is random).
    prompts = [c[:n] for n in (20, 30, 12) for c in CORPUS[:5]]
    ctx, ref = next((c, r) for c in prompts if len(ours.tok_encode(c)) + 8 <= MAX_LEN
                    and ours.eot_token_id not in (r := hf_greedy(c, 8)) and len(r) == 8)
    free = ours.generate_until(_requests("generate_until", [
        (ctx, {"until": [], "max_gen_toks": 8, "do_sample": False})]), disable_tqdm=True)[0]
    assert free == ours.tok_decode(ref) and len(free) > 2  # greedy, max_gen_toks tokens
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop and free.find(stop) > 0
    gen = [(ctx, {"until": [stop], "max_gen_toks": 8, "do_sample": False}),
           (ctx, {"until": ["@@"], "max_gen_toks": 3, "do_sample": False})]
    got = ours.generate_until(_requests("generate_until", gen), disable_tqdm=True)
    assert got[0] == free[:free.find(stop)]
    assert got[1] == ours.tok_decode(ref[:3])
    assert got == hf.generate_until(_requests("generate_until", gen), disable_tqdm=True)


def cut(text, stop):
    return text.split(stop)[0]


