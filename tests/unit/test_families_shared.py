"""The residual-protocol contract, checked for every family in the registry.

Parametrised over ``registry.names()``, so a family added to the registry is
tested here without touching this file.  Each family is initialised once and
compiled once per variant (module-scoped :class:`Harness`): a forward with
explicit ``active``/``ident`` (serves causality, determinism, skip and
permutation), one training step (gradients and the micro training run) and
one unrolled, remat-free forward.  The sharded check runs every family in
one subprocess with a fake 8-device CPU mesh
(tests/integration/test_families_sharded.py).

Everything is compiled at XLA's backend optimisation level 0 (:data:`FAST`):
these tests check the models' math, not LLVM's code generation, and it
halves the compile time that dominates this file.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from depthbench.config import base_config
from depthbench.model.layers import RMSNorm
from depthbench.model.residual.protocol import registry
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, cross_entropy, family_of, permute_blocks
from depthbench.shapes import Shape, rule_d_ff

try:  # costs.py is a sibling module; its absence only skips the count check.
    from depthbench import costs
except ImportError:  # pragma: no cover - the module exists in a complete checkout
    costs = None

TINY = Shape(depth=3, d_model=32, d_ff=rule_d_ff(32), n_heads=4, n_kv_heads=4, vocab_size=64)
B, T = 2, 8
FAMILIES = registry.names()
TRAIN_STEPS = 30
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def compile_fast(fn, *example_args):
    """``jax.jit(fn)`` compiled for ``example_args``' shapes with :data:`FAST` options."""
    return jax.jit(fn).lower(*example_args).compile(FAST)


# --------------------------------------------------------------- per family


class _Globals(nn.Module):
    """The family's global parameters, in the scope the backbone uses ('residual')."""

    fam: object

    @nn.compact
    def __call__(self):
        return self.fam.create_global_params(self)


class _SkipAllReference(nn.Module):
    """What a model with every block skipped must compute: the readout of the
    initial state, through the same embedding, final norm and head."""

    spec: ModelSpec

    @nn.compact
    def __call__(self, tokens_bt):
        s, fam = self.spec, family_of(self.spec)
        embed = self.param("embed", nn.initializers.zeros, (s.vocab_size, s.d_model))
        g = _Globals(fam, name="residual")()
        x0 = jnp.take(embed, tokens_bt, axis=0).astype(s.dtype)
        x = fam.readout(g, fam.init_state(g, x0), RMSNorm(s, name="final_norm"))
        head = self.param("head", nn.initializers.zeros, (s.d_model, s.vocab_size))
        return jnp.einsum("btd,dv->btv", x.astype(s.dtype), head.astype(s.dtype)).astype(
            jnp.float32)


def _train_batch() -> np.ndarray:
    """Two random period-4 sequences: memorisable and predictable in context."""
    pattern = np.random.default_rng(0).integers(0, TINY.vocab_size, (B, 4))
    return np.tile(pattern, (1, 3))[:, : T + 1].astype(np.int32)


class Harness:
    """One family: its spec, initial parameters and compiled functions."""

    def __init__(self, family: str):
        self.family = family
        self.spec = ModelSpec.from_shape(TINY, family=family)
        self.model = Transformer(self.spec)
        # Host (numpy) arrays: the checks index, compare and reduce them without
        # compiling an XLA program per eager op and shape.
        self.tokens = np.asarray(jax.random.randint(jax.random.key(7), (B, T), 0,
                                                    TINY.vocab_size))
        self.init = compile_fast(self.model.init, jax.random.key(0), self.tokens)
        self.params = nn.unbox(self.init(jax.random.key(0), self.tokens)["params"])
        self.ones = np.ones((TINY.depth,), bool)
        self.arange = np.arange(TINY.depth, dtype=np.int32)
        model = self.model
        self._fwd = compile_fast(
            lambda p, t, active, ident: model.apply({"params": p}, t, active=active,
                                                    ident=ident)[0],
            self.params, self.tokens, self.ones, self.arange)

    def logits(self, params=None, tokens=None, active=None, ident=None) -> np.ndarray:
        return np.asarray(self._fwd(self.params if params is None else params,
                                    self.tokens if tokens is None else tokens,
                                    self.ones if active is None else np.asarray(active, bool),
                                    self.arange if ident is None else np.asarray(ident, np.int32)))

    @functools.cached_property
    def default(self):
        return self.logits()

    @functools.cached_property
    def training(self):
        """Thirty AdamW steps on a fixed batch: (losses, first-step gradients)."""
        model, opt = self.model, optax.adamw(1e-2, weight_decay=0.0)
        batch = jnp.asarray(_train_batch())

        def loss_fn(p):
            return cross_entropy(model.apply({"params": p}, batch[:, :-1])[0], batch[:, 1:])

        def train_step(p, s):
            loss, grads = jax.value_and_grad(loss_fn)(p)
            updates, s = opt.update(grads, s, p)
            return optax.apply_updates(p, updates), s, loss, grads

        params, state, losses, first = self.params, opt.init(self.params), [], None
        step = compile_fast(train_step, params, state)
        for _ in range(TRAIN_STEPS):
            params, state, loss, grads = step(params, state)
            losses.append(float(loss))
            first = grads if first is None else first
        return np.array(losses), jax.device_get(first)


@pytest.fixture(scope="module", params=FAMILIES)
def h(request) -> Harness:
    return Harness(request.param)


def _max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# --------------------------------------------------------------- the tests


def test_describe_and_validate(h):
    fam = family_of(h.spec)
    info = fam.describe()
    assert info["name"] == h.family and info["description"] and info["reference"]
    fam.cfg.validate(base_config())  # the defaults are valid for every family


def test_shapes_finite_and_near_uniform_at_init(h):
    logits = h.default
    assert logits.shape == (B, T, TINY.vocab_size) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    # Std-0.02 weights: every family starts close to the uniform prediction.
    loss = float(cross_entropy(logits[:, :-1], h.tokens[:, 1:]))
    assert abs(loss - np.log(TINY.vocab_size)) < 0.25, loss


def test_causal(h):
    t = 4
    later = h.tokens.copy()
    later[:, t + 1:] = (h.tokens[:, t + 1:] + 11) % TINY.vocab_size
    out = h.logits(tokens=later)
    np.testing.assert_array_equal(out[:, : t + 1], h.default[:, : t + 1])
    assert _max_diff(out[:, t + 1:], h.default[:, t + 1:]) > 0


def test_deterministic_init(h):
    again = nn.unbox(h.init(jax.random.key(0), h.tokens)["params"])
    np.testing.assert_array_equal(h.logits(again), h.default)
    other = nn.unbox(h.init(jax.random.key(1), h.tokens)["params"])
    assert _max_diff(h.logits(other), h.default) > 1e-4


def test_gradients_finite(h):
    _, grads = h.training
    leaves = jax.tree_util.tree_leaves_with_path(grads)
    for path, g in leaves:
        assert np.isfinite(g).all(), jax.tree_util.keystr(path)
    # Every backbone matrix receives gradient (no sublayer is cut off).
    for name in ("q", "k", "v", "o"):
        assert np.abs(grads["blocks"]["attn"][name]).max() > 0, name
    for name in ("gate", "up", "down"):
        assert np.abs(grads["blocks"]["mlp"][name]).max() > 0, name


def test_scan_unrolled_and_remat_agree(h):
    """Rolled scan + remat + explicit all-True ``active`` == unrolled, no remat, default call."""
    variant = h.spec.replace(scan_unroll=TINY.depth, remat_policy="none")
    model = Transformer(variant)
    out = compile_fast(lambda p, t: model.apply({"params": p}, t)[0], h.params, h.tokens)(
        h.params, h.tokens)
    np.testing.assert_allclose(out, h.default, rtol=1e-5, atol=1e-5)


def test_matmuls_saveable_gradients_agree(h):
    """The default CPU policy (matmuls_saveable: matmul outputs and marked values
    kept, the rest recomputed) gives the gradients of the spec's full remat.  The
    layer scan keeps carries, so the policy applies to the banked families too
    (their depth-linear stack recomputes blocks whatever the policy)."""
    _, expected = h.training
    model = Transformer(h.spec.replace(remat_policy="matmuls_saveable", layer_scan="carries"))
    batch = jnp.asarray(_train_batch())

    def loss_fn(p):
        return cross_entropy(model.apply({"params": p}, batch[:, :-1])[0], batch[:, 1:])

    grads = compile_fast(jax.grad(loss_fn), h.params)(h.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 grads, expected)


def test_skip_blocks(h):
    """A skipped block leaves the state unchanged: all skipped == readout(init_state)."""
    L = TINY.depth
    for b in range(L):
        out = h.logits(active=np.arange(L) != b)
        assert np.isfinite(out).all(), b
        assert _max_diff(out, h.default) > 1e-6, f"skipping block {b} changed nothing"
    none_active = h.logits(active=np.zeros(L, bool))
    expected = compile_fast(_SkipAllReference(h.spec).apply, {"params": h.params}, h.tokens)(
        {"params": h.params}, h.tokens)
    np.testing.assert_allclose(none_active, expected, rtol=1e-5, atol=1e-6)


def test_permute_blocks(h):
    """Swapping two different blocks changes the model; swapping two identical ones does not.

    Blocks are identical when they hold the same parameters *and* the same
    identity: constants tied to identity (lns's 1/sqrt(l)) travel with the
    block, so a copy of block 0 placed at position 1 keeps identity 0.
    Block 0 takes part so that position-dependent structure (keel's first
    block, mix_ln's post-LN blocks) stays with the position."""
    swap = np.array([1, 0, 2])
    permute = compile_fast(functools.partial(permute_blocks, family_of(h.spec)), h.params, swap)
    swapped = h.logits(permute(h.params, swap), ident=swap)
    assert np.isfinite(swapped).all()
    assert _max_diff(swapped, h.default) > 1e-6

    copy = np.array([0, 0, 2])  # position 1 runs a copy of block 0, identity included
    twins = permute(h.params, copy)
    before = h.logits(twins, ident=copy)
    after = h.logits(permute(twins, swap), ident=copy[swap])
    np.testing.assert_array_equal(after, before)
    # The copy really replaced block 1.
    assert _max_diff(before, h.default) > 1e-6


@pytest.mark.skipif(costs is None, reason="depthbench.costs is not present")
def test_param_count_matches_costs(h):
    counted = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(h.params))
    assert counted == costs.param_count(h.spec)


def test_micro_training_lowers_loss(h):
    losses, _ = h.training
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < 0.9 * losses[0], (losses[0], losses[-1])
