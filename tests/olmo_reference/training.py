"""One training step in each framework, for the parity tests.

:func:`depthbench_step` runs depthbench's own trainer code (``train/state``,
``train/step``) on an imported run; :func:`torch_step` torch's AdamW on the
reference model, with the original's weight-decay groups.  Both: betas
(0.9, 0.95), eps 1e-8, decay 0.1, a constant learning rate, no clipping.
"""

from __future__ import annotations

import numpy as np
import torch

from . import original

# Parameters the original trains without weight decay (its hyper-connections'
# static patterns, config.py@6bdf2ad; Liger's b and gates, created outside the
# decayed groups); depthbench's run exempts the same ones (its family's no_decay).
NO_DECAY = frozenset({"static_alpha", "static_beta", "pre_bias", "post_bias", "residual_bias",
                      "b", "alpha_pre", "alpha_post", "alpha_res"})


def depthbench_step(run, batch_bt: np.ndarray, *, lr: float) -> tuple[float, float]:
    """Loss before and after one AdamW step of depthbench's own trainer code on
    the imported parameters (decay on every weight but the family's no_decay, as
    the recipe)."""
    import jax
    import jax.numpy as jnp

    from depthbench import parallel
    from depthbench.train import state as state_lib
    from depthbench.train import step as step_lib

    config = run.config.copy_and_resolve_references()
    config.train.update(lr=lr, warmup_fraction=0.0, final_lr_fraction=1.0, clip_norm=1e9,
                        steps=10, seq_len=batch_bt.shape[1] - 1)
    s = state_lib.setup(config, parallel.mesh_from_config(config))
    params = jax.device_put(run.params, s.param_shardings)
    with s.context():
        opt_state = jax.jit(s.tx.init, out_shardings=s.state_shardings.opt_state)(params)
    state = state_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                 opt_state=opt_state, rng=state_lib._key_data(0))
    batch = {"inputs": jnp.asarray(batch_bt[:, :-1]), "targets": jnp.asarray(batch_bt[:, 1:])}
    new, metrics = step_lib.make_train_step(s)(state, batch)
    after = step_lib.make_eval_step(s)(new.params, batch)
    return float(metrics["loss"]), float(after)


def torch_step(model, batch_bt: np.ndarray, *, lr: float) -> tuple[float, float]:
    """The same step with torch's AdamW on the reference model (decay 0.1 except
    on the original's no-decay parameters)."""
    batch = torch.as_tensor(batch_bt, dtype=torch.long)
    named = dict(model.named_parameters())  # shared (aliased) parameters once
    exempt = [p for k, p in named.items() if k.rsplit(".", 1)[-1] in NO_DECAY]
    decayed = [p for k, p in named.items() if k.rsplit(".", 1)[-1] not in NO_DECAY]
    opt = torch.optim.AdamW([{"params": decayed}, {"params": exempt, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    before = original.loss(model, batch)
    before.backward()
    opt.step()
    with torch.no_grad():
        after = original.loss(model, batch)
    return float(before.detach()), float(after)
