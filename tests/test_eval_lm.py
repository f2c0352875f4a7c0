"""The lm-eval ``depthbench`` backend against lm-eval's own ``hf`` backend on a small
random Hugging Face Llama (saved locally with a tokenizer, imported with import-hf):
same loglikelihoods, rolling loglikelihoods, greedy generations and accuracies."""

from __future__ import annotations

import json

import numpy as np
import pytest
from eval_tiny import CORPUS, tiny_tokenizer

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]')")
torch = pytest.importorskip("torch", reason="torch not installed (pip install -e '.[test-hf]')")
transformers = pytest.importorskip(
    "transformers", reason="transformers not installed (pip install -e '.[test-hf]')")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from depthbench.cli import main as cli_main  # noqa: E402
from depthbench.evaluation import runner  # noqa: E402
from depthbench.evaluation.lm_backend import DepthbenchLM  # noqa: E402

MAX_LEN = 48

MC_YAML = """\
task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""
MC_RECORDS = [
    {"question": "What boils at 100 degrees?", "choices": ["water", "iron", "salt"], "label": 0},
    {"question": "What is 5 - 2?", "choices": ["2", "3", "7", "10"], "label": 1},
    {"question": "Which colour is the sky?", "choices": ["red", "green", "blue"], "label": 2},
    {"question": "def add(a, b): returns?", "choices": ["a + b", "a * b"], "label": 0},
    {"question": "Where is energy made?", "choices": ["nucleus", "mitochondria"], "label": 1},
    {"question": "Solve x + 1 = 2.", "choices": ["x = 1", "x = 2", "x = 0"], "label": 0},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(HFLM, DepthbenchLM, HF model) on the same random Llama (GQA, untied)."""
    root = tmp_path_factory.mktemp("lm")
    hf_dir = root / "hf"
    tok_json = tiny_tokenizer(hf_dir)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_json), bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(hf_dir)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_LEN,
        initializer_range=0.2, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(hf_dir)
    assert cli_main(["import-hf", str(hf_dir), "--out", str(root / "run")]) == 0
    hf = HFLM(pretrained=str(hf_dir), dtype="float32", device="cpu", batch_size=1)
    ours = DepthbenchLM(run=str(root / "run"), batch_size=4, progress=False)
    return hf, ours, model, root


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


def test_multiple_choice_accuracy_matches_the_hf_backend(models, tmp_path):
    hf, _, _, root = models
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MC_RECORDS))
    (tmp_path / "tiny_mc.yaml").write_text(MC_YAML.format(data=data))
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    ref = lm_eval.simple_evaluate(model=hf, tasks=["tiny_mc"], task_manager=manager)
    ours, _ = runner.evaluate(root / "run", tasks=["tiny_mc"], include_path=tmp_path,
                              name="tiny_mc", batch_size=4, progress=False)
    r, o = ref["results"]["tiny_mc"], ours["tasks"]["tiny_mc"]
    assert ref["n-samples"]["tiny_mc"]["effective"] == len(MC_RECORDS)
    assert o["acc,none"] == r["acc,none"] and o["acc_norm,none"] == r["acc_norm,none"]
    saved = json.loads((root / "run" / "eval" / "tiny_mc.json").read_text())
    assert saved["tasks"]["tiny_mc"]["acc,none"] == r["acc,none"]


def test_registering_keeps_lm_evals_own_models():
    """In a fresh interpreter: importing the backend first must not hide lm-eval's
    built-in models (lm-eval loads them only into an empty registry)."""
    import subprocess
    import sys

    code = ("import depthbench.evaluation.lm_backend\n"
            "from lm_eval.api.registry import model_registry\n"
            "print(sorted(k for k in model_registry.keys() if k in ('hf', 'vllm', 'depthbench')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['depthbench', 'hf', 'vllm']"


@pytest.mark.slow
def test_depthbench_lm_eval_runs_lm_evals_cli_with_the_backend(models, tmp_path, capsys):
    _, _, _, root = models
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MC_RECORDS))
    (tmp_path / "tiny_mc.yaml").write_text(MC_YAML.format(data=data))
    rc = cli_main(["lm-eval", "--model", "depthbench", "--model_args", f"run={root / 'run'}",
                   "--batch_size", "4", "--tasks", "tiny_mc", "--include_path", str(tmp_path),
                   "--output_path", str(tmp_path / "out")])
    assert rc == 0
    (path,) = (tmp_path / "out").rglob("results_*.json")
    saved = json.loads(path.read_text())
    from lm_eval.tasks import TaskManager

    direct = lm_eval.simple_evaluate(
        model=DepthbenchLM(run=str(root / "run"), batch_size=4, progress=False),
        tasks=["tiny_mc"], task_manager=TaskManager(include_path=str(tmp_path),
                                                    include_defaults=False))
    assert saved["results"]["tiny_mc"]["acc,none"] == direct["results"]["tiny_mc"]["acc,none"]
    assert saved["n-samples"]["tiny_mc"]["effective"] == len(MC_RECORDS)
