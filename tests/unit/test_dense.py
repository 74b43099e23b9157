"""A Dense layer's numerics at the compute dtype: its bias's gradient summed in float32."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.models.presets import model_config
from jaxlm.nn.layers import Dense


def test_a_bfloat16_dense_sums_its_bias_gradient_in_float32():
    """Over 16k rows the bias's gradient is the float64 sum to float32's precision, where summing it in bfloat16
    (the broadcast's own transpose) left elements off by about a percent."""
    config = model_config("bert-tiny", dtype="bfloat16")
    dense = Dense(config, 64, ("embed",), ("mlp",))
    x = jax.random.normal(jax.random.key(0), (16384, 32), jnp.bfloat16)
    params = nn.unbox(dense.init(jax.random.key(1), x))
    cotangent = jax.random.normal(jax.random.key(2), (16384, 64), jnp.bfloat16) + 0.3

    def loss(params):
        return jnp.sum((dense.apply(params, x) * cotangent).astype(jnp.float32))

    bias_grad = np.asarray(jax.jit(jax.grad(loss))(params)["params"]["bias"])
    exact = np.asarray(cotangent, np.float64).sum(axis=0)
    np.testing.assert_allclose(bias_grad, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
