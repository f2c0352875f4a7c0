"""How the next token is chosen from the logits: greedy, or sampled with a
temperature, optionally from the top-k tokens and/or the top-p nucleus.

Each row draws with ``fold_in(fold_in(key(seed), step), row id)``, so a
prompt's sample depends on the seed, the step and its index only, not on its
batch.  At float32's limits: below :data:`MIN_TEMPERATURE` sampling is greedy,
and the nucleus always keeps the most likely token."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

# float32's smallest normal number: logits over a smaller temperature (or one
# XLA flushes to 0) are no distribution; its limit, greedy, is taken instead.
MIN_TEMPERATURE = 2.0 ** -126


@dataclasses.dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 (or below :data:`MIN_TEMPERATURE`) is greedy (argmax);
    ``top_k`` 0 and ``top_p`` 1 cut nothing."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature: {self.temperature} must be >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k: {self.top_k} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: {self.top_p} must lie in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


GREEDY = Sampling()


def filtered_logits(logits_bv: jax.Array, sampling: Sampling) -> jax.Array:
    """fp32 logits over the temperature, shifted so that the largest is 0 (a tiny
    temperature cannot overflow them), ``-inf`` outside the top-k tokens and
    outside the nucleus: the fewest most likely tokens whose probability
    reaches ``top_p`` (a token is kept while the mass before it is below
    ``top_p``; the most likely one always)."""
    logits = logits_bv.astype(jnp.float32)
    logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / sampling.temperature
    if sampling.top_k:
        k = min(int(sampling.top_k), logits.shape[-1])
        kth_b1 = jax.lax.top_k(logits, k)[0][:, -1:]
        logits = jnp.where(logits < kth_b1, -jnp.inf, logits)
    if sampling.top_p < 1:
        desc_bv = -jnp.sort(-logits, axis=-1)
        probs_bv = jax.nn.softmax(desc_bv, axis=-1)
        before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
        kept_bv = before_bv < sampling.top_p
        # Not kept: the top logit, so the most likely token stays whatever top_p is.
        cutoff_b1 = jnp.min(jnp.where(kept_bv, desc_bv, desc_bv[:, :1]), axis=-1,
                            keepdims=True)
        logits = jnp.where(logits < cutoff_b1, -jnp.inf, logits)
    return logits


def choose(logits_bv: jax.Array, sampling: Sampling, seed: jax.Array, step: jax.Array,
           row_ids_b: jax.Array) -> jax.Array:
    """The next token of each row, ``[B]`` int32 (``seed``, ``step``: integers,
    traced or not)."""
    if sampling.greedy:
        return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
    step_key = jax.random.fold_in(jax.random.key(seed), step)
    keys_b = jax.vmap(lambda r: jax.random.fold_in(step_key, r))(row_ids_b)
    logits = filtered_logits(logits_bv, sampling)
    return jax.vmap(jax.random.categorical)(keys_b, logits).astype(jnp.int32)
