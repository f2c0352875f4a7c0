"""Where a kernel runs, and the tiling rules of that place.

A :class:`Target` is chosen once per call (static, part of the trace):

* ``tpu``: Mosaic.  A block's last two dims must be multiples of ``(8, 128)``
  or span the whole array, so token tiles are multiples of 8 and the feature
  axis is always taken whole.  The token grid axis is ``parallel`` (megacore).
* ``gpu``: the Pallas GPU backend.  jax 0.10 routes a plain ``pallas_call`` to
  Mosaic GPU by default (``jax_pallas_use_mosaic_gpu``), but Mosaic GPU's
  supported entry point is ``plgpu.kernel`` with explicit warpgroup
  programming and SMEM pipelines, and a ``pallas_call`` lowered there is
  deprecated (jax 0.10.2 warns so).  These kernels are written in the
  blocked-grid model, which is what the Triton backend lowers, so the GPU
  target passes ``pallas.triton.CompilerParams`` explicitly (it runs on sm90),
  whatever the global flag says.  Triton wants every in-kernel array
  dimension a power of two, so tiles are powers of two and odd feature
  widths are zero-padded (kernels normalise by the true width).  If a future
  jax drops the Triton backend, :func:`gpu_lowering` says so in one line.
* ``interpret``: ``pallas_call(interpret=True)`` on CPU (tests, benchmarks).
  It follows the tiling rules of the backend it emulates (``emulate``), so
  CPU tests exercise the padding paths of both real backends.

Token counts that are not a tile multiple are zero-padded up to one (never a
partial block: Triton and Mosaic would read past the end).  Every kernel
here is written so a zero row contributes exactly nothing to cross-token
sums (its output cotangent is zero), and padded rows are cut off again.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BACKENDS = ("auto", "tpu", "gpu", "interpret", "interpret_gpu")

# Bytes of one token tile's working set the kernels aim at.  TPU: a fraction of
# the 16 MiB default scoped VMEM (inputs are double-buffered and fp32
# temporaries come on top); GPU: what Triton keeps in registers/SMEM per program.
_TILE_BUDGET = {"tpu": 2 << 20, "gpu": 64 << 10}
_MAX_TILE = {"tpu": 512, "gpu": 64}
_MIN_TILE = {"tpu": 8, "gpu": 16}


def gpu_lowering() -> str:
    """The GPU backend these kernels use: ``triton`` when this jax has it."""
    try:
        from jax.experimental.pallas import triton as _pltriton  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the jax build
        raise RuntimeError(
            "pallas_kernels: this jax has no Pallas Triton backend; use backend='interpret' "
            "or impl='xla' on GPU"
        ) from err
    return "triton"


@dataclasses.dataclass(frozen=True)
class Target:
    """A resolved backend: ``kind`` (tpu | gpu) sets the tiling rules, ``interpret``
    whether the kernel is run by the Pallas interpreter instead of compiled."""

    kind: str
    interpret: bool

    @property
    def pow2(self) -> bool:
        """Triton: every array in a kernel has power-of-two dimensions."""
        return self.kind == "gpu"

    def compiler_params(self, grid_rank: int = 1):
        if self.interpret:
            return None
        if self.kind == "tpu":
            from jax.experimental.pallas import tpu as pltpu

            return pltpu.CompilerParams(dimension_semantics=("parallel",) * grid_rank)
        gpu_lowering()
        from jax.experimental.pallas import triton as pltriton

        return pltriton.CompilerParams(num_warps=4, num_stages=2)

    def token_tile(self, n_tokens: int, bytes_per_token: int) -> int:
        """Tokens per grid step: the largest allowed tile within the working-set
        budget, no larger than the (rounded-up) token count."""
        budget = _TILE_BUDGET[self.kind]
        lo, hi = _MIN_TILE[self.kind], _MAX_TILE[self.kind]
        tile = max(lo, min(hi, budget // max(1, bytes_per_token)))
        tile = 1 << (tile.bit_length() - 1)  # a power of two suits both backends
        tile = max(tile, lo)
        while tile > lo and tile // 2 >= n_tokens:
            tile //= 2
        return tile

    def width(self, d: int) -> int:
        """The feature width a kernel works on (Triton: the next power of two)."""
        return pl.next_power_of_2(d) if self.pow2 else d

    def pallas_call(self, kernel, **kwargs):
        return pl.pallas_call(
            kernel,
            interpret=self.interpret,
            compiler_params=self.compiler_params(len(kwargs.get("grid", (1,)))),
            **kwargs,
        )


def lowered_once(entry: jax.custom_vjp):
    """A kernel's differentiable entry (its ``custom_vjp`` function), jitted with
    its ``nondiff_argnums`` static, so that identical calls in one program are
    traced and lowered once.

    A ``pallas_call`` traces its kernel anew at every call and jax lowers each
    call again (the kernel's jaxpr is a new object each time, so jax's lowering
    cache never hits); the interpreter's lowering is the dearest part of a CPU
    step's lowering, and Mosaic's and Triton's are not cheap either.  A model
    calls the same kernel at the same shapes in each sublayer, again for the
    rematerialised forward and again in the backward: hc's train step lowered
    12 kernels, 4 of them distinct.  Behind a jitted entry, jax's trace cache
    hands identical calls the same jaxpr, and its caches of derivatives and of
    lowerings keyed on it do the rest.  The program is the same once XLA inlines
    the calls."""
    return jax.jit(entry, static_argnums=entry.nondiff_argnums)


def resolve(backend: str | Target | None = "auto") -> Target:
    """``auto``: compiled on TPU/GPU, interpreted elsewhere (CPU).  ``interpret``
    emulates the TPU tiling rules, ``interpret_gpu`` the GPU ones."""
    if isinstance(backend, Target):
        return backend
    backend = backend or "auto"
    if backend not in BACKENDS:
        raise ValueError(f"pallas_kernels: backend {backend!r}: allowed {', '.join(BACKENDS)}")
    if backend == "auto":
        platform = jax.default_backend()
        if platform == "tpu":
            return Target("tpu", interpret=False)
        if platform in ("gpu", "cuda", "rocm"):
            return Target("gpu", interpret=False)
        return Target("tpu", interpret=True)
    if backend == "interpret":
        return Target("tpu", interpret=True)
    if backend == "interpret_gpu":
        return Target("gpu", interpret=True)
    return Target(backend, interpret=False)


def pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    """Zero-pad ``axis`` of ``x`` up to ``size`` (no copy when it already fits)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def round_up(n: int, m: int) -> int:
    return math.ceil(n / m) * m


def row_ids(tile: int) -> jax.Array:
    """``[tile, 1]`` int32 column 0 .. tile-1 (used to build one-hot selectors)."""
    return jax.lax.broadcasted_iota(jnp.int32, (tile, 1), 0)


def column(x_tk: jax.Array, k: int) -> jax.Array:
    """Column ``k`` of a ``[tile, K]`` array as ``[tile, 1]``, by a one-hot reduction
    (Triton lowers no static lane slice; Mosaic lowers both)."""
    lanes = jax.lax.broadcasted_iota(jnp.int32, x_tk.shape, 1)
    return jnp.sum(jnp.where(lanes == k, x_tk, 0.0), axis=1, keepdims=True)


def place(cols: list[jax.Array], width: int) -> jax.Array:
    """Inverse of :func:`column`: ``[tile, width]`` with ``cols[k]`` in lane ``k``
    (lanes past ``len(cols)`` zero)."""
    tile = cols[0].shape[0]
    lanes = jax.lax.broadcasted_iota(jnp.int32, (tile, width), 1)
    out = jnp.zeros((tile, width), jnp.float32)
    for k, c in enumerate(cols):
        out = jnp.where(lanes == k, c, out)
    return out
