"""The train state and its sharded creation: never materialised unsharded."""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jaxlm.config import ConfigError
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


def _unbox_reshaped(boxed_tree):
    """The tree with a box that does not fit its value (another rank, or a single element) replaced by the value,
    which is then replicated. Adafactor's second moments keep their parameter's box (an optimiser's state is
    mapped over the parameters) but not its shape: a matrix's are a row and a column vector, the sizes of its
    sides, and placeholders of shape (1,) stand for the moments a parameter does not have."""
    def reshaped(x) -> bool:
        return isinstance(x, nn.LogicallyPartitioned) and (len(x.names) != len(x.value.shape) or x.value.size == 1)

    return jax.tree.map(lambda x: x.value if reshaped(x) else x, boxed_tree,
                        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def state_shardings(init_params, optimizer, mesh: Mesh, rules: Rules):
    """NamedShardings for every leaf of the train state, from the parameters' logical names."""
    boxed = jax.eval_shape(lambda r: _boxed_state(init_params, optimizer, r), jax.random.key(0))
    return tree_shardings(mesh, rules, _unbox_reshaped(boxed))


def abstract_state(init_params, optimizer, shardings):
    """ShapeDtypeStructs carrying the target shardings: for restore and AOT compilation."""
    shapes = jax.eval_shape(lambda r: _state(init_params, optimizer, r), jax.random.key(0))
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def state_bytes(abstract) -> int:
    """The bytes of one device's shards of an abstract state (leaves carrying their shardings)."""
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               for leaf in jax.tree.leaves(abstract))


def device_memory(sharing: int | None = None) -> tuple[int, str] | None:
    """(bytes, what they are) a local device holds: its own memory, or on CPUs its share of the host's among
    `sharing` devices that fill it at once (default: every local device); None where the runtime does not say."""
    device = jax.local_devices()[0]
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if limit:
        return limit, f"one {device.device_kind}"
    if device.platform == "cpu":
        count = sharing or jax.local_device_count()
        share = f"a 1/{count} share of " if count > 1 else ""
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // count, f"{share}the host's memory"
    return None


def check_state_memory(abstract) -> None:
    """A ConfigError, before anything is allocated, where one device's shards of the train state alone exceed what
    a device holds (the state sizes of a mistyped model, which XLA would report as an allocation that failed)."""
    have = device_memory()
    need = state_bytes(abstract)
    if have is not None and need > have[0]:
        raise ConfigError(f"the train state (parameters and optimiser state) needs {need / 2**30:,.1f} GiB per "
                          f"device, more than the {have[0] / 2**30:,.1f} GiB of {have[1]}; check the model's sizes "
                          "(model.*), or spread the state over more devices (mesh.rules=fsdp)")


THREEFRY_KERNEL = "jax_threefry_gpu_kernel_lowering"


@contextlib.contextmanager
def threefry_kernel():
    """On GPU, JAX's threefry as its precompiled CUDA kernel rather than XLA fusions (the same bits): the
    initialiser's draws, one per parameter array, otherwise compile into a few huge fusions (T5-base's took
    150 s to compile for a compile-only H100 on a 2-core CPU, 12 s with the kernel). Not for the train step,
    whose dropout masks XLA fuses with their use. A JAX without the option compiles as before."""
    before = getattr(jax.config, THREEFRY_KERNEL, None)
    if before is None:
        yield
        return
    jax.config.update(THREEFRY_KERNEL, True)
    try:
        yield
    finally:
        jax.config.update(THREEFRY_KERNEL, before)


def state_initializer(init_params, optimizer, shardings):
    """The jitted function from a key to the initialised state in its sharded layout (call or lower it under
    `threefry_kernel()`, the mesh and the rules)."""
    return jax.jit(lambda r: _state(init_params, optimizer, r), out_shardings=shardings)


def create_state(init_params, optimizer, shardings, mesh: Mesh, rules: Rules, rng) -> TrainState:
    """Initialise directly into the sharded layout."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), threefry_kernel():
        return state_initializer(init_params, optimizer, shardings)(rng)


def count_params(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))
