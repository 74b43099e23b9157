"""The flash kernels (`jaxlm.nn.flash`, Pallas interpret mode on the CPU) against attention written out in jnp:
outputs and the gradients of queries, keys, values and the bias, with T5's shapes of masks (bias with padding,
causal with bias, cross-attention over padded keys), dropout with the kernels' own masks, a mesh, bfloat16; and
the masks' statistics."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from jaxlm import config as config_lib
from jaxlm.config import MeshConfig
from jaxlm.families import make_objective
from jaxlm.nn import flash
from jaxlm.nn.attention import attention_mask, dot_product_attention
from jaxlm.parallel.mesh import make_mesh
from jaxlm.parallel.rules import rules_for

KEY = jax.random.key(7)
T5_SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, head_size=16, intermediate_size=64, vocab_size=128,
                dtype="float32", hidden_dropout=0.0, attention_dropout=0.1)


def _inputs(batch, q_length, k_length, heads, kv_heads, bias, padded, packed=False, dtype=jnp.float32, seed=0,
            empty=True):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((batch, q_length, heads, 16)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((batch, k_length, kv_heads, 16)), dtype) for _ in range(2))
    b = jnp.asarray(rng.standard_normal((1, heads, q_length, k_length)), jnp.float32) if bias else None
    lengths = rng.integers(k_length // 2, k_length + 1, batch)
    if empty:  # an example with no real key: its rows attend uniformly, their logits get no gradient
        lengths[-1] = 0
    padding = jnp.asarray(np.arange(k_length)[None] < lengths[:, None]) if padded else None
    cotangent = jnp.asarray(rng.standard_normal(q.shape), dtype)
    # packed documents: each row's split point differs
    segments = jnp.asarray(np.arange(k_length)[None] >= rng.integers(1, k_length, batch)[:, None], jnp.int32)
    return q, k, v, b, padding, segments if packed else None, cotangent


def _written_out(q, k, v, bias, padding, segments, causal, rate):
    """Attention in float32 jnp, dropping the weights with the kernels' masks (`flash.keep_mask`)."""
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x.astype(jnp.float32), groups, axis=2) for x in (k, v))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k) * 0.5
    if bias is not None:
        logits = logits + bias
    mask = attention_mask(q.shape[1], padding, causal, segments)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1)
    if rate:
        shape = (q.shape[0], q.shape[2], flash.padded(q.shape[1]), flash.padded(k.shape[1]))
        keep, kept = flash.keep_mask(KEY, 1.0 - rate, shape)
        weights = jnp.where(keep[:, :, :q.shape[1], :k.shape[1]], weights / kept, 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def _flash(q, k, v, bias, padding, segments, causal, rate):
    return dot_product_attention(q, k, v, kernel="flash", padding_mask=padding, causal=causal, segment_ids=segments,
                                 bias=bias, scale=0.5, dropout_rate=rate, dropout_rng=KEY if rate else None)


def _outputs_and_grads(attention, inputs, causal, rate):
    q, k, v, bias, padding, segments, cotangent = inputs
    out, vjp = jax.vjp(lambda q, k, v, bias: attention(q, k, v, bias, padding, segments, causal, rate), q, k, v, bias)
    return (out,) + vjp(cotangent)


CASES = {  # (batch, q_length, k_length, heads, kv_heads, bias, padded keys, packed, causal, dropout)
    "t5 encoder: bias, padded keys": (3, 64, 64, 2, 2, True, True, False, False, 0.0),
    "t5 decoder: causal, bias, lengths padded to the block, dropout": (4, 70, 70, 2, 2, True, False, False, True, 0.3),
    "cross-attention over padded keys, grouped heads, dropout": (2, 40, 130, 4, 2, False, True, False, False, 0.2),
    "causal LM: packed documents, padded, grouped heads, dropout": (2, 128, 128, 4, 2, False, True, True, True, 0.1),
    # 9 key blocks: the bias's gradient in 3 groups of 3 blocks, their dq added
    "long keys with a bias, in groups": (2, 64, 576, 2, 2, True, True, False, False, 0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_flash_matches_attention_written_out(case):
    *shape, causal, rate = CASES[case]
    # (under a causal mask a row that sees no key averages the values up to its block, xla's all of them)
    inputs = _inputs(*shape, empty=not causal)
    expected = _outputs_and_grads(_written_out, inputs, causal, rate)
    got = _outputs_and_grads(_flash, inputs, causal, rate)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, expected):
        if b is None:
            assert a is None, name
            continue
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0, err_msg=name)
        assert float(jnp.abs(b).max()) > 0.1, name  # not a comparison of zeros
    if rate:  # the dropout dropped: the same attention without it is far off
        plain = _outputs_and_grads(_written_out, inputs, causal, 0.0)[0]
        assert float(jnp.abs(plain - expected[0]).max()) > 0.1


LONG_KEYS = "long keys with a bias, in groups"
DECODER = "t5 decoder: causal, bias, lengths padded to the block, dropout"


FUSED = dict(BIAS_GRADIENT="fused")


@pytest.mark.parametrize("case, settings", [
    (LONG_KEYS, FUSED), (DECODER, FUSED), (LONG_KEYS, dict(FUSED, DQ_BLOCK=32, GROUP_BLOCKS=4)),
    (LONG_KEYS, dict(FUSED, DQ_BLOCK=64, GROUP_BLOCKS=1)),
    (LONG_KEYS, dict(FUSED, BLOCK=32, DQ_BLOCK=32, GROUP_BLOCKS=2, BIAS_CHUNKS=1)),
    (LONG_KEYS, dict(BLOCK=32)), (LONG_KEYS, dict(BIAS_GRADIENT="separate")),
    (DECODER, dict(BIAS_GRADIENT="separate"))])
def test_other_tilings_give_the_same_gradients(case, settings, monkeypatch):
    """The settings that `bench/attention_kernels.py --sweep` times on a GPU: each computes the same gradients
    (the bias's gradient summed in the queries' kernel, in other query rows, key groups and batch chunks, or in
    a kernel of its own; smaller tiles)."""
    *shape, causal, rate = CASES[case]
    inputs = _inputs(*shape, empty=not causal)
    expected = _outputs_and_grads(_written_out, inputs, causal, rate)
    for name, value in settings.items():
        monkeypatch.setattr(flash, name, value)
    jax.clear_caches()
    got = _outputs_and_grads(_flash, inputs, causal, rate)
    jax.clear_caches()
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0, err_msg=name)


def test_a_bias_of_the_lowest_float_masks_as_in_xla():
    """A bias of float32's lowest value on a whole key block (log2(e) times it overflows): finite, as xla's."""
    q, k, v, bias, padding, segments, cotangent = _inputs(2, 64, 128, 2, 2, True, False, seed=3)
    bias = bias.at[..., :64].set(jnp.finfo(jnp.float32).min)
    inputs = (q, k, v, bias, padding, segments, cotangent)
    expected = _outputs_and_grads(_written_out, inputs, False, 0.0)
    got = _outputs_and_grads(_flash, inputs, False, 0.0)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0, err_msg=name)


def test_flash_in_bfloat16_stays_near_float32():
    inputs = _inputs(2, 64, 64, 2, 2, True, True, dtype=jnp.bfloat16, seed=1)
    in_float32 = [x if x is None or not jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
                  for x in inputs]
    expected = _outputs_and_grads(_written_out, in_float32, False, 0.0)
    got = _outputs_and_grads(_flash, inputs, False, 0.0)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, expected):
        scale = float(jnp.abs(b.astype(jnp.float32)).max())
        error = float(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)).max())
        assert error < 0.02 * scale, (name, error, scale)


def test_flash_under_a_mesh_matches_one_device():
    """shard_map over data x fsdp (batch) and tensor (heads) on the 8 simulated CPU devices: the same outputs,
    gradients (the bias's summed over the batch's shards) and dropout masks (hashed from global indices)."""
    inputs = _inputs(4, 64, 64, 4, 4, True, True, packed=True, seed=2)
    expected = _outputs_and_grads(_flash, inputs, False, 0.3)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules_for("fsdp_tp")):
        got = jax.jit(lambda *inputs: _outputs_and_grads(_flash, inputs, False, 0.3))(*inputs)
        text = jax.jit(lambda *inputs: _flash(*inputs[:6], False, 0.3)).lower(*inputs).as_text()
    assert "shard_map" in text or "manual" in text
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, expected):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0, err_msg=name)


def test_flash_inside_a_callers_shard_map_hashes_global_indices():
    """A shard_map of the caller's own over the batch's (data, fsdp) and the heads' (tensor) mesh axes, or over
    data alone (the kernels split the rest): the same outputs, gradients and dropout masks as one device."""
    q, k, v, _, padding, segments, cotangent = _inputs(4, 64, 64, 4, 4, False, True, packed=True, seed=3)
    expected = _outputs_and_grads(_flash, (q, k, v, None, padding, segments, cotangent), False, 0.3)

    def attend(q, k, v, padding, segments, cotangent):
        return _outputs_and_grads(_flash, (q, k, v, None, padding, segments, cotangent), False, 0.3)[:4]

    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    for batch, heads in ((("data", "fsdp"), "tensor"), ("data", None)):
        qkv, rows = PartitionSpec(batch, None, heads, None), PartitionSpec(batch, None)
        manual = {*((batch,) if isinstance(batch, str) else batch), *((heads,) if heads else ())}
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules_for("fsdp_tp")):
            got = jax.jit(jax.shard_map(attend, in_specs=(qkv, qkv, qkv, rows, rows, qkv), out_specs=qkv,
                                        axis_names=manual, check_vma=False))(q, k, v, padding, segments, cotangent)
        for name, a, b in zip(["out", "dq", "dk", "dv"], got, expected):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=0, err_msg=f"{name} {manual}")


def test_dropout_masks_keep_the_fraction_and_are_independent():
    keep, kept = flash.keep_mask(KEY, 0.9, (4, 4, 128, 128))
    keep = np.asarray(keep)
    assert kept == pytest.approx(0.9, abs=1e-4)
    assert abs(keep.mean() - kept) < 0.003
    x = keep.astype(np.float64) - keep.mean()
    for axis in (2, 3):  # neighbouring queries, neighbouring keys
        neighbours = np.mean(np.take(x, range(1, 128), axis) * np.take(x, range(127), axis)) / x.var()
        assert abs(neighbours) < 0.01, axis
    rows = keep.reshape(16, -1)
    assert max(np.mean(rows[i] == rows[j]) for i in range(16) for j in range(i)) < 0.85  # rows differ (0.82 by chance)
    other = np.asarray(flash.keep_mask(jax.random.key(8), 0.9, (4, 4, 128, 128))[0])
    assert np.mean(other == keep) < 0.85


@pytest.mark.parametrize("kwargs, message", [
    (dict(mask=jnp.ones((2, 1, 64, 64), bool)), "no extra mask"),
    (dict(segment_ids=jnp.zeros((2, 64), jnp.int32), causal=True, value_length=32), "equal query and key lengths"),
    (dict(bias=jnp.zeros((2, 2, 64, 64))), "shared by the batch"),
])
def test_flash_refuses_what_it_cannot_do(kwargs, message):
    q = jnp.zeros((2, 64, 2, 16))
    k = jnp.zeros((2, kwargs.pop("value_length", 64), 2, 16))
    with pytest.raises(ValueError, match=message):
        dot_product_attention(q, k, k, kernel="flash", **kwargs)


def test_t5_with_flash_kernels_equals_t5_with_xla():
    """T5 (relative bias on the encoder's and decoder's self-attention, padded cross-attention): the same loss
    and parameter gradients with either kernel, without dropout; with dropout the flash step trains too."""
    def objective_for(kernel):
        config = config_lib.from_dict({"model": {"preset": "t5-small", **T5_SMALL, "attention_kernel": kernel},
                                       "data": {"max_seq_length": 24, "max_target_length": 8}})
        return make_objective(config.model, config.data)

    def loss_of(objective, batch):
        def loss(params, rng):
            outputs = objective.apply(params, batch, rng, deterministic=rng is None)
            return sum(jnp.mean(jax.nn.logsumexp(o, axis=-1)) for o in jax.tree.leaves(outputs))
        return loss

    results = {}
    for kernel in ("xla", "flash"):
        objective = objective_for(kernel)
        batch = objective.synthetic_batch(4)
        params = nn.unbox(objective.init(jax.random.key(0)))
        loss = loss_of(objective, batch)
        results[kernel] = jax.jit(lambda p: jax.value_and_grad(loss)(p, None))(params)
    for a, b in zip(jax.tree.leaves(results["flash"]), jax.tree.leaves(results["xla"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    dropped = jax.jit(jax.value_and_grad(loss))(params, jax.random.key(1))
    assert np.isfinite(float(dropped[0])) and float(dropped[0]) != pytest.approx(float(results["flash"][0]))
