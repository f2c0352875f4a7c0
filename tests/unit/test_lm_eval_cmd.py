"""``depthbench lm-eval`` indexes only ``--include_path`` when every task it is
asked for is defined there (lm-eval's ~15,000 built-in task files otherwise)."""

from __future__ import annotations

import pytest
from lm_eval_tiny import MC_YAML

pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]')")

from depthbench.cli.lm_eval_cmd import _without_builtin_tasks, local_tasks_only  # noqa: E402


@pytest.fixture(scope="module")
def include(tmp_path_factory):
    """Two local tasks (one tagged ``tiny_tag``) and a group of them."""
    root = tmp_path_factory.mktemp("tasks")
    data = root / "mc.jsonl"
    data.write_text('{"question": "Q?", "choices": ["a", "b"], "label": 0}\n')
    (root / "tiny_a.yaml").write_text(MC_YAML.format(name="tiny_a", data=data))
    tagged = MC_YAML.format(name="tiny_b", data=data) + "tag: tiny_tag\n"
    (root / "tiny_b.yaml").write_text(tagged)
    (root / "tiny_group.yaml").write_text("group: tiny_group\ntask:\n  - tiny_a\n  - tiny_b\n")
    return str(root)


@pytest.mark.parametrize(("argv", "local"), [
    ("--model depthbench --tasks tiny_a --include_path {p}", True),
    ("run --model depthbench --tasks tiny_a,tiny_b --include_path {p}", True),
    ("--include_path {p} -t tiny_a tiny_b --batch_size 2", True),
    ("--model depthbench --tasks tiny_a,arc_easy --include_path {p}", False),  # a built-in task
    ("--model depthbench --tasks tiny_group --include_path {p}", False),  # a group
    ("--model depthbench --tasks tiny_tag --include_path {p}", False),  # a tag
    ("--model depthbench --tasks tiny_a", False),  # no --include_path
    ("--model depthbench --tasks {p}/tiny_a.yaml --include_path {p}", False),  # a YAML path
    ("--config run.yaml --tasks tiny_a --include_path {p}", False),  # --config may add tasks
    ("ls tasks --include_path {p}", False),
    ("validate --tasks tiny_a --include_path {p}", False),
    ("--model depthbench --include_path {p}", False),  # no task
])
def test_which_commands_skip_the_builtin_index(include, argv, local):
    assert local_tasks_only(argv.format(p=include).split()) is local


def test_lm_evals_task_manager_indexes_only_the_include_path_while_skipped(include):
    import lm_eval.tasks

    builtin = lm_eval.tasks.TaskManager
    with _without_builtin_tasks():
        manager = lm_eval.tasks.TaskManager(include_path=include)
        assert isinstance(manager, builtin)
        assert sorted(manager.task_index) == ["tiny_a", "tiny_b", "tiny_group", "tiny_tag"]
    assert lm_eval.tasks.TaskManager is builtin
