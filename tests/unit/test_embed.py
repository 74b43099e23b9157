"""Embedding lookups in bfloat16 compute: the table's gradient sums each row's tokens in float32, whether the
lookup is a gather (large tables) or a one-hot contraction (a few rows, T5's relative-position buckets), and the
rows are the table's exactly; an id or position outside its table or row reads NaN."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.models.config import TransformerConfig
from jaxlm.models.heads import gather_positions
from jaxlm.models.t5 import RelativeBias, relative_position_bucket
from jaxlm.nn.embed import SMALL_TABLE, Embed


@pytest.mark.parametrize("rows", [2, SMALL_TABLE + 1])
def test_a_row_shared_by_many_tokens_gets_its_gradient_summed_in_float32(rows):
    """BERT's token types: two rows, each looked up by thousands of tokens. The gradient must be the float32
    sum of the (bfloat16) cotangents; summed in bfloat16, some elements were off by several times their size."""
    config = TransformerConfig(vocab_size=2, hidden_size=64, num_heads=4, dtype="bfloat16", param_dtype="float32")
    embed = Embed(config, rows, ("segment", "embed"))
    ids = jax.random.bernoulli(jax.random.key(0), 0.3, (64, 128)).astype(jnp.int32)
    params = embed.init(jax.random.key(1), ids)
    table = np.asarray(nn.unbox(params)["params"]["embedding"])
    looked_up = embed.apply(params, ids)
    np.testing.assert_array_equal(np.asarray(looked_up, np.float32),
                                  table[np.asarray(ids)].astype(jnp.bfloat16).astype(np.float32))
    cotangent = jax.random.normal(jax.random.key(2), (64, 128, 64)).astype(jnp.bfloat16).astype(jnp.float32)

    def loss(params):
        out = embed.apply(params, ids)
        assert out.dtype == jnp.bfloat16
        return jnp.sum(out.astype(jnp.float32) * cotangent)

    grad = np.asarray(nn.unbox(jax.grad(loss)(params))["params"]["embedding"])
    flat, row_ids = np.asarray(cotangent, np.float64).reshape(-1, 64), np.asarray(ids).reshape(-1)
    expected = np.zeros_like(grad, np.float64)
    expected[:2] = np.stack([flat[row_ids == row].sum(0) for row in (0, 1)])
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rows", [2, SMALL_TABLE + 1])
def test_an_id_outside_the_table_looks_up_nan_whichever_the_lookup(rows):
    """A segment id of 2 under type_vocab_size=2 looked up a zero row by the one-hot contraction, and training went
    on without a word, and the gather read id -1 as the last row; both give NaN now (the gather's fill), which the
    loss and the run's non-finite check report."""
    config = TransformerConfig(vocab_size=2, hidden_size=8, num_heads=2, dtype="float32", param_dtype="float32")
    embed = Embed(config, rows, ("segment", "embed"))
    ids = jnp.array([[0, 1, rows, -1]], jnp.int32)
    params = embed.init(jax.random.key(1), ids)
    for looked_up in (embed.apply(params, ids), jax.jit(embed.apply)(params, ids)):
        finite = np.isfinite(np.asarray(looked_up)).all(axis=-1)
        np.testing.assert_array_equal(finite, [[True, True, False, False]])


def test_a_masked_position_outside_the_row_gathers_nan():
    """Position -1 read the row's last token, as NumPy counts from the end; past the row was NaN already."""
    hidden = jnp.arange(12.0).reshape(1, 3, 4)
    gathered = np.asarray(gather_positions(hidden, jnp.array([[2, 0, 3, -1]])))
    np.testing.assert_array_equal(gathered[0, :2], np.asarray(hidden)[0, [2, 0]])
    assert np.isnan(gathered[0, 2:]).all()


@pytest.mark.parametrize("rows", [2, SMALL_TABLE + 1])
def test_only_a_large_table_is_looked_up_by_a_gather_whose_gradient_scatters(rows):
    config = TransformerConfig(vocab_size=2, hidden_size=64, num_heads=4, dtype="bfloat16", param_dtype="float32")
    embed = Embed(config, rows, ("segment", "embed"))
    ids = jnp.zeros((8, 16), jnp.int32)
    params = embed.init(jax.random.key(1), ids)
    lowered = jax.jit(jax.grad(lambda p: jnp.sum(embed.apply(p, ids).astype(jnp.float32)))).lower(params).as_text()
    assert ("scatter" in lowered) == (rows > SMALL_TABLE)


def test_t5_relative_bias_is_its_table_rows_and_its_gradient_is_a_matmul():
    """T5's bias: 32 bucket rows looked up by every (query, key) pair by a one-hot contraction: the rows exactly
    (as a gather of the table), the gradient each bucket's float32 sum of cotangents, and no scatter-add."""
    config = TransformerConfig(vocab_size=2, hidden_size=64, num_heads=4, param_dtype="float32")
    bias = RelativeBias(config, bidirectional=True)
    positions = jnp.arange(96)[None, :]
    params = bias.init(jax.random.key(0), positions, positions)
    table = np.asarray(nn.unbox(params)["params"]["embedding"])
    buckets = np.asarray(relative_position_bucket(positions[:, None, :] - positions[:, :, None], True,
                                                  config.relative_buckets, config.relative_max_distance))
    np.testing.assert_array_equal(np.asarray(bias.apply(params, positions, positions)),
                                  table[buckets].transpose(0, 3, 1, 2))
    cotangent = np.asarray(jax.random.normal(jax.random.key(1), (1, 4, 96, 96)))

    def loss(params):
        return jnp.sum(bias.apply(params, positions, positions) * cotangent)

    grad = np.asarray(nn.unbox(jax.grad(loss)(params))["params"]["embedding"])
    per_pair = np.asarray(cotangent, np.float64).transpose(0, 2, 3, 1).reshape(-1, 4)
    expected = np.stack([per_pair[buckets.reshape(-1) == b].sum(0) for b in range(config.relative_buckets)])
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-4)
    assert "scatter" not in jax.jit(jax.grad(loss)).lower(params).as_text()
