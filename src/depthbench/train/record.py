"""A run's bookkeeping: its compute clock, the resolved config it starts with
and the result it ends with (what ``config.json`` and ``result.json`` hold)."""

from __future__ import annotations

from depthbench.rundir.io import finite
from depthbench.rundir.names import CHECKPOINT_DIR


class Clock:
    """Compute time of training steps, excluding each session's first step
    (compilation), so throughput is what the hardware sustains."""

    def __init__(self, seconds: float = 0.0, tokens: int = 0):
        self.seconds, self.tokens = seconds, tokens
        self.mark_seconds, self.mark_tokens = seconds, tokens

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def interval_rate(self) -> float | None:
        """Tokens/s since the previous call."""
        ds, dt = self.seconds - self.mark_seconds, self.tokens - self.mark_tokens
        self.mark_seconds, self.mark_tokens = self.seconds, self.tokens
        return dt / ds if ds > 0 else None


def preempted(step: int, steps: int, workdir) -> dict:
    """The outcome of a run stopped by a signal (no result.json is written)."""
    message = (f"preempted at step {step}; re-run the same command to resume "
               f"(checkpoints in {workdir / CHECKPOINT_DIR})")
    return {"status": "preempted", "step": step, "steps": steps, "message": message,
            "workdir": str(workdir)}


def result(*, spec, config, status: str, step: int, tokens_per_step: int, n_params: int,
           val_loss: float | None, last_loss: float | None, diverged_at: int | None,
           rate: float | None, mfu: float | None, wall_seconds: float,
           flops_per_token: float, device_kind: str, n_devices: int) -> dict:
    """The result.json of a run that finished or diverged."""
    t = config.train
    return {
        "family": spec.family, "depth": spec.depth, "d_model": spec.d_model,
        "d_ff": spec.d_ff, "n_heads": spec.n_heads,
        "aspect_ratio": round(spec.shape.aspect_ratio, 4), "params": n_params,
        "steps": step, "tokens": step * tokens_per_step,
        "final_val_loss": val_loss if status == "finished" else None,
        "final_train_loss": last_loss if finite(last_loss) else None,
        "tokens_per_sec": rate, "mfu": mfu,
        "diverged": status == "diverged", "diverged_at_step": diverged_at,
        "wall_seconds": round(wall_seconds, 3), "status": status,
        "lr": float(t.lr), "batch_size": int(t.batch_size), "seq_len": int(t.seq_len),
        "flops_per_token": flops_per_token, "device_kind": device_kind,
        "n_devices": n_devices, "name": str(config.name),
    }
