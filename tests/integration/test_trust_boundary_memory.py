"""The largest crafted inputs of tests/helpers/bad_checkpoints.py are refused before
they cost memory: each runs as a real ``depthbench`` process (the console entry
point, so its exit is the user's) whose peak resident memory, read with
``/proc/self/status`` (VmHWM) in the process itself as it exits, stays under 1 GiB,
with one line on stderr and exit status 2 (no traceback from background work
after it).  Each of these inputs declares gigabytes (a 2 GiB ``.metadata``, a
1 GiB config.json, a zip member inflating to 2 GiB, a 2 GiB safetensors
header, 10**7 layers, 10**12 elements, four million opcodes of empty dicts
or memo entries) in sparse files or headers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
from bad_checkpoints import CASES, build_sources

LARGEST = ("import-olmo: a .metadata of 2 GiB", "import-olmo: a config.json of 1 GiB",
           "import-olmo: a zip member inflating to 2 GiB",
           "import-olmo: n_layers 10**7, a 4-layer checkpoint",
           "import-olmo: a tensor declaring 10**12 elements",
           "import-olmo: a chunk record of 2 GiB",
           "import-olmo: a .metadata of a million empty dicts",
           "import-olmo: a .metadata of four million memo entries",
           "import-hf: num_hidden_layers 10**7, a 2-layer checkpoint",
           "import-hf: a config.json of 1 GiB", "import-hf: a header of 2 GiB",
           "import-hf: a tensor declaring 10**12 elements", "export-hf: the run's depth 10**7",
           "generate: an integrity.json of 1 GiB")

# The child: the console entry point, its own peak RSS printed (KiB, Linux) as it exits.
# VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across execve, so a child
# forked from a pytest worker of 2.6 GiB reported the worker's peak, not its own.
CHILD = ("import atexit, re, sys\n"
         "atexit.register(lambda: print('peak_kib', re.search(r'VmHWM:\\s+(\\d+) kB', "
         "open('/proc/self/status').read()).group(1), flush=True))\n"
         "from depthbench.cli import entry\n"
         "sys.argv = ['depthbench', *sys.argv[1:]]\n"
         "entry()\n")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    pytest.importorskip("safetensors")
    return build_sources(tmp_path_factory.mktemp("sources"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status: Linux")
@pytest.mark.parametrize("case", [c for c in CASES if c.id in LARGEST], ids=lambda c: c.id)
def test_the_largest_refused_inputs_peak_under_1_gib(case, sources, tmp_path):
    pristine = getattr(sources, case.source)
    src = tmp_path / "src" / pristine.name
    shutil.copytree(pristine, src, symlinks=True)
    (tmp_path / "scratch").mkdir()
    case.damage(src, tmp_path / "scratch")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", CHILD, *case.argv(src, out)],
                          capture_output=True, text=True, timeout=300)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert re.search(case.pattern, lines[0]), lines[0]
    peak_mib = int(re.search(r"peak_kib (\d+)", done.stdout).group(1)) / 1024
    print(f"{case.id}: peak {peak_mib:.0f} MiB")
    assert peak_mib < 1024 and not out.exists()


def test_every_measured_case_is_in_the_table():
    assert set(LARGEST) <= {c.id for c in CASES}
