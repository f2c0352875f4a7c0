"""What hc and mhc share: ``n`` residual streams and how they are read out.

The state is ``H_nbtd``: ``n`` streams (logical axis 'activation_streams'),
each initialised to the embedding output.  Both families divide the init
std of the attention output projection and the MLP down-projection by
``sqrt(n)`` (the sublayer output is written into ``n`` streams that are
summed at the readout), and read out with ``config.model.residual.readout``:

* ``sum_then_norm``: ``N_out(sum_s H[s])`` (the HC paper's form, and the
  original benchmark's final hc and PyTorch mHC: ``model.py@8cc2fd74`` and
  ``@d15e34b`` collapse the streams before the head's norm, its test
  ``test_hc_collapses_streams_before_final_norm``);
* ``norm_then_sum``: ``sum_s N_out(H[s])`` (the original's earlier hc and
  PyTorch mHC: ``model.py@dc75a4e`` to ``@5152cab`` and ``@b2141085``, each
  stream through the head's norm, then summed);
* ``mean_then_norm``: ``N_out(mean_s H[s])`` (the original's Liger mHC, its
  ``collapse = "auto"`` for ``liger_mhc`` in every version: docs/liger_mhc.md@2d16225;
  equal to ``sum_then_norm`` up to the norm's eps).

hc defaults to ``sum_then_norm``, mhc to ``mean_then_norm``, as the original's
final code computes them; all three are variants of both families
(``hc+norm_then_sum``): ``norm_then_sum`` makes the initial logits ``n`` times
pre_ln's, the others equal pre_ln's at init.

The logit lens (analysis option ``lens_rule``) decodes a boundary's streams
as the original's analysis does by default, ``reduce_then_norm``:
``N_out(reduce_s H[s])``, the streams reduced with the model's own stream
reduction (the mean under ``mean_then_norm``, else the sum) before the final
norm (``analysis/depth_probes.py@f807aa2``, ``forward_readout_states``);
``readout`` decodes them with the model's own readout, depthbench's earlier
definition (the lens after the last block is then exactly the model's output).

Sums over streams run in fp32.  The families define the routing (``read``,
``write``) and their parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import ClassVar

import jax
import jax.numpy as jnp

from depthbench.model.residual.protocol.base import ResidualFamily, axis_sum, with_axes
from depthbench.model.residual.protocol.capabilities import (
    AnalysisOptions,
    AnalysisProbes,
    CostTerms,
    Variants,
)
from depthbench.model.residual.protocol.family_config import (
    FamilyConfig,
    check_choice,
    check_number,
)
from depthbench.model.residual.protocol.original_format import Choice, Fields, OriginalFormat

READOUTS = ("norm_then_sum", "sum_then_norm", "mean_then_norm")
NBTD = ("activation_streams", "activation_batch", "activation_length", "activation_embed")


def stream_sum(x_s: jax.Array) -> jax.Array:
    """``sum_s x[s]`` over the leading (stream) axis, as a chain of adds
    (:func:`~depthbench.model.residual.protocol.base.axis_sum`)."""
    return axis_sum(x_s, 0)[0]


def _sum_terms(terms: list[jax.Array]) -> jax.Array:
    return functools.reduce(operator.add, terms)


def _dot_d(a_btd: jax.Array, b_btd: jax.Array) -> jax.Array:
    """``sum_d a * b``: ``[B, T, d] x [B, T, d] -> [B, T]``."""
    return jnp.sum(a_btd * b_btd, axis=-1)


@jax.custom_vjp
def _mix(c_sbtu: jax.Array, h_sbtd: jax.Array) -> jax.Array:
    n, m = h_sbtd.shape[0], c_sbtu.shape[-1]
    return jnp.stack([_sum_terms([c_sbtu[s, ..., u, None] * h_sbtd[s] for s in range(n)])
                      for u in range(m)])


def _mix_fwd(c_sbtu, h_sbtd):
    return _mix(c_sbtu, h_sbtd), (c_sbtu, h_sbtd)


def _mix_bwd(res, g_ubtd):
    c_sbtu, h_sbtd = res
    n, m = h_sbtd.shape[0], c_sbtu.shape[-1]
    dh = jnp.stack([_sum_terms([c_sbtu[s, ..., u, None] * g_ubtd[u] for u in range(m)])
                    for s in range(n)])
    if m == 1:  # the read: n reductions (one of the broadcast product took 6x as long)
        return jnp.stack([_dot_d(h_sbtd[s], g_ubtd[0]) for s in range(n)])[..., None], dh
    # The write's n m products reduced over the feature axis in one op: n m
    # reductions of their own took twice as long (bench/results/depth_memory.md,
    # "the deep-narrow step").
    return jnp.moveaxis(jnp.sum(h_sbtd[:, None] * g_ubtd[None], axis=-1), 1, -1), dh


_mix.defvjp(_mix_fwd, _mix_bwd)


def mix_streams(c_sbtu: jax.Array, h_sbtd: jax.Array) -> jax.Array:
    """``out[u] = sum_s c[s, ..., u] * h[s]`` in fp32: ``[n, B, T, m] x [n, B, T, d]
    -> [m, B, T, d]``.

    Written as sums of ``n`` broadcast products (``n`` is small and static)
    rather than an einsum: as a contraction it would lower to a batched
    matmul of ``B*T`` tiny ``d x n`` by ``n x m`` products, while this stays
    one fused elementwise pass over the streams.  Its backward is written out
    too: ``dh[s] = sum_u c[s, u] g[u]`` as a chain over ``u`` and ``dc[s, u] =
    sum_d h[s] g[u]`` as reductions over the feature axis (``n`` of them for
    one output, else one over the ``n m`` products); autodiff of
    the forward reduced over the stream axes instead (see :func:`stream_sum`),
    several times slower on CPU (bench/results/code_notes.md; the steps it
    bought: bench/results/cpu_step.md, "Stream mixes")."""
    return _mix(c_sbtu.astype(jnp.float32), h_sbtd.astype(jnp.float32))


@jax.custom_vjp
def _add_weighted(base_ubtd: jax.Array, w_ubt: jax.Array, y_btd: jax.Array) -> jax.Array:
    return jnp.stack([base_ubtd[u] + w_ubt[u, ..., None] * y_btd
                      for u in range(base_ubtd.shape[0])])


def _add_weighted_fwd(base_ubtd, w_ubt, y_btd):
    return _add_weighted(base_ubtd, w_ubt, y_btd), (w_ubt, y_btd)


def _add_weighted_bwd(res, g_ubtd):
    w_ubt, y_btd = res
    m = w_ubt.shape[0]
    dw = jnp.stack([_dot_d(g_ubtd[u], y_btd) for u in range(m)])
    dy = _sum_terms([w_ubt[u, ..., None] * g_ubtd[u] for u in range(m)])
    return g_ubtd, dw, dy


_add_weighted.defvjp(_add_weighted_fwd, _add_weighted_bwd)


def add_weighted(base_ubtd: jax.Array, w_ubt: jax.Array, y_btd: jax.Array) -> jax.Array:
    """``base[u] + w[u] * y`` (fp32), the post-mix that writes a sublayer output;
    its backward sums over ``u`` as a chain, like :func:`mix_streams`'s."""
    f32 = jnp.float32
    return _add_weighted(base_ubtd.astype(f32), w_ubt.astype(f32), y_btd.astype(f32))


def coefficients(aux: dict) -> tuple | None:
    """The routing coefficients a stream family's read computed and passed to its
    write in ``ctx`` (None where the write is called without them: it computes
    its own).  Passed rather than recomputed: XLA computes them once either way,
    but autodiff ran the backward of their projection once per use, the step's
    largest routing cost after the mixes (bench/results/depth_memory.md, "the
    deep-narrow step")."""
    return aux.get("ctx", {}).get("coefficients")


@dataclasses.dataclass(frozen=True)
class StreamConfig(FamilyConfig, Variants):
    """The fields hc and mhc share."""

    hc_n: int = 4  # expansion: the number of streams
    hc_scale_init: float = 0.01  # hc: s_a, s_b; mhc: a_pre, a_post, a_res
    readout: str = "sum_then_norm"  # "sum_then_norm" | "norm_then_sum" | "mean_then_norm"

    variants = {mode: {"readout": mode} for mode in READOUTS}

    def validate(self, config) -> None:
        check_number("hc_n", self.hc_n, 1, 64, integer=True, meaning="number of streams")
        check_number("hc_scale_init", self.hc_scale_init, -math.inf,
                     meaning="initial routing gate")
        check_choice("readout", self.readout, READOUTS)


@dataclasses.dataclass(frozen=True)
class StreamFamily(ResidualFamily, CostTerms, AnalysisProbes, AnalysisOptions, OriginalFormat):
    """Base of hc and mhc: ``n`` streams, ``1/sqrt(n)`` output init, stream readout."""

    # The original's blocks name their connectors' settings in hyper_connections
    # (config.py@6bdf2ad HyperConnectionsConfig) and register each wrapped sublayer
    # again inside its connector (...hyper_connection.branch.*: aliases).
    original_fields = {"hyper_connections": (None,)}
    original_ignored = (".branch.",)
    original_options = {"hc_form": (
        ("auto", "final", "early"), "auto",
        "hc and PyTorch mHC checkpoints: the original's final form (mixed write, streams "
        "summed before the head's norm) or its early one (residual write, each stream normed; "
        "5152cab and before); auto (default) reads it from config.json and says when it had to "
        "choose")}
    original_kinds: ClassVar[tuple[str, ...]] = ()  # hyper_connections.kind values

    @classmethod
    def original_claims(cls, block):
        """Its block type, or (before the original registered the block types) a
        ``default`` block carrying its kind of ``hyper_connections``."""
        name, hyper = block.get("name") or "default", block.get("hyper_connections")
        if name == "default" and isinstance(hyper, dict):
            return (hyper.get("kind") or "hc") in cls.original_kinds
        return name in cls.original_blocks

    Config = StreamConfig
    # The first value is the original benchmark's (docs/spec/analysis.md "Options").
    analysis_options = {"lens_rule": ("reduce_then_norm", "readout")}
    sharding_rules = (
        ("streams", None),  # the stream index of routing parameters
        ("routing", None),  # routing coefficients (n + 1 or n^2 + 2n columns)
        ("activation_streams", None),  # the n streams of the state
    )

    @property
    def n(self) -> int:
        return int(self.cfg.hc_n)

    @property
    def readout_mode(self) -> str:
        return str(self.cfg.readout)

    def init_scale(self, matrix: str) -> float:
        return 1.0 / math.sqrt(self.n) if matrix in ("o", "down") else 1.0

    def init_state(self, g, x0):
        h = jnp.broadcast_to(x0[None], (self.n, *x0.shape))
        return with_axes(h, NBTD)

    def reduce_streams(self, state) -> jax.Array:
        """The streams as one vector per token, as the readout reduces them
        (fp32 sum; the mean under ``mean_then_norm``), in the state's dtype."""
        total = stream_sum(state.astype(jnp.float32))
        if self.readout_mode == "mean_then_norm":
            total = total / self.n
        return total.astype(state.dtype)

    def readout(self, g, state, final_norm):
        if self.readout_mode == "norm_then_sum":
            return stream_sum(final_norm(state).astype(jnp.float32)).astype(state.dtype)
        return final_norm(self.reduce_streams(state))

    def lens_decode(self, g, r, final_norm):
        """``N_out(reduce_s H[s])`` (``lens_rule = "reduce_then_norm"``, the
        original's), or the model's readout (``"readout"``)."""
        if self.option("lens_rule") == "readout":
            return self.readout(g, r, final_norm)
        return final_norm(self.reduce_streams(r))

    # ------------------------------------------------------------ analysis probes
    def boundary_state(self, p, g, state):
        """The ``n`` streams concatenated: ``[B, T, n*d]`` (stream-major)."""
        n, b, t, d = state.shape
        return jnp.moveaxis(state, 0, 2).reshape(b, t, n * d)

    def with_boundary_state(self, state, z):
        """The streams from their concatenation (inverse of :meth:`boundary_state`)."""
        n, b, t, d = state.shape
        return jnp.moveaxis(z.reshape(b, t, n, d), 2, 0).astype(state.dtype)

    # ------------------------------------------------------------ costs
    def state_floats_per_token(self) -> int:
        """``n`` streams of ``d``."""
        return self.n * self.spec.d_model

    def describe(self) -> dict:
        return {**super().describe(), "n": self.n, "readout": self.readout_mode}


# ----------------------------------------------------------------- the original's format

# Each block's two connectors in the original's modules, and their index on
# depthbench's connector axis.
CONNECTORS = (("attention_hyper_connection", 0), ("feed_forward_hyper_connection", 1))
FORMS = ("final", "early")


def hc_form(block: dict, kind: str, asked: str = "auto") -> Choice:
    """Which of the original's two forms of HC and PyTorch mHC a checkpoint has
    (docs/ORIGINAL.md): ``final``, the mixed write rule and the streams summed
    before the head's norm (hyper_connections.py and model.py@8cc2fd74 on), or
    ``early``, the residual write rule and each stream through the head's norm
    (@dc75a4e to @5152cab; mHC's write rule did not change, only its readout),
    from its ``model.block`` (OLMo-core's config saver leaves out fields whose
    value is None), or the one ``asked`` (the import's ``hc_form``).  The
    fields of each era (config.py's versions, read in the original's history):

    * HC on a ``default`` block: config.py before @5152cab: early;
    * ``moda_skip_ffn_kv`` saved: config.py@8cc2fd74 (MoDA's merge) or later: final;
    * ``hyper_connections.tanh`` saved for kind ``hc``: ``tanh: bool = True`` was
      always saved up to @5152cab (and @b2141085); from @2a9d668 it is None
      unless set, and the HC launcher never sets it: early;
    * ``tanh = true`` for kind ``mhc``: mHC's tanh default before @2a9d668: early;
    * anything else: checkpoints of @5152cab and of @2a9d668 to @8cc2fd74 save
      the same fields: the final form, said to be a choice."""
    hyper = block.get("hyper_connections") or {}

    def form(value: str, certain: bool, why: str) -> Choice:
        return Choice(value, certain, why, "hc_form", FORMS)

    if asked != "auto":
        return form(asked, True, f"asked for with --hc-form {asked}")
    if (block.get("name") or "default") == "default":
        return form("early", True, "HC on a 'default' block: config.py before @5152cab, "
                    "residual write rule, each stream through the head's norm")
    if "moda_skip_ffn_kv" in block:
        return form("final", True, "model.block saves moda_skip_ffn_kv: config.py@8cc2fd74 "
                    "or later, mixed write rule, streams summed before the head's norm")
    if kind == "hc" and "tanh" in hyper:
        return form("early", False, "hyper_connections.tanh is saved, as config.py saved it "
                    "up to @5152cab (the HC launcher never sets it later)")
    if kind == "mhc" and hyper.get("tanh") is True:
        return form("early", False, "hyper_connections.tanh is true, mHC's default before "
                    "config.py@2a9d668")
    return form("final", False, "config.json saves the same fields at @5152cab (early form) "
                "and @2a9d668 to @8cc2fd74 (final form); chose the original's final code")


def read_hyper_connections(block: Fields, kinds: tuple[str, ...], options) -> tuple[
        Fields, str, Choice | None, dict]:
    """``(hyper_connections, kind, form, fields)``: the settings the original's HC
    and mHC connectors share, as depthbench's fields (``form``: None for Liger's
    mHC, whose one form every version computes)."""
    hc = block.sub_or_empty("hyper_connections")
    kind = hc.choice("kind", ("hc", "mhc", "liger_mhc"), kinds[0])
    name = block.opt("name") or "default"
    hc.must(kind in kinds, f"kind {kind!r} does not fit block type {name!r}")
    collapse = hc.choice("collapse", ("auto", "sum", "mean"), "auto")
    form = None if kind == "liger_mhc" else hc_form(block.data, kind, options.get("hc_form",
                                                                                  "auto"))
    mean = collapse == "mean" or (collapse == "auto" and kind == "liger_mhc")
    early = form is not None and form.value == "early"
    readout = "mean_then_norm" if mean else ("norm_then_sum" if early else "sum_then_norm")
    tanh = hc.opt("tanh")
    fields = {"hc_n": hc.int("num_residual_streams", default=4),
              "hc_scale_init": hc.num("gating_factor_init", 0.01), "readout": readout,
              "tanh": (kind == "hc") if tanh is None else bool(tanh)}
    return hc, kind, form, fields


def hyper_block(name: str, early: bool, hyper: dict) -> dict:
    """A block config of the original's form (``early`` or final) for export:
    the final form saves ``moda_skip_ffn_kv`` as config.py@8cc2fd74 does, so
    that reading it back is certain."""
    block = {"name": name, "hyper_connections": hyper}
    return block if early else {**block, "moda_skip_ffn_kv": False}
