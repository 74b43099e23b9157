"""jaxlm.nn.dropout: masks with the asked keep probability (to 16 bits), uncorrelated between neighbours and
between a threefry block's two outputs, from a quarter of the threefry blocks jax.random.bernoulli spends,
under threefry, rbg and raw keys, or hashed (HASHED keys: nothing kept for the backward pass); the module keeps
flax.linen.Dropout's contract."""
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.nn import flash
from jaxlm.nn.attention import dot_product_attention
from jaxlm.nn.dropout import HASHED, LEVELS, Dropout, dropout, keep_mask

SHAPE = (8, 4, 96, 250)  # 768,000 draws; an odd number of words per row


def _threefry_blocks(fn, *args) -> int:
    """How many threefry blocks fn computes, from its printed jaxpr (nested jits' bodies included): the first
    output of each threefry2x32 equation, and each random_bits equation's shape (one block an element under
    jax_threefry_partitionable)."""
    text = str(jax.make_jaxpr(fn)(*args))
    shapes = re.findall(r"\w+:u32\[([\d,]*)\] \w+:u32\[[\d,]*\] = threefry2x32", text)
    shapes += re.findall(r"random_bits\[bit_width=32 shape=\(([\d, ]*)\)", text)
    return sum(math.prod(int(d) for d in dims.split(",") if d.strip()) for dims in shapes)


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", HASHED])
def test_masks_keep_the_asked_fraction_without_correlation(impl):
    keep, kept = keep_mask(jax.random.key(3, impl=impl), 0.9, SHAPE)
    keep = np.asarray(keep)
    assert keep.shape == SHAPE and keep.dtype == bool
    assert kept == round(0.9 * LEVELS) / LEVELS and abs(kept - 0.9) < 1e-5
    draws = keep.size
    assert abs(keep.mean() - kept) < 4 * np.sqrt(kept * (1 - kept) / draws)
    rows = keep.reshape(-1, SHAPE[-1]).astype(np.float64)
    for a, b in [(rows[:, :-1], rows[:, 1:]), (rows[:, :124], rows[:, 124:248]), (rows[:-1], rows[1:])]:
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01
    other, _ = keep_mask(jax.random.key(4, impl=impl), 0.9, SHAPE)
    again, _ = keep_mask(jax.random.key(3, impl=impl), 0.9, SHAPE)
    assert np.array_equal(np.asarray(again), keep) and not np.array_equal(np.asarray(other), keep)


def test_a_quarter_of_bernoullis_threefry_blocks():
    key = jax.random.key(0)
    ours = _threefry_blocks(lambda k: keep_mask(k, 0.9, SHAPE)[0], key)
    theirs = _threefry_blocks(lambda k: jax.random.bernoulli(k, 0.9, SHAPE), key)
    assert theirs == math.prod(SHAPE) and ours == math.prod(SHAPE[:-1]) * 63  # 125 words, 63 blocks a row


def test_dropout_keeps_the_mean_and_takes_raw_keys():
    x = jnp.ones(SHAPE, jnp.float32)
    out = dropout(x, 0.1, jax.random.PRNGKey(0))
    kept = round(0.9 * LEVELS) / LEVELS
    assert set(np.unique(np.asarray(out)).tolist()) == {0.0, np.float32(1 / kept)}
    assert abs(float(out.mean()) - 1.0) < 4 * np.sqrt((1 - kept) / kept / out.size)
    for rate in (1.0, 1 - 1e-6):
        assert not dropout(x, rate, jax.random.PRNGKey(0)).any()
        assert not jnp.isnan(jax.grad(lambda v: dropout(v, rate, jax.random.PRNGKey(0)).sum())(x)).any()


def test_module_keeps_flax_contract():
    x = jnp.arange(1.0, 1001.0).reshape(10, 100)
    module = Dropout(0.25)
    assert jnp.array_equal(module.apply({}, x, deterministic=True), x)
    assert jnp.array_equal(Dropout(0.0).apply({}, x, deterministic=False), x)
    out = module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    kept = round(0.75 * LEVELS) / LEVELS
    assert jnp.allclose(jnp.where(out == 0, 0, x / kept), out)
    with pytest.raises(Exception, match="dropout"):
        module.apply({}, x, deterministic=False)
    assert isinstance(module, nn.Module)


def test_hashed_dropout_keeps_nothing_for_the_backward_pass():
    """A HASHED key's masks are computed again in the backward pass: its gradient is the mask's, and of what
    the forward pass computes, nothing of the input's size is kept (threefry's keep their mask)."""
    x = jax.random.normal(jax.random.key(0), SHAPE, jnp.bfloat16)
    cotangent = jax.random.normal(jax.random.key(1), SHAPE, jnp.bfloat16)
    key = jax.random.key(5, impl=HASHED)
    out, pullback = jax.vjp(lambda v: dropout(v, 0.1, key), x)
    keep, kept = keep_mask(key, 0.9, SHAPE)
    assert jnp.array_equal(out, jnp.where(keep, x / kept, 0))
    assert jnp.array_equal(pullback(cotangent)[0], jnp.where(keep, cotangent / kept, 0))
    assert not [leaf for leaf in jax.tree.leaves(pullback) if getattr(leaf, "size", 0) >= x.size]
    _, threefry_pullback = jax.vjp(lambda v: dropout(v, 0.1, jax.random.key(5)), x)
    assert [leaf for leaf in jax.tree.leaves(threefry_pullback) if getattr(leaf, "size", 0) >= x.size]


def test_hashed_masks_are_the_flash_kernels():
    """On attention weights whose key length is a multiple of the flash kernels' block, XLA's attention drops
    the weights the flash kernels drop (Pallas interpret mode on this CPU) for the same HASHED key."""
    key = jax.random.key(9, impl=HASHED)
    q, k, v = jax.random.normal(jax.random.key(0), (3, 2, flash.BLOCK, 2, 16))
    outs = [dot_product_attention(q, k, v, kernel=kernel, dropout_rate=0.1, dropout_rng=key)
            for kernel in ("xla", "flash")]
    assert jnp.allclose(*outs, atol=1e-5)
    undropped = dot_product_attention(q, k, v, kernel="xla")
    assert not jnp.allclose(outs[0], undropped, atol=1e-2)


@pytest.mark.parametrize("axis", [0, 2])
@pytest.mark.parametrize("impl", ["threefry2x32", HASHED])
def test_sharded_masks_need_no_collective(axis, impl):
    """Each device draws its own shard's mask, whether the batch or the feature axis is split."""
    devices = np.array(jax.devices()[:4])
    mesh = jax.sharding.Mesh(devices, ("x",))
    spec = [None, None, None]
    spec[axis] = "x"
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    x = jax.device_put(jnp.ones((8, 16, 64)), sharding)
    step = jax.jit(lambda k, v: dropout(v, 0.1, k), out_shardings=sharding)
    key = jax.random.key(0, impl=impl)
    hlo = step.lower(key, x).compile().as_text()
    assert not re.search(r"all-gather|all-to-all|collective-permute|all-reduce", hlo)
    whole = dropout(jnp.ones((8, 16, 64)), 0.1, key)
    assert jnp.array_equal(step(key, x), whole)
