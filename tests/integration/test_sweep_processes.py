"""Sweeps run by processes of their own: two processes sweeping one directory
never train the same run (the rest of the sweep's logic, in-process:
tests/unit/test_sweep.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from sweep_spec import NAMES, read_csv

WORKER = """
import json, os, sys, time
from pathlib import Path
from depthbench import sweep as sweeplib

spec, workdir, go = sys.argv[1:4]
s = sweeplib.expand(spec)

def runner(config, run_dir, *, progress=True):
    with open(Path(run_dir) / "trained_by", "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.4)
    result = {"final_val_loss": 3.0, "diverged": False}
    (Path(run_dir) / "result.json").write_text(json.dumps(result))
    return result

while not os.path.exists(go):  # start both processes' sweeps together
    time.sleep(0.01)
out = sweeplib.run_sweep(s, workdir, runner=runner, progress=False)
print(json.dumps({"trained": out.trained, "skipped": out.skipped}))
"""


def test_two_processes_never_train_the_same_run(spec_file, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), str(spec_file), str(tmp_path / "w"),
                               str(go)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(0.2)
    go.touch()
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    trained = [name for o in outs for name in o["trained"]]
    assert sorted(trained) == sorted(NAMES)  # each run once, by one of the two
    assert all(o["trained"] for o in outs)  # and both did work
    for name in NAMES:
        assert len((tmp_path / "w" / name / "trained_by").read_text().split()) == 1
    rows = read_csv(tmp_path / "w" / "results.csv")
    assert {r["status"] for r in rows.values()} == {"done"}
