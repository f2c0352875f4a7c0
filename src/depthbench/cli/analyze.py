"""`depthbench analyze RUN_DIR`: depth analyses of a trained run (docs/spec/analysis.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """\
examples:
  depthbench analyze runs/quickstart/pre_ln_L10
  depthbench analyze runs/demo --metrics logit_lens,angular_distance --windows 8 --seq-len 64
  depthbench analyze --compare runs/quickstart/*_L10 --metric logit_lens --out lens.png

Options select the original benchmark's definitions (the defaults) or
depthbench's alternatives: --skip-rule remove, --swap-rule block,
--probe-rule readout (attnres), --lens-rule readout (hc, mhc),
--causal-ratio per_token.
"""


def _metrics(text: str | None) -> list[str] | None:
    return [m.strip() for m in text.split(",") if m.strip()] if text else None


def _run(args: argparse.Namespace) -> int:
    from depthbench.config import ConfigError

    if args.compare:
        return _compare(args)
    if not args.run_dir:
        raise ConfigError("RUN_DIR: give a run directory (or --compare DIR ...)")
    from depthbench.analysis.store import analyze_run_dir
    from depthbench.model.residual.protocol import registry

    options = {k: vars(args)[k] for k in registry.analysis_options() if vars(args)[k]}
    result, written = analyze_run_dir(
        args.run_dir, _metrics(args.metrics), windows=args.windows, seq_len=args.seq_len,
        options=options, plots=not args.no_plots, val_tokens=args.val_tokens, chunk=args.chunk,
        window_chunk=args.window_chunk, causal_ratio=args.causal_ratio,
        jacobian_windows=args.jacobian_windows, progress=not args.no_progress)
    print(summary(result))
    for path in written:
        print(f"wrote {path}")
    return 0


def summary(result: dict) -> str:
    """A few headline numbers of one analysis."""
    meta, lines = result["meta"], []
    lines.append(f"{meta['family']} L{meta['depth']} d{meta['d_model']} step {meta['step']}: "
                 f"loss {meta['loss']:.4f} on {meta['windows']} x {meta['seq_len']} tokens "
                 f"({meta['seconds']:.0f}s)")
    if "late_layer_interaction" in result:
        lli = result["late_layer_interaction"]
        lines.append(f"  late-layer interaction: skip {lli['skip_fraction']:.1%}, "
                     f"swap {lli['swap_fraction']:.1%}")
    if "effective_depth" in result:
        ed = result["effective_depth"]
        lines.append(f"  effective depth: {ed['value']} of {meta['depth']} blocks")
    if "depth_weights" in result:
        lines.append(f"  dead segment: {result['depth_weights']['dead_segment']} blocks")
    sd = result.get("stream_diversity", {})
    if "composed_effective_rank_final" in sd:
        lines.append(f"  stream diversity: composed mixing rank "
                     f"{sd['composed_effective_rank_final']:.2f} (mean over depth "
                     f"{sd['composed_effective_rank_mean']:.2f})")
    return "\n".join(lines)


def _compare(args: argparse.Namespace) -> int:
    from depthbench.analysis.plots import COMPARABLE, compare
    from depthbench.analysis.store import read_analysis
    from depthbench.config import ConfigError
    from depthbench.output_paths import output_file

    dirs = [Path(d) for d in ([args.run_dir] if args.run_dir else []) + args.compare]
    if args.metric not in COMPARABLE:
        raise ConfigError(f"--metric: {args.metric!r} not one of {', '.join(COMPARABLE)}")
    out = output_file(args.out or f"compare_{args.metric}.png", "--out")
    results = []
    for d in dirs:
        r = read_analysis(d)
        if r is None:
            raise ConfigError(f"--compare: {d} has no analysis/analysis.json; run "
                              f"`depthbench analyze {d}` first")
        key = "angular_distance" if args.metric == "angular_distance_matrix" else args.metric
        key = "logit_lens" if key == "early_exit_ce" else key
        if key not in r:
            raise ConfigError(f"--compare: {d}'s analysis has no {key!r}; re-run "
                              f"`depthbench analyze {d} --metrics {key}`")
        results.append(r)
    compare(results, args.metric, out)
    if args.json:
        json.dump({str(d): r.get(args.metric) for d, r in zip(dirs, results, strict=True)},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
    print(f"wrote {out}")
    return 0


def register(subparsers) -> None:
    from depthbench.analysis.names import CAUSAL_RATIOS, METRICS
    from depthbench.cli.validators import positive_int
    from depthbench.model.residual.protocol import registry

    parser = subparsers.add_parser(
        "analyze", help="depth analyses of a trained run (angular distance, causal and swap "
        "scores, logit lens, ...)", description=__doc__.split("\n\n")[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="a run directory")
    parser.add_argument("--metrics", help=f"comma-separated subset of: {', '.join(METRICS)}")
    parser.add_argument("--windows", type=positive_int, default=16,
                        help="held-out windows (default 16)")
    parser.add_argument("--seq-len", type=positive_int, default=128,
                        help="tokens per window (128)")
    parser.add_argument("--val-tokens", metavar="FILE",
                        help="held-out tokens (a 1-D token .npy) instead of the run's validation "
                             "split: for an imported run that records none")
    parser.add_argument("--chunk", type=positive_int, default=8,
                        help="interventions (skips, swaps, stand-ins) evaluated at once (8)")
    parser.add_argument("--window-chunk", type=positive_int, default=8,
                        help="windows per forward (8)")
    parser.add_argument("--jacobian-windows", type=positive_int, default=2,
                        help="windows for the block Jacobians (2)")
    parser.add_argument("--causal-ratio", choices=CAUSAL_RATIOS, default=CAUSAL_RATIOS[0])
    for name, values in registry.analysis_options().items():  # the families' own switches
        parser.add_argument(f"--{name.replace('_', '-')}", choices=values, default=None,
                            help=f"default {values[0]} (the original benchmark's)")
    parser.add_argument("--no-plots", action="store_true", help="analysis.json only")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--compare", nargs="+", metavar="DIR", default=None,
                        help="analysed run directories to draw side by side (with --metric)")
    parser.add_argument("--metric", default="logit_lens", help="metric for --compare")
    parser.add_argument("--out", help="PNG for --compare (default compare_METRIC.png)")
    parser.add_argument("--json", action="store_true", help="--compare: also print the values")
    parser.set_defaults(func=_run)
