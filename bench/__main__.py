"""``python -m bench``: every benchmark table, each headed by the machine, its
load, the jax version, the date and any step-time setting in the environment
(``common.STEP_ENV``).

Sections: the PyTorch peer comparison (skipped with a message without torch),
compile time against depth per family, step time and memory per family
relative to pre_ln, throughput and MFU, data-pipeline headroom, inference
(decode latency and KV cache per family and depth, ``bench/inference.py``), and any of
``bench/kernels.py``, ``bench/bench_tokenize.py``, ``bench/depth_memory.py``,
``bench/cpu_dots.py`` (XLA:CPU's dot libraries side by side) present (run as
they are, their output included).

    python -m bench                       # everything
    python -m bench --quick               # fewer steps, fewer families
    python -m bench --only peer,families  # chosen sections
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback

from bench import common

QUICK_FAMILIES = ("pre_ln", "hc", "mhc", "attnres_full", "attnres_block", "moda")
DISCOVERED = ("kernels.py", "bench_tokenize.py", "depth_memory.py", "cpu_dots.py")


def _data(quick: bool) -> str:
    from bench import bench_data

    argv = ["--steps", "5" if quick else "30", "--batches", "300" if quick else "2000"]
    return _capture(lambda: bench_data.main(argv), "data pipeline headroom (bench/bench_data.py)")


def _capture(fn, title: str) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn()
    return f"{common.header(title)}\n{buf.getvalue().rstrip()}"


def _script(name: str) -> str:
    # As a module (`python -m bench.<name>`), so it gets the same host-memory
    # setting as this process (bench/__init__.py) and the header says so.
    proc = subprocess.run([sys.executable, "-m", f"bench.{name.removesuffix('.py')}"],
                          capture_output=True, text=True, cwd=common.ROOT, check=False)
    status = ""
    if proc.returncode != 0:
        status = f"\n(exit status {proc.returncode}: {proc.stderr.strip()[-300:]})"
    return f"{common.header(f'bench/{name}')}\n{proc.stdout.rstrip()}{status}"


def sections(quick: bool) -> dict:
    from bench import inference, peer, suite

    fams = QUICK_FAMILIES if quick else None
    reps = 2 if quick else 5
    # The family ratios are goals (issue 50): medians of 5 even when quick;
    # 2 moved them by 10-40% on the shared 2-core machines.
    family_reps = 5
    found = {n.removesuffix(".py"): (lambda n=n: _script(n))
             for n in DISCOVERED if (common.ROOT / "bench" / n).exists()}
    return {
        "peer": lambda: peer.run(quick),
        "compile": lambda: suite.compile_vs_depth(fams),
        "families": lambda: suite.families_vs_pre_ln(fams, family_reps),
        "throughput": lambda: suite.throughput(reps),
        "data": lambda: _data(quick),
        "inference": lambda: inference.run(
            families=fams, depths=(2, 10) if quick else None, reps=2 if quick else 3,
            plot_path=None if quick else inference.PLOT),
        **found,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and families")
    p.add_argument("--only", default="", help="comma-separated sections (default: all)")
    args = p.parse_args(argv)
    table = sections(args.quick)
    chosen = [s for s in args.only.split(",") if s] or list(table)
    unknown = sorted(set(chosen) - set(table))
    if unknown:
        print(f"--only: unknown section(s) {', '.join(unknown)}; allowed: {', '.join(table)}",
              file=sys.stderr)
        return 2
    failed = 0
    for name in chosen:
        t0 = time.perf_counter()
        try:
            print(table[name](), flush=True)
        except Exception:  # one broken section must not hide the other tables
            failed += 1
            print(f"== {name}: FAILED ==\n{traceback.format_exc(limit=3)}", flush=True)
        print(f"({name}: {time.perf_counter() - t0:.0f} s)\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
