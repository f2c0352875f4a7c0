"""The accelerator extras of pyproject.toml name what the package index serves (unit).

``gpu``, ``gpu-cuda13`` and ``tpu`` are jax's own extras (``jax[cuda12]``,
``jax[cuda13]``, ``jax[tpu]``) over the same jax range as the core
dependency, so pip installs the plugin built for the jax it installs.  The
installed jax's metadata must still offer those extras, and through them the
packages the index serves under these names (``jax-cuda12-plugin``,
``jax-cuda13-plugin``, ``libtpu``), each plugin pinned to that jax's version.
Resolving them for real downloads gigabytes of CUDA wheels, so this reads
metadata only.
"""

from __future__ import annotations

import importlib.metadata

import pytest
from packaging.requirements import Requirement
from paths import REPO

tomllib = pytest.importorskip("tomllib")

PYPROJECT = REPO / "pyproject.toml"
EXTRAS = {"gpu": ("cuda12", "jax-cuda12-plugin"), "gpu-cuda13": ("cuda13", "jax-cuda13-plugin"),
          "tpu": ("tpu", "libtpu")}


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def jax_requirement(reqs) -> Requirement:
    (req,) = [Requirement(r) for r in reqs if Requirement(r).name == "jax"]
    return req


@pytest.mark.parametrize("extra", list(EXTRAS))
def test_extra_is_jax_own_extra_over_the_core_range(extra):
    proj = project()
    reqs = proj["optional-dependencies"][extra]
    assert len(reqs) == 1, reqs
    req = jax_requirement(reqs)
    assert req.extras == {EXTRAS[extra][0]}
    assert req.specifier == jax_requirement(proj["dependencies"]).specifier
    assert req.marker is None


@pytest.mark.parametrize("extra", list(EXTRAS))
def test_installed_jax_offers_the_extra_and_its_plugin(extra):
    jax_extra, plugin = EXTRAS[extra]
    meta = importlib.metadata.metadata("jax")
    assert jax_extra in meta.get_all("Provides-Extra")
    version = importlib.metadata.version("jax")
    named = {}
    for line in importlib.metadata.requires("jax"):
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": jax_extra}):
            named[req.name] = req
    assert plugin in named, sorted(named)
    assert "jaxlib" in named and named["jaxlib"].specifier.contains(version)
    if plugin != "libtpu":  # the CUDA plugins move in lockstep with jax
        assert named[plugin].specifier.contains(version)
