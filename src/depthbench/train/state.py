"""The train state and how it is laid out on the mesh.

:class:`TrainState` is a plain pytree that Orbax saves as is; :func:`setup`
builds everything static about a run (model, optimizer, rules, the sharding
of every state leaf); :func:`init_state` creates the state directly in its
sharded layout (no host-side copy)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import struct
from jax.sharding import Mesh, NamedSharding

from depthbench import parallel
from depthbench.model.spec import ModelSpec
from depthbench.model.transformer import Transformer, params_init
from depthbench.train import optim


class TrainState(struct.PyTreeNode):
    step: jax.Array  # int32 scalar: optimizer updates done so far
    params: Any  # unboxed parameter tree (param_dtype: fp32 master weights by default)
    opt_state: Any
    rng: jax.Array  # uint32 key data (raw, so it checkpoints like any array)


@dataclasses.dataclass(frozen=True)
class TrainSetup:
    """Everything static about one run on one mesh."""

    spec: ModelSpec
    model: Transformer
    family: Any
    mesh: Mesh
    rules: tuple
    tx: optax.GradientTransformation
    schedule: Callable[[jax.Array], jax.Array]
    seq_len: int
    abstract_state: TrainState  # ShapeDtypeStructs carrying their shardings
    state_shardings: TrainState
    param_names: Any  # logical names per parameter leaf
    init_params: Callable[[jax.Array], Any]  # key -> boxed params (transformer.params_init)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """The mesh and logical rules the model's sharding constraints resolve in
        (active while a function is traced)."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(list(self.rules)):
            yield

    @property
    def param_shardings(self) -> Any:
        return self.state_shardings.params


def _key_data(seed: int) -> jax.Array:
    return jax.random.key_data(jax.random.key(seed))


def setup(config, mesh: Mesh, spec: ModelSpec | None = None,
          rules: tuple | None = None) -> TrainSetup:
    """Model, optimizer and state shardings for ``config`` on ``mesh``
    (``rules``: the logical-axis table, default :func:`parallel.axis_rules`)."""
    rules = rules or parallel.axis_rules()
    spec = spec or ModelSpec.from_config(config)
    model = Transformer(spec)
    family = model.family
    seq_len = int(config.train.seq_len)
    init_params = params_init(model, seq_len)  # make_init's program reuses its trace
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        boxed = jax.eval_shape(init_params, jax.random.key(0))
    param_sh = parallel.param_shardings(boxed, mesh, rules)
    abstract_params = nn.unbox(boxed)
    tx, schedule = optim.from_config(config, family, abstract_params)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_sh = parallel.shardings_like(abstract_opt, abstract_params, param_sh, mesh)
    rep = parallel.replicated(mesh)
    shardings = TrainState(step=rep, params=param_sh, opt_state=opt_sh, rng=rep)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                          opt_state=abstract_opt,
                          rng=jax.ShapeDtypeStruct(_key_data(0).shape, jnp.uint32))
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            abstract, shardings)
    return TrainSetup(spec=spec, model=model, family=family, mesh=mesh, rules=tuple(rules),
                      tx=tx, schedule=schedule, seq_len=seq_len, abstract_state=abstract,
                      state_shardings=shardings, param_names=parallel.logical_names(boxed),
                      init_params=init_params)


def make_init(s: TrainSetup):
    """``key_data -> TrainState``, jitted straight into the state's shardings.  The
    key splits into the parameter-init key and the run's RNG; the parameters do
    not depend on the mesh (partitionable threefry), so a sharded run matches a
    single-device one."""
    def init(key_data):
        init_key, run_key = jax.random.split(jax.random.wrap_key_data(key_data))
        params = nn.unbox(s.init_params(init_key))
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=s.tx.init(params), rng=jax.random.key_data(run_key))

    return jax.jit(init, in_shardings=parallel.replicated(s.mesh),
                   out_shardings=s.state_shardings)


def init_state(s: TrainSetup, seed: int, init_fn=None) -> TrainState:
    """A fresh state from ``seed``, created sharded on the mesh (no host copy)."""
    fn = init_fn or make_init(s)
    with s.context():
        return fn(_key_data(seed))


def param_count(params: Any) -> int:
    return int(sum(x.size for x in jax.tree.leaves(params)))


def shardings_summary(shardings: Any) -> dict[str, str]:
    """{'blocks/mlp/up': "PartitionSpec(None, 'fsdp', 'tensor')", ...} for logs and tests."""
    out = {}
    for path, sh in jax.tree_util.tree_flatten_with_path(
            shardings, is_leaf=lambda x: isinstance(x, NamedSharding))[0]:
        out["/".join(optim._leaf_name([p]) for p in path)] = str(sh.spec)
    return out
