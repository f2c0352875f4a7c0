"""``depthbench lm-eval`` indexes only ``--include_path`` when every task it is
asked for is defined there (lm-eval's ~15,000 built-in task files otherwise), and
names a task that is in no index without building lm-eval's."""

from __future__ import annotations

import pytest
from lm_eval_tiny import MC_YAML

pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install -e '.[eval]')")

from depthbench.cli.lm_eval_cmd import _without_builtin_tasks, task_plan  # noqa: E402


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
    assert task_plan(argv.format(p=include).split())[0] is local


def test_lm_evals_task_manager_indexes_only_the_include_path_while_skipped(include):
    import lm_eval.tasks

    builtin = lm_eval.tasks.TaskManager
    with _without_builtin_tasks():
        manager = lm_eval.tasks.TaskManager(include_path=include)
        assert isinstance(manager, builtin)
        assert sorted(manager.task_index) == ["tiny_a", "tiny_b", "tiny_group", "tiny_tag"]
    assert lm_eval.tasks.TaskManager is builtin


@pytest.fixture
def indexed(monkeypatch) -> list[str]:
    """The folders lm-eval's task index walks from now on."""
    from lm_eval.tasks._index import TaskIndex

    built, roots = TaskIndex.build, []

    def recording(paths, **kwargs):
        roots.extend(str(p) for p in paths)
        return built(paths, **kwargs)

    monkeypatch.setattr(TaskIndex, "build", staticmethod(recording))
    return roots


def test_unknown_tasks_are_found_without_the_builtin_index(include, tmp_path, indexed):
    from depthbench.evaluation.runner import resolve_tasks

    (tmp_path / "no_such_dir").mkdir()
    asked = ["no_such_task", "arc_easy", "tiny_a", "tiny_group", "tiny_tag", "arc_*",
             "mine.yaml", str(tmp_path / "no_such_dir"), "no_such_task", "zz_other"]
    assert resolve_tasks(asked, include) == (None, ["no_such_task", "zz_other"])
    assert indexed == [include]  # lm-eval indexed --include_path alone, once
    # a local task, without --include_path
    assert resolve_tasks(["tiny_a"]) == (None, ["tiny_a"])
    assert task_plan(f"--model depthbench --tasks arc_easy,nope_x --include_path "
                     f"{include}".split()) == (False, ["nope_x"])
    assert task_plan(["ls", "tasks"]) == (False, [])
    assert task_plan("validate --tasks nope_x".split()) == (False, [])


def test_eval_names_an_unknown_task_without_the_builtin_index(include, indexed):
    from depthbench.errors import ConfigError
    from depthbench.evaluation.runner import lm_eval_suite

    with pytest.raises(ConfigError, match=r"^--tasks: 'no_such_task' is not an lm-eval task "
                                          r"\(nor in --include-path\)$"):
        lm_eval_suite(None, ["tiny_a", "no_such_task"], include_path=include)
    assert indexed == [include]


def test_every_name_lm_eval_indexes_is_text_of_its_task_files():
    """What :func:`resolve_tasks` relies on, checked with lm-eval's own parser on
    every 25th built-in YAML file (the whole index takes 8-20 s): each name the
    file gives the index (task, group, tags; its includes followed) is found in
    the text of the task folder's files."""
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    from depthbench.evaluation.runner import builtin_task_files

    files = builtin_task_files()
    text = b"\n".join(path.read_bytes() for path in files)
    index = {}
    for path in sorted(p for p in files if p.suffix == ".yaml")[::25]:
        try:
            TaskIndex.process_cfg(load_yaml(path, resolve_func=False, recursive=True), path, index)
        except Exception:  # noqa: BLE001 - lm-eval's build skips the files it cannot read
            continue
    assert len(index) > 300
    assert [name for name in index if name.encode() not in text] == []
