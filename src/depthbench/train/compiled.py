"""The compiled functions of a run, memoised per model, recipe and devices.

Running the same model and recipe again in one process (a resume, a sweep
retry, the tests) reuses the jitted init, train, eval and layer-statistics
functions instead of compiling them again.
"""

from __future__ import annotations

import json

import jax

from depthbench import config as config_lib
from depthbench import parallel
from depthbench.train import state as state_lib
from depthbench.train import step as step_lib

_COMPILED: dict[str, tuple] = {}
_COMPILED_MAX = 2
# Fields the compiled functions do not depend on (read on the host only).
_HOST_ONLY = ("name", "data.", "eval.", "train.seed", "train.max_loss", "train.keep_checkpoints",
              "train.checkpoint_every", "train.log_every", "train.eval_every",
              "train.layer_stats_every")


def compiled(config) -> tuple:
    """Setup and jitted functions (init, train, eval, layer stats) for
    ``config`` on its mesh, memoised: running the same model and recipe again
    in one process (a resume, a sweep retry, tests) compiles nothing new."""
    fields = {k: v for k, v in config_lib.flatten(config.to_dict()).items()
              if not any(k.startswith(h) for h in _HOST_ONLY)}
    key = json.dumps([fields, [d.id for d in jax.devices()]], sort_keys=True, default=str)
    if key not in _COMPILED:
        while len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        s = state_lib.setup(config, parallel.mesh_from_config(config))
        micro = int(config.train.microbatches)
        _COMPILED[key] = (s, state_lib.make_init(s), step_lib.make_train_step(s, micro),
                          step_lib.make_eval_step(s), step_lib.make_layer_stats(s))
    return _COMPILED[key]
