"""What a person watching a run sees: the progress bar and the end-of-run summary."""

from __future__ import annotations

import sys
from pathlib import Path

from depthbench.rundir.names import CHECKPOINT_DIR, METRICS_FILE, RESULT_FILE, TB_DIR


class _NoBar:
    """The progress bar's interface, printing only messages (no bar)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        pass

    def write(self, s: str, file=None) -> None:
        print(s, file=file or sys.stderr, flush=True)

    def close(self) -> None:
        pass


def progress_bar(enabled: bool, start: int, steps: int, spec):
    """A tqdm bar over steps (on stderr): step count, ETA, loss and tokens/s."""
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=steps, initial=start, unit="step", dynamic_ncols=True, file=sys.stderr,
                desc=f"{spec.family} L{spec.depth} d{spec.d_model}")


def postfix(loss: float, val_loss: float | None, rate: float | None) -> str:
    parts = [f"loss {loss:.4f}"]
    if val_loss is not None:
        parts.append(f"val {val_loss:.4f}")
    if rate is not None:
        parts.append(f"{rate:,.0f} tok/s")
    return "  ".join(parts)


def count(n: float) -> str:
    """1183800 -> '1.18M'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def duration(seconds: float) -> str:
    """152.4 -> '2m 32s'."""
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else (f"{m}m {s:02d}s" if m else f"{s}s")


def summary(result: dict, workdir: str | Path) -> str:
    """The one-screen end-of-run summary: an aligned two-column table."""
    r = result
    if r.get("status") == "preempted":
        return r["message"]
    val, train = r.get("final_val_loss"), r.get("final_train_loss")
    status = r.get("status", "?") + (" (already done; not retrained)" if r.get("already_done")
                                     else "")
    rate = r.get("tokens_per_sec")
    rows = [
        ("run", str(workdir)),
        ("status", status),
        ("model", f"{r['family']}  L {r['depth']}  d_model {r['d_model']}  d_ff {r.get('d_ff')}"
                  f"  heads {r.get('n_heads')}  aspect ratio {r.get('aspect_ratio')}"),
        ("parameters", count(r["params"])),
        ("steps", f"{r['steps']}  ({count(r['tokens'])} tokens)"),
        ("final val loss", "-" if val is None else f"{val:.4f}"),
        ("final train loss", "-" if train is None else f"{train:.4f}"),
        ("throughput", "-" if rate is None else
         f"{rate:,.0f} tokens/s on {r.get('n_devices')} x {r.get('device_kind')}"),
        ("MFU", "n/a (unknown device peak)" if r.get("mfu") is None
         else f"{100 * r['mfu']:.1f}%"),
        ("wall time", duration(r["wall_seconds"])),
        ("diverged", f"yes, at step {r['diverged_at_step']}" if r.get("diverged") else "no"),
        ("files", f"{RESULT_FILE}, {METRICS_FILE}, {CHECKPOINT_DIR}/, {TB_DIR}/  "
                  f"(tensorboard --logdir {Path(workdir) / TB_DIR})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
