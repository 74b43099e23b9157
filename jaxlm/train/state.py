"""The train state and its sharded creation: never materialised unsharded."""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jaxlm.parallel.mesh import tree_shardings
from jaxlm.parallel.rules import Rules


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


def _boxed_state(init_params: Callable, optimizer: optax.GradientTransformation, rng) -> TrainState:
    params = init_params(rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))


def _state(init_params: Callable, optimizer: optax.GradientTransformation, rng) -> TrainState:
    params = nn.unbox(init_params(rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))


def state_shardings(init_params, optimizer, mesh: Mesh, rules: Rules):
    """NamedShardings for every leaf of the train state, from the parameters' logical names."""
    boxed = jax.eval_shape(lambda r: _boxed_state(init_params, optimizer, r), jax.random.key(0))
    return tree_shardings(mesh, rules, boxed)


def abstract_state(init_params, optimizer, shardings):
    """ShapeDtypeStructs carrying the target shardings: for restore and AOT compilation."""
    shapes = jax.eval_shape(lambda r: _state(init_params, optimizer, r), jax.random.key(0))
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def create_state(init_params, optimizer, shardings, mesh: Mesh, rules: Rules, rng) -> TrainState:
    """Initialise directly into the sharded layout."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        return jax.jit(lambda r: _state(init_params, optimizer, r), out_shardings=shardings)(rng)


def count_params(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))
