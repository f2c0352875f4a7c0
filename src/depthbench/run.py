"""Opening a run directory: the one way every reader does it.

:func:`open_run` reads a run directory into a :class:`RunDir` (config with the
shape complete, spec, tokenizer; no array read); ``RunDir.load`` gives a
:class:`Run`, the model at the newest intact checkpoint on the run's mesh.
:func:`load_run` is ``open_run(d).load()`` (docs/EVAL.md, docs/REPRODUCE.md)."""

from __future__ import annotations

import dataclasses
from functools import cached_property
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import linen as nn

from depthbench import confine, parallel
from depthbench.config import ConfigError
from depthbench.model.residual.protocol import registry
from depthbench.model.residual.protocol.base import ResidualFamily
from depthbench.model.residual.protocol.capabilities import AnalysisOptions
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, params_init, permute_blocks
from depthbench.run_identity import saved_config
from depthbench.rundir import restore
from depthbench.rundir.io import read_json
from depthbench.rundir.names import CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_FILES
from depthbench.shapes import complete_shape, recorded_shape


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A run directory before any array is read.  ``config``'s shape is the one
    the run recorded (``resolved.shape``), written into ``model.depth``,
    ``d_model``, ``d_ff``, ``n_heads`` and ``n_kv_heads``, so no reader resolves
    "the suite's value" again; ``resolved`` is config.json's "resolved" block."""

    path: Path
    config: ml_collections.ConfigDict
    resolved: dict
    spec: ModelSpec

    @property
    def family(self) -> ResidualFamily:
        return registry.build(self.spec)  # one instance per spec (registry.build)

    @cached_property
    def tokenizer(self):
        """``encode(str) -> list[int]``, ``decode(ids) -> str``, ``eos_id``, ``vocab_size``."""
        return run_tokenizer(self.path, self.resolved)

    def tokenizer_files(self) -> dict[str, Path]:
        """Name in an exported folder -> file: the tokenizer files the directory
        holds (regular files, no link), else the recorded tokenizer once it has
        opened as one (so nothing else is ever copied out)."""
        files = {}
        for name in TOKENIZER_FILES:
            path = confine.regular_file(self.path, name, f"{self.path}: {name}")
            if path is not None:
                files[name] = path
        if files:
            return files
        path = str((self.resolved.get("tokenizer") or {}).get("tokenizer_path") or "")
        if path and confine.is_regular(Path(path)):
            _ = self.tokenizer  # ConfigError unless it opens as the run's tokenizer
            return {"tokenizer.json" if path.endswith(".json") else "tokenizer.model": Path(path)}
        return {}

    def load(self, step: int | None = None, options: dict | None = None) -> Run:
        """The model at the newest intact (or the given) checkpoint step
        (``options``: analysis switches, see ``registry.analysis_options``)."""
        return Run(self.config, run_dir=self.path, resolved=self.resolved, step=step,
                   options=options)

    def init(self, seed: int = 0, options: dict | None = None) -> Run:
        """The model freshly initialised from ``seed`` (no checkpoint read)."""
        return Run(self.config, run_dir=self.path, resolved=self.resolved, init_seed=seed,
                   options=options)


def open_run(run_dir: str | Path, command: str = "") -> RunDir:
    """The run directory ``run_dir`` (:class:`RunDir`; nothing restored yet).
    ``command``: whose error lines (``"export-hf: RUN_DIR ..."``)."""
    where = f"{command}: RUN_DIR" if command else "RUN_DIR"
    path = Path(run_dir).expanduser()
    saved = read_json(path / CONFIG_FILE) if path.is_dir() else None  # DamagedFile: one line
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict) or (
            "family" not in saved["model"]):
        raise ConfigError(f"{where} {str(run_dir)!r} is not a run directory (no {CONFIG_FILE} "
                          "naming model.family); give one written by train, finetune, "
                          "import-olmo or import-hf")
    path = path.resolve()
    resolved = saved.pop("resolved", None) or {}
    if not isinstance(resolved, dict) or not isinstance(resolved.get("tokenizer", {}), dict):
        raise ConfigError(f"{path / CONFIG_FILE}: resolved (and its tokenizer): expected a JSON "
                          "object")
    config = saved_config(saved)
    config = complete_shape(config, recorded_shape(config, resolved.get("shape"),
                                                   f"{path / CONFIG_FILE}: resolved.shape"))
    return RunDir(path, config, resolved, ModelSpec.from_config(config))


def _analysis_pairs(family: str, options: dict) -> tuple[tuple[str, str], ...]:
    """The options ``family`` declares, as ``ModelSpec.analysis`` pairs.  Each must
    be a switch some family declares, with one of its values; one the family
    does not declare does not concern it (as for attnres's rules on pre_ln)."""
    known = registry.analysis_options()
    for key, value in options.items():
        if key not in known or value not in known[key]:
            allowed = ", ".join(f"{k}={'|'.join(v)}" for k, v in known.items())
            raise ConfigError(f"option {key}={value!r} is not one of {allowed}")
    cls = registry.get(family)
    own = cls.analysis_options if issubclass(cls, AnalysisOptions) else {}
    return tuple(sorted((k, v) for k, v in options.items() if k in own))


def _mesh(config) -> jax.sharding.Mesh:
    """The run's mesh if this host can build it, else FSDP over all devices."""
    try:
        return parallel.mesh_from_config(config)
    except ConfigError:
        return parallel.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})


class Run:
    """A model restored from a run directory: ``params`` unboxed and sharded on
    ``mesh``, ``step`` the checkpoint's (None for a fresh init).  Every model call
    is jitted once per (batch, length, capture) with the scan's ``active`` and
    ``order`` traced, so the O(L^2) skip and swap analyses compile once; batches
    are padded to the mesh's batch shards and the padding dropped."""

    def __init__(self, config, *, run_dir: str | Path | None = None, resolved: dict | None = None,
                 step: int | None = None, init_seed: int | None = None,
                 options: dict | None = None):
        self.run_dir = None if run_dir is None else Path(run_dir).expanduser().resolve()
        self.config, self.resolved = config, dict(resolved or {})
        self.options = dict(options or {})
        spec = ModelSpec.from_config(self.config)
        # Analysis switches travel in spec.analysis, where the family reads them
        # (capabilities.AnalysisOptions); training never sets them.
        spec = spec.replace(analysis=_analysis_pairs(spec.family, self.options))
        self.spec: ModelSpec = spec
        self.model = Transformer(self.spec)
        self.family: ResidualFamily = self.model.family
        self.mesh = _mesh(self.config)
        self.rules = tuple(parallel.axis_rules())
        self._init_params = params_init(self.model, 8)  # _init's program reuses its trace
        with self._context():
            boxed = jax.eval_shape(self._init_params, jax.random.key(0))
        self.param_shardings = parallel.param_shardings(boxed, self.mesh, self.rules)
        self.abstract_params = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            nn.unbox(boxed), self.param_shardings)
        if init_seed is not None or self.run_dir is None:
            self.params, self.step = self._init(init_seed or 0), None
        else:
            self.params, self.step = self._restore(step)
        self._fns: dict = {}

    def with_params(self, params) -> Run:
        """A copy of this run whose model uses ``params`` (same tree), placed on the mesh."""
        other = object.__new__(Run)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k != "tokenizer"})
        other.params = jax.device_put(params, self.param_shardings)
        other._fns = {}
        return other

    def context(self):
        """The mesh and logical axis rules a traced model call needs."""
        return self._context()

    def _context(self):
        from contextlib import ExitStack

        stack = ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(list(self.rules)))
        return stack

    def _init(self, seed: int):
        fn = jax.jit(lambda k: nn.unbox(self._init_params(k)), out_shardings=self.param_shardings)
        with self._context():
            return fn(jax.random.key(seed))

    def _restore(self, step: int | None):
        return restore.read_params(self.run_dir, self.abstract_params, step)

    def host_params(self) -> dict:
        """The parameters as nested dicts of host (numpy) arrays, in their dtypes."""
        return jax.tree.map(np.asarray, jax.device_get(self.params))

    @cached_property
    def tokenizer(self):
        """``encode(str) -> list[int]``, ``decode(ids) -> str``, ``eos_id``, ``vocab_size``."""
        return run_tokenizer(self.run_dir, self.resolved)

    @property
    def depth(self) -> int:
        return self.spec.depth

    def forward(self, params, tokens_bt, active_l, order_l, capture: tuple[str, ...] = ()):
        """The pure, traceable model call behind :meth:`apply`, ``(logits, captured)``
        (the analyses ``vmap`` it over ``active``/``order`` rows)."""
        params = permute_blocks(self.family, params, order_l)
        return self.model.apply({"params": params}, tokens_bt, capture=capture,
                                active=active_l, ident=order_l)

    def jit(self, fn, n_batch_args: int = 1, n_other: int = 0):
        """``jax.jit(fn)`` for ``fn(params, *batch_args, *other)``: parameters in their
        shardings, batch arguments split over the batch axis, the rest replicated."""
        rep = parallel.replicated(self.mesh)
        batch_sh = parallel.batch_sharding(self.mesh)
        return jax.jit(fn, in_shardings=(self.param_shardings, *[batch_sh] * n_batch_args,
                                         *[rep] * n_other))

    def batch_sharding(self):
        """Where a ``[B, ...]`` batch lives on this run's mesh."""
        return parallel.batch_sharding(self.mesh)

    def _fn(self, capture: tuple[str, ...]):
        if capture not in self._fns:
            self._fns[capture] = self.jit(
                lambda p, t, a, o: self.forward(p, t, a, o, capture), 1, 2)
        return self._fns[capture]

    def _prepare(self, tokens_bt, active, ident) -> tuple[jax.Array, int, Any, Any]:
        tokens = np.asarray(tokens_bt)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens_bt: want an integer array [B, T], got {tokens.dtype} "
                             f"{tokens.shape}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.spec.vocab_size):
            raise ValueError(f"tokens_bt: ids must lie in [0, {self.spec.vocab_size})")
        b = tokens.shape[0]
        shards = parallel.batch_shards(self.mesh)
        pad = -b % shards
        if pad:
            tokens = np.concatenate([tokens, np.zeros((pad, tokens.shape[1]), tokens.dtype)])
        L = self.depth
        active = np.ones(L, bool) if active is None else np.asarray(active, bool)
        order = np.arange(L, dtype=np.int32) if ident is None else np.asarray(ident, np.int32)
        if active.shape != (L,) or order.shape != (L,):
            raise ValueError(f"active/ident: want shape [{L}], got {active.shape}, {order.shape}")
        if sorted(order.tolist()) != list(range(L)):
            raise ValueError(f"ident: want a permutation of 0..{L - 1}, got {order.tolist()}")
        global_tokens = jax.device_put(tokens.astype(np.int32), parallel.batch_sharding(self.mesh))
        # device_put, not jnp.asarray: the latter compiles a copy program per shape.
        rep = parallel.replicated(self.mesh)
        return global_tokens, b, jax.device_put(active, rep), jax.device_put(order, rep)

    def apply(self, tokens_bt, *, active=None, ident=None, capture: tuple[str, ...] = (),
              to_numpy: bool = True):
        """``(logits [B, T, V] fp32, captured)``; ``captured`` holds what ``capture``
        names (``"z"`` ``[L+1, B, T, D]``, ``"lens_logits"``, ``"probe"``: see
        ``model.transformer.Transformer``).  ``active`` [L] bool: False makes that
        position the identity.  ``ident`` [L]: a permutation; position ``i`` runs
        block ``ident[i]`` with its parameters and identity.  ``to_numpy=False``
        keeps (sharded) jax arrays."""
        tokens, b, active_l, order_l = self._prepare(tokens_bt, active, ident)
        with self._context():
            logits, cap = self._fn(tuple(capture))(self.params, tokens, active_l, order_l)
        # The padding rows off: the batch axis is the first, after the depth axis of
        # the per-boundary and per-layer captures ("probe" holds no batch axis).
        cap = {k: v if k == "probe" else _rows(v, b, 0 if k == "carry" else 1)
               for k, v in cap.items()}
        out = (logits[:b], cap)
        if to_numpy:
            out = jax.tree.map(lambda a: np.asarray(jax.device_get(a), np.float32), out)
        return out

    def logits(self, tokens_bt, **kw) -> np.ndarray:
        """fp32 numpy ``[B, T, V]``."""
        return self.apply(tokens_bt, **kw)[0]

    def states(self, tokens_bt, **kw) -> np.ndarray:
        """The depth states ``z_0 .. z_L`` (docs/spec/analysis.md) as fp32 numpy
        ``[L + 1, B, T, D]`` (``D = n*d`` for multi-stream families)."""
        return self.apply(tokens_bt, capture=("z",), **kw)[1]["z"]

    def __repr__(self) -> str:
        s = self.spec
        return (f"Run({str(self.run_dir)!r}, family={s.family}, L={s.depth}, d={s.d_model}, "
                f"step={self.step})")


def _rows(tree, b: int, axis: int):
    """Each leaf's first ``b`` entries along ``axis`` (the batch axis)."""
    return jax.tree.map(lambda a: jax.lax.slice_in_dim(a, 0, b, axis=axis), tree)


TOKENIZER_LIMIT = 1 << 30  # bytes of a tokenizer file a reader opens


def run_tokenizer(run_dir: Path | None, resolved: dict):
    """The tokenizer a run was trained with (``resolved``: its config.json's
    "resolved" block), through the one tokenizer interface."""
    info = resolved.get("tokenizer") or {}
    if not isinstance(info, dict) or not isinstance(info.get("tokenizer_path") or "", str):
        raise ConfigError(f"{CONFIG_FILE}: resolved.tokenizer: expected an object whose "
                          "tokenizer_path is a string")
    path = str(info.get("tokenizer_path") or "")
    # An imported run carries its tokenizer.json (relocatable with the directory).
    local = None if run_dir is None else confine.regular_file(
        run_dir, TOKENIZER_FILE, f"{run_dir}: {TOKENIZER_FILE}")
    if local is not None and (not path or path.endswith(".json")):
        path = str(local)
    if not path:
        raise ConfigError(f"RUN_DIR: {run_dir} records no tokenizer in {CONFIG_FILE} "
                          "(resolved.tokenizer.tokenizer_path)")
    from depthbench.data.tokenizer import open_tokenizer

    ids = {key: info.get(key, -1) for key in ("eos_id", "bos_id")}
    for key, value in ids.items():
        if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value < 1 << 31:
            raise ConfigError(f"{CONFIG_FILE}: resolved.tokenizer.{key}: expected an integer id "
                              f"(-1: none), got {str(value)[:40]!r}")
    if confine.is_regular(Path(path)) and Path(path).stat().st_size > TOKENIZER_LIMIT:
        raise ConfigError(f"resolved.tokenizer.tokenizer_path: {path} holds more than "
                          f"{TOKENIZER_LIMIT:,} bytes")
    return open_tokenizer(path, field="resolved.tokenizer.tokenizer_path", **ids)


def load_run(run_dir: str | Path, *, step: int | None = None, options: dict | None = None) -> Run:
    """The model of ``run_dir`` at its latest (or the given) checkpoint step
    (``options``: analysis switches, see ``registry.analysis_options``)."""
    return open_run(run_dir).load(step=step, options=options)


def init_run(config_or_run_dir, seed: int = 0, options: dict | None = None) -> Run:
    """A freshly initialised model of a ConfigDict or of a run directory's config."""
    if isinstance(config_or_run_dir, (str, Path)):
        return open_run(config_or_run_dir).init(seed, options)
    return Run(config_or_run_dir, init_seed=seed, options=options)
