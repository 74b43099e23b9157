"""Placing arrays by logical axis names under auto and explicit mesh axes alike.

jaxlm's own meshes have auto axes: XLA propagates layouts from the constraints the rules give. Under
explicit axes (`jax.make_mesh`'s default) a layout is part of each array's type: flax's logical
constraints only assert it, an activation split over the batch's mesh axes cannot meet a parameter
split over them too (FSDP), and a contraction or gather over split dimensions must name its output.
"""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P


def explicit_axes() -> bool:
    """Whether the current mesh (`jax.set_mesh`) has explicit axes."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and mesh.are_all_axes_explicit


def target_platform() -> str:
    """The platform the computation is being built for: the mesh in context, else the default backend."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()


def spec_of(x: jax.Array) -> tuple:
    """The layout in `x`'s type: one entry per dimension, None where not split (always under auto axes)."""
    return tuple(jax.typeof(x).sharding.spec)


def axis_tuple(entry) -> tuple[str, ...]:
    """A rule's mesh-axis entry (None, a name, or names) as a tuple of names."""
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def layout(shape: Sequence[int], names: Sequence[str | None]) -> P:
    """The rules' layout of an array of `shape` whose dimensions have logical `names`, on the current
    mesh, less mesh axes that do not divide their dimension (explicit layouts cannot pad)."""
    mesh = jax.sharding.get_abstract_mesh()
    return P(*(axes if size % math.prod(mesh.shape[a] for a in axis_tuple(axes)) == 0 else None
               for size, axes in zip(shape, nn.logical_to_mesh_axes(tuple(names)))))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`nn.with_logical_constraint`, except that under explicit axes, where that only asserts a layout,
    it reshards `x` to its `layout`."""
    if not explicit_axes() or not nn.get_logical_axis_rules():
        return nn.with_logical_constraint(x, tuple(names))
    return jax.sharding.reshard(x, layout(x.shape, names))


def gathered(param: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """A parameter as compute reads it: placed by its logical `names`, less the batch's mesh axes (the
    FSDP all-gather before use, made explicit). Under explicit axes an activation split over the batch's
    mesh axes cannot meet a parameter split over them too; under auto axes XLA's partitioner computes
    some gradients wrongly without it (jax 0.10.2: a contraction whose dimension is split over fsdp in
    the parameter and over tensor in the activation, after a nonlinearity)."""
    if not nn.get_logical_axis_rules():
        return param
    batch = set(axis_tuple(nn.logical_to_mesh_axes(("batch",))[0]))
    placed = nn.logical_to_mesh_axes(tuple(names))
    return constrain(param, tuple(None if set(axis_tuple(axes)) & batch else name for name, axes in zip(names, placed)))


class LogicallyPartitioned(nn.LogicallyPartitioned):
    """flax's box of a parameter and its logical axis names, unboxed through `constrain` (flax's own
    unboxing asserts a layout under explicit axes, which a fresh parameter does not have yet). A shape alone
    (`jax.eval_shape`'s) is unboxed as it is: constraining it under a caller's mesh and rules was a TypeError."""

    def unbox(self, apply_constraint: bool = True):
        if isinstance(self.value, jax.ShapeDtypeStruct):
            return self.value
        if apply_constraint and explicit_axes():
            return constrain(self.value, self.names)
        return super().unbox(apply_constraint)


def with_logical_partitioning(init, names: Sequence[str | None]):
    """`init` with its result boxed with logical axis names, as `nn.with_logical_partitioning`."""
    return lambda *args: LogicallyPartitioned(init(*args), tuple(names))
