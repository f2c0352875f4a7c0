"""The import graph of ``src/``: no cycles (imports inside functions count too),
no import up the floors (:data:`FLOORS`), errors.py below everything, and the
library never imports its command line."""

from __future__ import annotations

import ast
from pathlib import Path

from paths import SRC


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module under src/ (packages as their __init__)."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (top level or not).

    ``import a.b.c`` and ``from a.b import c`` (``c`` a module) import ``a.b.c``;
    ``from a.b import f`` (``f`` not a module) reads ``a.b``'s namespace, an edge
    to ``a.b``.  The packages enclosing ``name`` are not edges: they are being
    imported already whenever ``name`` is (that is not a cycle, it is nesting)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    if name.endswith(".model.residual.protocol.registry"):
        # The registry imports its families by name ("module:Class" strings) from
        # the package its FAMILY_PACKAGE names.
        family_package = name.removesuffix(".protocol.registry")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.count(":") == 1 and node.value.split(":")[0].isidentifier():
                targets.add(f"{family_package}.{node.value.split(':')[0]}")
    enclosing = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
    edges = set()
    for target in targets:
        parts = target.split(".")
        for k in range(1, len(parts) + 1):
            prefix = ".".join(parts[:k])
            if prefix in known and prefix != name and prefix not in enclosing:
                edges.add(prefix)
    return edges


def graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {name: imported(name, path, known) for name, path in files.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_checker_finds_a_cycle_and_resolves_imports(tmp_path):
    # A known answer for the checker itself: a -> b -> (function-level) a.
    assert find_cycle({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    from . import c\n")
    (pkg / "d.py").write_text("from pkg.a import f\nimport pkg.c\n")
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}
    assert imported("pkg.b", pkg / "b.py", known) == {"pkg.a", "pkg.c"}
    assert imported("pkg.d", pkg / "d.py", known) == {"pkg.a", "pkg.c"}
    # A module outside the package that imports one inside runs the package too.
    (tmp_path / "top.py").write_text("def g():\n    import pkg.a\n")
    assert imported("top", tmp_path / "top.py", known | {"top"}) == {"pkg", "pkg.a"}


def test_src_has_no_import_cycles():
    g = graph()
    assert "depthbench.config" in g and "depthbench.model.residual.protocol.registry" in g
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The floors of src/, lowest first: a module may import its own floor and those
# below it, never one above (module prefixes under depthbench, the longest
# match deciding; pallas_kernels is its own package).  A package whose
# __init__ imports nothing is no edge (its modules are imported, not it).
FLOORS = (
    ("errors", "formatting", "digest"),
    # a run directory's files; what is read; what a failed read or write leaves behind
    ("faults", "orbax_leftovers", "output_paths", "rundir", "confine"),
    ("shapes", "model.spec", "pallas_kernels"),
    ("model.residual.protocol",),  # what a family implements and declares
    ("model.depth_scan", "model.layers", "model.past_attention"),
    ("model.residual.parts",),  # pieces families share
    ("model", "model.residual.protocol.registry"),  # the families, their table, the model
    ("variants", "config", "configs", "reference"),
    ("costs", "parallel", "hostmem", "cpu_dots", "data", "run_identity"),
    ("train",),
    ("run", "formats", "finetune"),  # a model of a run; runs in and out
    ("generation",),  # a run's prefill and decode programs, sampling, the decode loop
    ("analysis", "evaluation", "equal_compute", "plots", "dryrun"),
    ("sweep",),
    ("report", "run_report", "lr_transfer"),
    ("cli", "__main__", ""),  # the command line and the package root
)


def floor(module: str) -> int | None:
    if module.split(".")[0] == "pallas_kernels":
        return 2
    rel = module.removeprefix("depthbench").lstrip(".")
    best = None
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if rel == prefix or (prefix and rel.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (level, len(prefix))
    return None if best is None else best[0]


def test_no_import_runs_up_the_floors():
    g = graph()
    unplaced = sorted(m for m in g if floor(m) is None)
    assert unplaced == [], f"place these modules on a floor: {unplaced}"
    up = sorted(f"{m} -> {t}" for m, targets in g.items() for t in targets
                if g.get(t) and floor(t) > floor(m))
    assert up == []


def test_the_floors_catch_an_upward_import():
    assert floor("depthbench.formatting") < floor("depthbench.configs.paper_400m")
    assert floor("depthbench.configs.paper_400m") < floor("depthbench.sweep.expand")
    assert floor("depthbench.run_identity") > floor("depthbench.config")
    assert floor("depthbench.model.residual.protocol.base") < floor("depthbench.model.layers")


def test_errors_imports_nothing_and_the_library_not_its_cli():
    g = graph()
    assert g["depthbench.errors"] == set()
    assert g["depthbench.formatting"] == set()
    for name, targets in g.items():
        if not name.startswith(("depthbench.cli", "depthbench.__main__")):
            cli = sorted(t for t in targets if t.startswith("depthbench.cli"))
            assert not cli, f"{name} imports the command line: {cli}"


# The house as a reader draws it: one node per package or top-level module of
# src/ (pallas_kernels one node), an arrow where one imports the other.
MAX_LEVELS = 11


def house(g: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    g = graph() if g is None else g

    def node(module: str) -> str:
        if module.split(".")[0] == "pallas_kernels":
            return "pallas_kernels"
        return module.removeprefix("depthbench").lstrip(".").split(".")[0] or "__init__"

    out: dict[str, set[str]] = {}
    for module, targets in g.items():
        out.setdefault(node(module), set()).update(
            node(t) for t in targets if t in g and node(t) != node(module))
    return out


def levels(h: dict[str, set[str]]) -> dict[str, int]:
    """Each node's level: 1 + the longest chain of imports below it (a DAG)."""
    found: dict[str, int] = {}

    def level(n: str) -> int:
        if n not in found:
            found[n] = 1 + max((level(t) for t in h[n]), default=0)
        return found[n]

    for n in h:
        level(n)
    return found


def test_the_house_has_no_upward_import_and_few_levels():
    h = house()
    assert {"cli", "run", "formats", "model", "rundir", "config", "configs"} <= set(h)
    cycle = find_cycle(h)
    assert cycle is None, "packages import each other (an upward import): " + " -> ".join(cycle)
    by_level = levels(h)
    top = max(by_level.values())
    chain = [max(h, key=by_level.get)]
    while h[chain[-1]]:
        chain.append(max(h[chain[-1]], key=by_level.get))
    assert top <= MAX_LEVELS, f"{top} levels: {' -> '.join(chain)}"


def test_the_house_checker_counts_levels_and_finds_a_package_cycle():
    g = {"depthbench.a.x": {"depthbench.b"}, "depthbench.b": {"depthbench.c.y"},
         "depthbench.c.y": set(), "depthbench.a.z": set()}
    assert levels(house(g)) == {"a": 3, "b": 2, "c": 1}
    g["depthbench.c.y"] = {"depthbench.a.z"}  # c imports a's module: a package cycle
    assert find_cycle(house(g)) is not None
