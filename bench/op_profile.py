"""Where a train step's time goes: the compiled step's ops, timed by ``jax.profiler``,
summed per source operation and per fused-op kind, for families side by side.

    python -m bench.op_profile                                # pre_ln, attnres_full, moda
    python -m bench.op_profile --families pre_ln,moda --seq-len 256 --batch 2

Each op the trace times (an XLA thunk: a fusion, a dot, a loop) is named in the
compiled HLO; its ``op_name`` metadata says which JAX operation it came from
(``transpose(jvp(...))`` marks the backward).  Two tables per family: time per step
summed by that operation's path (the first segments after the layer loop's body)
and by the op's kind (``transpose_copy_fusion``, ``ynn_fusion``, ``dot`` ...).

The sums are the ops' own durations: on XLA:CPU a program of many small ops
spends time between them too, and two ops may overlap on two cores, so the
total is not the wall time (both printed) and a change is judged by the wall
time of ``python -m bench --only families``, not by these sums
(bench/results/depth_memory.md).  They say where to look.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

from bench import common

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?metadata=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
# Path segments that say where an op sits, not what it computes.
_PLACE = {"while", "body", "closed_call", "checkpoint", "rematted_computation", "cond"}


def op_names(hlo_text: str) -> dict[str, tuple[str, str]]:
    """``{instruction: (op_name, shape)}`` of a compiled module's text (the first
    definition of a name wins; instructions without an ``op_name`` are left out)."""
    found: dict[str, tuple[str, str]] = {}
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if m and m.group(1) not in found:
            op = _OP_NAME.search(m.group(3))
            if op:
                found[m.group(1)] = (op.group(1), m.group(2))
    return found


def source_group(op_name: str, depth: int = 3) -> str:
    """``bwd: attn/dot_general`` from an ``op_name``: the pass (``bwd`` under a
    ``transpose(...)``), then the first ``depth`` segments naming an operation:
    the loops, calls, remat scopes and ``jit`` / ``jvp`` / ``transpose``
    wrappers left out."""
    phase = "bwd" if "transpose(" in op_name else "fwd"
    parts = [p for p in op_name.split("/")[1:]
             if p not in _PLACE and not p.startswith(("jit(", "jvp(", "transpose("))]
    return f"{phase}: {'/'.join(parts[:depth]) or '(top level)'}"


def op_kind(instruction: str) -> str:
    """``transpose_copy_fusion`` from ``transpose_copy_fusion.7``."""
    return re.sub(r"\.\d+$", "", instruction)


def _trace_ops(step: common.DepthbenchStep, steps: int) -> tuple[dict[str, float], float]:
    """Seconds per step of each op (by HLO instruction name), and the median wall
    time of as many untraced steps (tracing slows the step)."""
    import jax

    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    with tempfile.TemporaryDirectory() as out:
        with jax.profiler.trace(out, create_perfetto_trace=True):
            for _ in range(steps):
                step()
        trace = next(Path(out).rglob("*.trace.json.gz"))
        events = json.load(gzip.open(trace))["traceEvents"]
    spent: dict[str, float] = collections.Counter()
    for e in events:
        op = e.get("args", {}).get("hlo_op") if e.get("ph") == "X" else None
        if op:
            spent[op] += e["dur"] * 1e-6 / steps
    return spent, wall


def profile(family: str, d_model: int, depth: int, seq_len: int, batch: int, vocab: int,
            steps: int, top: int) -> str:
    step = common.DepthbenchStep(common.config_at(d_model, depth, seq_len, batch, vocab,
                                                  family=family))
    step.compile()
    step()  # one warm step
    names = op_names(step.compiled.as_text())
    spent, wall = _trace_ops(step, steps)
    by_source: dict[str, float] = collections.Counter()
    by_kind: dict[str, float] = collections.Counter()
    calls: dict[str, int] = collections.Counter()
    for op, sec in spent.items():
        known = names.get(op)
        # Some ops (dots XLA:CPU made from a fused einsum) carry no op_name.
        by_source[source_group(known[0]) if known else f"?: (no op_name) {op_kind(op)}"] += sec
        by_kind[op_kind(op)] += sec
        calls[op_kind(op)] += 1
    total = sum(spent.values())
    rows_src = [{"operation": k, "ms / step": 1e3 * v, "share": f"{v / total:.0%}"}
                for k, v in sorted(by_source.items(), key=lambda kv: -kv[1])[:top]]
    rows_kind = [{"op kind": k, "distinct ops": calls[k], "ms / step": 1e3 * v,
                  "share": f"{v / total:.0%}"}
                 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join([
        f"\n{family}: ops {1e3 * total:.1f} ms / step summed ({steps} traced steps averaged), "
        f"wall {1e3 * wall:.1f} ms / step (median of {steps} untraced)",
        common.table(rows_src), "", common.table(rows_kind)])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="pre_ln,attnres_full,moda")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5, help="traced steps (default 5)")
    ap.add_argument("--top", type=int, default=15, help="rows per table (default 15)")
    args = ap.parse_args(argv)
    print(common.header(
        f"op time per step (d {args.d_model}, L {args.depth}, T {args.seq_len}, "
        f"B {args.batch}, V {args.vocab}; the trainer's step, fp32)"))
    for family in args.families.split(","):
        print(profile(family, args.d_model, args.depth, args.seq_len, args.batch, args.vocab,
                      args.steps, args.top), flush=True)


if __name__ == "__main__":
    main()
