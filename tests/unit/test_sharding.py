"""On a (data=2, fsdp=2, tensor=2) mesh every parameter is placed as its rule preset says."""
import flax.linen as nn
import jax
import pytest
from jax.sharding import PartitionSpec

from jaxlm import config as config_lib
from jaxlm.parallel.rules import PRESETS, mesh_axes_for
from jaxlm.train.loop import build
from jaxlm.train.state import create_state

MESH = {"data": 2, "fsdp": 2, "tensor": 2}


def _expected_spec(rules, names):
    axes = mesh_axes_for(rules, names)
    while axes and axes[-1] is None:
        axes = axes[:-1]
    return PartitionSpec(*axes)


def _normalise(spec: PartitionSpec) -> PartitionSpec:
    axes = list(spec)
    while axes and axes[-1] is None:
        axes.pop()
    return PartitionSpec(*axes)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_parameter_follows_the_rules(preset):
    config = config_lib.from_dict({"model": {"preset": "bert-tiny", "dtype": "float32"},
                                   "mesh": {**MESH, "rules": preset}, "train": {"global_batch": 8}})
    setup = build(config)
    assert dict(setup.mesh.shape) == MESH
    boxed = jax.eval_shape(setup.objective.init, jax.random.key(0))
    names = jax.tree.map(lambda b: b.names, boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    state = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules,
                         jax.random.key(0))
    rules = PRESETS[preset]
    flat_names = jax.tree_util.tree_flatten_with_path(names, is_leaf=lambda x: isinstance(x, tuple))[0]
    flat_params = dict(jax.tree_util.tree_flatten_with_path(state.params)[0])
    assert len(flat_names) == len(flat_params) > 0
    sharded = 0
    for path, logical in flat_names:
        array = flat_params[path]
        expected = _expected_spec(rules, logical)
        assert _normalise(array.sharding.spec) == expected, (jax.tree_util.keystr(path), logical)
        assert array.sharding.mesh.shape == setup.mesh.shape
        sharded += expected != PartitionSpec()
    if preset != "dp":
        assert sharded > 0
    mu = state.opt_state[1][0].mu
    for path, leaf in jax.tree_util.tree_flatten_with_path(mu)[0]:
        assert leaf.sharding == flat_params[path].sharding, jax.tree_util.keystr(path)


def test_fsdp_tp_splits_the_big_matrices():
    rules = PRESETS["fsdp_tp"]
    assert _expected_spec(rules, ("embed", "heads", "kv")) == PartitionSpec("fsdp", "tensor")
    assert _expected_spec(rules, ("embed", "mlp")) == PartitionSpec("fsdp", "tensor")
    assert _expected_spec(rules, ("vocab", "embed")) == PartitionSpec("tensor", "fsdp")
