"""The optimizer of the recipe (spec/shapes_and_recipe.md): AdamW, warmup + cosine
schedule, clipping.  The chain is spelled out rather than ``optax.adamw`` so a
family's depth rule (``LearningRateRule``) can scale each leaf's whole step,
decay included, and Adam's epsilon; without one it is exactly
``clip_by_global_norm + optax.adamw`` (tested)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from depthbench.errors import ConfigError
from depthbench.model.residual.protocol.capabilities import LearningRateRule


def warmup_cosine(peak: float, steps: int, warmup_fraction: float = 0.1,
                  final_fraction: float = 0.1) -> Callable[[jax.Array], jax.Array]:
    """lr(s) for update s = 0 .. steps-1 (the update that completes step s+1).

    Linear from 0 at s = 0 to ``peak`` at s = W = round(warmup_fraction *
    steps), then ``final + (peak - final) * (1 + cos(pi * (s - W) / (steps - W))) / 2``
    with ``final = final_fraction * peak``, reaching ``final`` at s = steps.
    """
    final = final_fraction * peak
    return _warmup_then(peak, steps, warmup_fraction,
                        lambda frac: final + (peak - final) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))


def warmup_linear(peak: float, steps: int, warmup_fraction: float = 0.03,
                  final_fraction: float = 0.0) -> Callable[[jax.Array], jax.Array]:
    """lr(s) for update s = 0 .. steps-1: linear from 0 to ``peak`` over W =
    round(warmup_fraction * steps) updates (as :func:`warmup_cosine` rounds it),
    then linear from ``peak`` to ``final = final_fraction * peak`` at s = steps
    (transformers' ``get_linear_schedule_with_warmup`` when ``final`` is 0)."""
    final = final_fraction * peak
    return _warmup_then(peak, steps, warmup_fraction, lambda frac: peak + (final - peak) * frac)


def _warmup_then(peak: float, steps: int, warmup_fraction: float,
                 decay: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """Linear warm-up from 0 to ``peak`` over W = round(warmup_fraction * steps)
    updates, then ``decay(frac)`` with ``frac`` going 0 -> 1 from s = W to s = steps."""
    warmup = int(round(warmup_fraction * steps))
    span = max(steps - warmup, 1)

    def schedule(step):
        s = jnp.asarray(step, jnp.float32)
        warm = peak * s / max(warmup, 1)
        frac = jnp.clip((s - warmup) / span, 0.0, 1.0)
        return jnp.where(s < warmup, warm, decay(frac))

    return schedule


SCHEDULES = {"cosine": warmup_cosine, "linear": warmup_linear}  # train.schedule


def schedule_from_config(config) -> Callable[[jax.Array], jax.Array]:
    t = config.train
    # .get: a spec written before train.schedule existed is a cosine one
    make = SCHEDULES[t.get("schedule", "cosine")]
    return make(float(t.lr), int(t.steps), float(t.warmup_fraction), float(t.final_lr_fraction))


def _leaf_name(path) -> str:
    last = path[-1]
    for attr in ("key", "name", "idx"):
        if hasattr(last, attr):
            return str(getattr(last, attr))
    return str(last)


def _keys(path) -> tuple[str, ...]:
    return tuple(_leaf_name([k]) for k in path)


# train.no_decay presets: the set of parameters that take no weight decay.
#   recipe                     the original benchmark's (spec/shapes_and_recipe.md): every
#                              weight decays except what a family exempts (hc/mhc static
#                              routing: A0, beta0, b_pre, b_post, B_res);
#   norms_embeddings_residual  the common alternative (GPT-NeoX, OLMo 2 style): no decay on
#                              norm gains, the input embedding, and every residual-family
#                              parameter (routing, depth queries, family norms, moda's
#                              depth K/V projection); attention/MLP matrices and the LM
#                              head still decay.
NO_DECAY_SETS = ("recipe", "norms_embeddings_residual")


def _tokens(config) -> list[str]:
    return [n.strip() for n in str(config.train.no_decay).split(",") if n.strip()]


def decay_mask(params: Any, no_decay: Iterable[str] = (),
               exempt: Callable[[tuple[str, ...]], bool] | None = None) -> Any:
    """True for every leaf that takes weight decay: all of them except leaves
    whose name (last key) is in ``no_decay`` or whose key path ``exempt`` accepts."""
    names = frozenset(no_decay)

    def decays(path, _):
        keys = _keys(path)
        return keys[-1] not in names and not (exempt is not None and exempt(keys))

    return jax.tree_util.tree_map_with_path(decays, params)


def no_decay_names(config, family) -> frozenset[str]:
    """The family's exemptions (the recipe's) plus any leaf names ``train.no_decay``
    lists beside its preset (``"recipe,scale"``: the recipe and the final norm)."""
    extra = {n for n in _tokens(config) if n not in NO_DECAY_SETS}
    return frozenset(family.no_decay) | extra


def no_decay_paths(config) -> Callable[[tuple[str, ...]], bool] | None:
    """The path rule of the ``norms_embeddings_residual`` preset, or None (recipe)."""
    if "norms_embeddings_residual" not in _tokens(config):
        return None
    from depthbench.model.transformer import EMBEDDING_PARAMS, FAMILY_SCOPE, NORM_PARAMS

    def exempt(keys: tuple[str, ...]) -> bool:
        return (FAMILY_SCOPE in keys or keys[-1] in NORM_PARAMS
                or (len(keys) == 1 and keys[0] in EMBEDDING_PARAMS))

    return exempt


def lr_rule(config, family) -> LearningRateRule | None:
    """The family's learning-rate rule when ``train.lr_rule = "family"``, else
    None; a family that declares none cannot run it (one ConfigError line)."""
    rule = config.train.lr_rule
    if rule == "none":
        return None
    if not isinstance(family, LearningRateRule):
        raise ConfigError(f"config.train.lr_rule: {rule!r} needs a family with a learning-rate "
                          f"rule; model.family {family.name!r} defines none (use 'none')")
    return family


def lr_multipliers(config, family, params: Any) -> Any | None:
    """Per-leaf learning-rate multipliers from the family's rule (a tree of floats
    matching ``params``), or None without one."""
    rule = lr_rule(config, family)
    if rule is None:
        return None
    mults = rule.lr_multipliers(params)
    if jax.tree.structure(mults) != jax.tree.structure(params):
        raise ValueError(f"{family.name}.lr_multipliers returned a tree that does not match the "
                         f"parameters")
    return mults


def adam_eps(config, family, params: Any) -> float | Any:
    """``train.eps``, times the family's per-leaf ``eps_multipliers`` under its
    rule (CompleteP: ``(L / L_base)^(-alpha)`` on the block parameters): one
    float when every leaf has the same, else a tree of floats like ``params``."""
    eps = float(config.train.eps)
    rule = lr_rule(config, family)
    if rule is None:
        return eps
    mults = rule.eps_multipliers(params)
    if jax.tree.structure(mults) != jax.tree.structure(params):
        raise ValueError(f"{family.name}.eps_multipliers returned a tree that does not match "
                         "the parameters")
    factors = set(jax.tree.leaves(mults))
    if len(factors) == 1:
        return eps * float(factors.pop())
    return jax.tree.map(lambda m: eps * float(m), mults)


def scale_by_adam(b1: float, b2: float, eps: float | Any) -> optax.GradientTransformation:
    """``optax.scale_by_adam``, with ``eps`` one float or a tree of per-leaf floats
    (the same state, ``optax.ScaleByAdamState``, either way)."""
    if isinstance(eps, (int, float)):
        return optax.scale_by_adam(b1=b1, b2=b2, eps=float(eps))
    plain = optax.scale_by_adam(b1=b1, b2=b2)

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, b1, 1)
        nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
        count = optax.safe_increment(state.count)
        mu_hat = optax.tree.bias_correction(mu, b1, count)
        nu_hat = optax.tree.bias_correction(nu, b2, count)
        out = jax.tree.map(lambda m, v, e: m / (jnp.sqrt(v) + jnp.asarray(e, m.dtype)),
                           mu_hat, nu_hat, eps)
        return out, optax.ScaleByAdamState(count=count, mu=mu,
                                           nu=optax.tree.cast_like(nu, state.nu))

    return optax.GradientTransformation(plain.init, update)


def scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    """Multiply each update leaf by a fixed (static) float."""

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda u, m: u * jnp.asarray(m, u.dtype), updates, multipliers), state

    return optax.GradientTransformation(init, update)


def adamw(schedule: Callable, *, b1: float = 0.9, b2: float = 0.95, eps: float | Any = 1e-8,
          weight_decay: float = 0.1, clip_norm: float = 1.0, mask: Any = None,
          multipliers: Any = None) -> optax.GradientTransformation:
    """clip -> Adam moments -> decoupled decay (masked) -> per-leaf lr -> -lr(step);
    ``eps``: one float, or a tree of per-leaf floats (:func:`adam_eps`)."""
    parts = [optax.clip_by_global_norm(clip_norm), scale_by_adam(b1, b2, eps)]
    if weight_decay:
        parts.append(optax.add_decayed_weights(weight_decay, mask))
    if multipliers is not None:
        parts.append(scale_by_tree(multipliers))
    parts.append(optax.scale_by_learning_rate(schedule))
    return optax.chain(*parts)


def from_config(config, family, params: Any) -> tuple[optax.GradientTransformation, Callable]:
    """The optimizer and its schedule for a run (``params``: concrete or abstract)."""
    t = config.train
    schedule = schedule_from_config(config)
    names = {_keys(path)[-1] for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    unknown = sorted(n for n in _tokens(config) if n not in NO_DECAY_SETS and n not in names)
    if unknown:
        raise ConfigError(f"config.train.no_decay: {', '.join(unknown)} is neither a preset "
                          f"({', '.join(NO_DECAY_SETS)}) nor a parameter of this model")
    tx = adamw(schedule, b1=float(t.b1), b2=float(t.b2), eps=adam_eps(config, family, params),
               weight_decay=float(t.weight_decay), clip_norm=float(t.clip_norm),
               mask=decay_mask(params, no_decay_names(config, family), no_decay_paths(config)),
               multipliers=lr_multipliers(config, family, params))
    return tx, schedule
