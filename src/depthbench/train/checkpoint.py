"""Orbax checkpoints of a run: train state, data-iterator position, run clock.

One ``CheckpointManager`` under ``<workdir>/checkpoints`` keeps the last
``train.keep_checkpoints`` steps.  Each checkpoint is an
``ocp.args.Composite`` of

* ``state``: the :class:`~depthbench.train.state.TrainState` pytree (step,
  parameters, optimizer state, RNG key data), restored straight into the
  run's shardings (so a run may resume on a different mesh);
* ``data``: the grain iterator's position, so a resumed run sees exactly the
  batches it would have seen;
* ``meta``: small JSON (wall/compute seconds so far), so throughput and wall
  time in ``result.json`` cover the whole run, not just its last session.

Saves are asynchronous (the device-to-host copy happens before ``save``
returns, so the next step may donate the state's buffers); :meth:`close`
waits for the last one.  A save interrupted by ``kill -9`` leaves only a
temporary directory, which Orbax ignores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from depthbench.train.state import TrainState


class Checkpoints:
    def __init__(self, directory: str | Path, keep: int = 2, *, async_save: bool = True):
        self.directory = Path(directory).resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=max(1, int(keep)), create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self._saved: int | None = None  # the last step saved by this process (maybe in flight)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: TrainState, data_arg: Any, meta: dict) -> None:
        """Save ``state`` (``data_arg``: the data module's save arg for the iterator;
        None for a run with no data position, e.g. one made by ``import-hf``)."""
        if step == self._saved or step in self.manager.all_steps():
            return  # e.g. a preemption right after a periodic save (perhaps still in flight)
        items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
        if data_arg is not None:
            items["data"] = data_arg
        args = ocp.args.Composite(**items)
        self.manager.save(step, args=args, force=True)
        self._saved = step

    def restore(self, step: int, abstract_state: TrainState, data_arg: Any
                ) -> tuple[TrainState, dict]:
        """The state at ``step`` (laid out as ``abstract_state``'s shardings say),
        the iterator restored in place through ``data_arg``, and the meta dict."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=data_arg,
                                  meta=ocp.args.JsonRestore())
        out = self.manager.restore(step, args=args)
        return out["state"], dict(out["meta"] or {})

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
