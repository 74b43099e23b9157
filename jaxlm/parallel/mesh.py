"""The device mesh (data, fsdp, tensor) from the config, and shardings from logical names."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jaxlm.config import ConfigError, MeshConfig
from jaxlm.parallel.logical import axis_tuple
from jaxlm.parallel.rules import MESH_AXES, Rules, rules_for


def resolve_shape(config: MeshConfig, device_count: int) -> tuple[int, int, int]:
    """Mesh sizes with a -1 filled in; raises when the product cannot equal the device count."""
    sizes = [config.data, config.fsdp, config.tensor]
    named = " x ".join(f"{n}={s}" for n, s in zip(MESH_AXES, sizes))
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if device_count % known:
            raise ConfigError(f"mesh {named}: the fixed axes ({known}) do not divide the {device_count} devices present")
        sizes[sizes.index(-1)] = device_count // known
    if math.prod(sizes) != device_count:
        raise ConfigError(
            f"mesh {named} has {math.prod(sizes)} devices but {device_count} are present; "
            f"make the product equal {device_count} or set one axis to -1")
    return tuple(sizes)


def make_mesh(config: MeshConfig, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_shape(config, len(devices))
    try:
        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, MESH_AXES)


def auto_axes(mesh: Mesh) -> Mesh:
    """`mesh` (the same devices and axis names) with every axis Auto, as `make_mesh` makes them: a mesh from
    `jax.make_mesh`, explicit by default, for the programs that leave layouts to XLA (generation, scoring)."""
    if all(kind == AxisType.Auto for kind in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def mesh_and_rules(mesh: Mesh | None, rules: Rules | None) -> tuple[Mesh, Rules]:
    """The mesh and logical-axis rules a library call (scoring, generation) runs under: without a mesh, every device
    as MeshConfig's defaults lay them out; without rules, MeshConfig's default preset, which names the mesh axes
    `make_mesh` makes; every axis Auto. `rules` may be a preset's name, as mesh.rules takes it."""
    mesh = make_mesh(MeshConfig()) if mesh is None else mesh
    if isinstance(rules, str):
        rules = rules_for(rules)
    if rules is None:
        rules = rules_for(MeshConfig().rules)
        missing = sorted({axis for _, entry in rules for axis in axis_tuple(entry)} - set(mesh.axis_names))
        if missing:
            raise ValueError(f"the default sharding rules ({MeshConfig().rules!r}) split over mesh axes {missing}, "
                             f"which this mesh {tuple(mesh.axis_names)} lacks; pass rules for its axes")
    return auto_axes(mesh), tuple(rules)


def logical_sharding(mesh: Mesh, rules: Rules, logical: tuple[str | None, ...]) -> NamedSharding:
    return NamedSharding(mesh, nn.logical_to_mesh_axes(logical, rules))


def tree_shardings(mesh: Mesh, rules: Rules, boxed_abstract_tree):
    """NamedShardings for a tree whose leaves may carry flax logical axis metadata; a ConfigError where a
    leaf's dimension is not divisible by the mesh axes its name is split over."""
    check_divisible(mesh, rules, boxed_abstract_tree)
    specs = nn.get_partition_spec(boxed_abstract_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def check_divisible(mesh: Mesh, rules: Rules, boxed_abstract_tree) -> None:
    """Before compute: every dimension of a logically named leaf divides into the ways its name is split
    (JAX would stop later, naming the parameter but not the setting that splits it)."""
    def boxed(x) -> bool:
        return isinstance(x, nn.LogicallyPartitioned)

    for path, leaf in jax.tree_util.tree_flatten_with_path(boxed_abstract_tree, is_leaf=boxed)[0]:
        if not boxed(leaf):
            continue
        for size, name, axes in zip(leaf.value.shape, leaf.names, nn.logical_to_mesh_axes(leaf.names, rules)):
            axes = axis_tuple(axes)
            ways = math.prod(mesh.shape[a] for a in axes)
            if size % ways:
                where = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
                fix = f"choose mesh sizes whose {' x '.join(axes)} divides {size}, or other mesh.rules"
                if name == "vocab":
                    fix = f"set model.vocab_multiple={math.lcm(ways, 128)} (padded rows), or {fix}"
                raise ConfigError(f"parameter {jax.tree_util.keystr(path, simple=True, separator='/')} has {size} "
                                  f"along {name!r}, which the mesh rules split {ways} ways ({where}): {fix}")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_shards(mesh: Mesh, rules: Rules) -> int:
    """How many ways the rules split the batch over the mesh."""
    return math.prod(mesh.shape[a] for a in axis_tuple(nn.logical_to_mesh_axes(("batch",), rules)[0]))
