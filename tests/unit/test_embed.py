"""Embedding lookups in bfloat16 compute: the table's gradient sums each row's tokens in float32."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.models.config import TransformerConfig
from jaxlm.nn.embed import Embed


def test_a_row_shared_by_many_tokens_gets_its_gradient_summed_in_float32():
    """BERT's token types: two rows, each looked up by thousands of tokens. The gradient must be the float32
    sum of the (bfloat16) cotangents; summed in bfloat16, some elements were off by several times their size."""
    config = TransformerConfig(vocab_size=2, hidden_size=64, dtype="bfloat16", param_dtype="float32")
    embed = Embed(config, 2, ("segment", "embed"))
    ids = jax.random.bernoulli(jax.random.key(0), 0.3, (64, 128)).astype(jnp.int32)
    params = embed.init(jax.random.key(1), ids)
    cotangent = jax.random.normal(jax.random.key(2), (64, 128, 64)).astype(jnp.bfloat16).astype(jnp.float32)

    def loss(params):
        out = embed.apply(params, ids)
        assert out.dtype == jnp.bfloat16
        return jnp.sum(out.astype(jnp.float32) * cotangent)

    grad = np.asarray(nn.unbox(jax.grad(loss)(params))["params"]["embedding"])
    flat, rows = np.asarray(cotangent, np.float64).reshape(-1, 64), np.asarray(ids).reshape(-1)
    expected = np.stack([flat[rows == row].sum(0) for row in (0, 1)])
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-3)
