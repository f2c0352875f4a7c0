"""`depthbench coordcheck`: does the residual stream keep its size across depth and width?"""

from __future__ import annotations

import argparse
import sys

from depthbench.errors import ConfigError
from depthbench.output_paths import output_file

EPILOG = """\
examples:
  depthbench coordcheck
  depthbench coordcheck --families pre_ln,completep,hc+sum_then_norm --json cc.json
  depthbench coordcheck --families all --depths 2,4,8,16 --widths 64 --steps 0
  depthbench coordcheck --config.train.lr=1e-2 --out cc_lr1e-2.png

Every model is the --config spec (default micro: its corpus, batch, sequence
length and peak learning rate) at width d_model = W (--heads heads, d_ff by
the shape rule) and depth L, trained --steps updates at the constant peak
learning rate.  A family with its own learning-rate rule (CompleteP's) trains
with it unless --lr-rule none.  --steps 0 checks the initialisation alone.
The slopes fit log RMS of the final state z_L against log L (one intercept per
width) and against log d (one per depth); "moved" is z_L(t) - z_L(0).
"""


def _ints(text: str, flag: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"{flag}: expected comma-separated positive integers like 2,4,8, "
                          f"got {text!r}")
    return [int(p) for p in parts]


def _families(text: str) -> list[str]:
    from depthbench.model.residual.protocol import registry

    if text.strip() == "all":
        return registry.names()
    return [f.strip() for f in text.split(",") if f.strip()]


def _run(args: argparse.Namespace) -> int:
    from depthbench import config as config_lib
    from depthbench.analysis import coordcheck
    from depthbench.formatting import table
    from depthbench.rundir.io import atomic_write_json, json_safe

    # Both outputs checked before any training (a folder, a missing folder, a link loop).
    json_path = None if args.json is None else output_file(args.json, "--json")
    png = None if args.no_plot else output_file(args.out, "--out")
    base = config_lib.load(args.config, args.overrides)
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    check = coordcheck.run(base, _families(args.families), _ints(args.depths, "--depths"),
                           _ints(args.widths, "--widths"), steps=args.steps, heads=args.heads,
                           lr_rule=args.lr_rule, progress=say)
    print(f"coordinate check: {check.settings['steps']} steps at lr {check.settings['lr']:g}, "
          f"depths {check.settings['depths']}, widths {check.settings['widths']} "
          f"({check.seconds:.0f} s)")
    print(table(list(coordcheck.SLOPE_HEADERS), coordcheck.slope_rows(check), align="ll"))
    if png is not None:
        from depthbench.analysis.coordcheck_plot import draw

        print(f"wrote {draw(check, png)}")
    if json_path is not None:
        atomic_write_json(json_path, json_safe(check.as_dict()))
        print(f"wrote {json_path}")
    return 0


def register(subparsers) -> None:
    from depthbench.analysis import coordcheck

    parser = subparsers.add_parser(
        "coordcheck", help="muP-style coordinate check: residual-stream size across depth and "
        "width (flat means it transfers)", description=__doc__.split("\n\n")[0],
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="micro", metavar="SPEC",
                        help="the spec the models start from (default micro)")
    parser.add_argument("--families", default=",".join(coordcheck.default_families()),
                        help="comma-separated families (variants allowed: hc+sum_then_norm), "
                             "or 'all' (default %(default)s)")
    parser.add_argument("--depths", default=",".join(map(str, coordcheck.DEFAULT_DEPTHS)),
                        help="comma-separated depths (default %(default)s)")
    parser.add_argument("--widths", default=",".join(map(str, coordcheck.DEFAULT_WIDTHS)),
                        help="comma-separated widths d_model (default %(default)s)")
    parser.add_argument("--steps", type=int, default=coordcheck.DEFAULT_STEPS,
                        help="updates k; states are measured after each of 0 .. k "
                             "(default %(default)s)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--lr-rule", choices=coordcheck.LR_RULES, default="auto",
                        help="auto: a family's own learning-rate rule where it has one")
    parser.add_argument("--out", default="coordcheck.png", help="the figure (PNG)")
    parser.add_argument("--no-plot", action="store_true", help="no figure")
    parser.add_argument("--json", metavar="FILE", help="write every number to FILE")
    parser.add_argument("--quiet", action="store_true", help="no per-model progress lines")
    parser.set_defaults(func=_run, accepts_overrides=True)
