"""Keep the tests that share a module- or class-scoped fixture value on one pytest-xdist worker.

The costly fixtures of the suite are module-scoped: a family's compiled model
(tests/unit/test_families_shared.py's ``Harness``), a trained tiny run.  Under
``-n 2`` with xdist's ``load`` distribution the tests that share one such
value are handed to both workers, and each builds it: the same programs traced,
lowered and compiled twice.  This plugin marks every test that uses one with
``xdist_group(<module>::<fixture>#<param index> ...)``, so that ``--dist loadgroup``
(pyproject.toml's ``addopts``) sends the tests of one value to one worker;
different values (families) still spread over the workers, and tests without
such a fixture are distributed one by one, as ``load`` does.
"""

from __future__ import annotations

import pytest

_SHARED_SCOPES = ("module", "class", "package")


def group_of(item: pytest.Item) -> str | None:
    """The group name of ``item``: its module and the module-/class-scoped
    fixtures it uses, with their parameters; None when it uses none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    # A parameter by its index, not its value: the group is part of the test's
    # id under loadgroup, which every worker must compute alike (a value's repr
    # may hold a memory address).
    indices = getattr(getattr(item, "callspec", None), "indices", {})
    shared = []
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in _SHARED_SCOPES:
            shared.append(f"{name}#{indices[name]}" if name in indices else name)
    if not shared:
        return None
    return f"{item.module.__name__}::{','.join(sorted(shared))}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := group_of(item)):
            item.add_marker(pytest.mark.xdist_group(group))
