"""The lm-eval ``depthbench`` backend in lm-eval's task runs, against lm-eval's own
``hf`` backend on a small random Hugging Face Llama: the same accuracies, through
``lm_eval.simple_evaluate``, ``depthbench lm-eval`` and a fresh interpreter
(integration: lm-eval starts processes to record its environment)."""

from __future__ import annotations

import json

import pytest
from lm_eval_tiny import MC_YAML

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]')")
pytest.importorskip("torch", reason="torch not installed (pip install -e '.[test-hf]')")
pytest.importorskip("transformers",
                    reason="transformers not installed (pip install -e '.[test-hf]')")

from depthbench.cli import main as cli_main  # noqa: E402
from depthbench.evaluation import runner  # noqa: E402
from depthbench.evaluation.lm_backend import DepthbenchLM  # noqa: E402

MC_RECORDS = [
    {"question": "What boils at 100 degrees?", "choices": ["water", "iron", "salt"], "label": 0},
    {"question": "What is 5 - 2?", "choices": ["2", "3", "7", "10"], "label": 1},
    {"question": "Which colour is the sky?", "choices": ["red", "green", "blue"], "label": 2},
    {"question": "def add(a, b): returns?", "choices": ["a + b", "a * b"], "label": 0},
    {"question": "Where is energy made?", "choices": ["nucleus", "mitochondria"], "label": 1},
    {"question": "Solve x + 1 = 2.", "choices": ["x = 1", "x = 2", "x = 0"], "label": 0},
]


def test_multiple_choice_accuracy_matches_the_hf_backend(models, tmp_path):
    hf, _, _, root = models
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MC_RECORDS))
    (tmp_path / "tiny_mc.yaml").write_text(MC_YAML.format(name="tiny_mc", data=data))
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
def test_depthbench_lm_eval_runs_lm_evals_cli_with_the_backend(models, tmp_path, capsys,
                                                              monkeypatch):
    _, _, _, root = models
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MC_RECORDS))
    (tmp_path / "tiny_mc.yaml").write_text(MC_YAML.format(name="tiny_mc", data=data))
    from lm_eval.tasks._index import TaskIndex

    indexed, build = [], TaskIndex.build
    monkeypatch.setattr(TaskIndex, "build", staticmethod(lambda paths, **k: (
        indexed.extend(paths), build(paths, **k))[1]))
    rc = cli_main(["lm-eval", "--model", "depthbench", "--model_args", f"run={root / 'run'}",
                   "--batch_size", "4", "--tasks", "tiny_mc", "--include_path", str(tmp_path),
                   "--output_path", str(tmp_path / "out")])
    assert rc == 0
    # Its one task is defined under --include_path: lm-eval's built-in tasks were not indexed.
    assert indexed and {str(p) for p in indexed} == {str(tmp_path)}
    (path,) = (tmp_path / "out").rglob("results_*.json")
    saved = json.loads(path.read_text())
    from lm_eval.tasks import TaskManager

    direct = lm_eval.simple_evaluate(
        model=DepthbenchLM(run=str(root / "run"), batch_size=4, progress=False),
        tasks=["tiny_mc"], task_manager=TaskManager(include_path=str(tmp_path),
                                                    include_defaults=False))
    assert saved["results"]["tiny_mc"]["acc,none"] == direct["results"]["tiny_mc"]["acc,none"]
    assert saved["n-samples"]["tiny_mc"]["effective"] == len(MC_RECORDS)
