"""Tests that share a module- or class-scoped fixture value are one xdist group
(tests/shared_fixture_groups.py), checked on a small collection in-process."""

from __future__ import annotations

_MODULE = """
import pytest

@pytest.fixture(scope="module", params=[object(), object()])
def built(request):
    return request.param

@pytest.fixture(scope="module")
def corpus():
    return 1

@pytest.fixture
def each():
    return 2

@pytest.mark.parametrize("n", [1, 2])
def test_uses_the_parametrised_one(built, n):
    pass

def test_uses_two_shared_ones(corpus, built):
    pass

def test_uses_a_function_fixture(each):
    pass

def test_uses_none():
    pass

@pytest.mark.xdist_group("mine")
def test_keeps_its_own_group(corpus):
    pass
"""


def test_groups_follow_the_shared_fixture_values_by_index(pytester):
    pytester.makepyfile(test_mod=_MODULE)
    items = pytester.inline_genitems("-p", "shared_fixture_groups")[0]
    groups = {}
    for item in items:
        marks = [m.args[0] for m in item.iter_markers("xdist_group")]
        groups[item.name] = marks[0] if len(marks) == 1 else (marks or None)
    assert groups == {
        "test_uses_the_parametrised_one[built0-1]": "test_mod::built#0",
        "test_uses_the_parametrised_one[built0-2]": "test_mod::built#0",
        "test_uses_two_shared_ones[built0]": "test_mod::built#0,corpus",
        "test_uses_the_parametrised_one[built1-1]": "test_mod::built#1",
        "test_uses_the_parametrised_one[built1-2]": "test_mod::built#1",
        "test_uses_two_shared_ones[built1]": "test_mod::built#1,corpus",
        "test_uses_a_function_fixture": None,
        "test_uses_none": None,
        "test_keeps_its_own_group": "mine",
    }
