"""FP8 matmuls (model.fp8): the rounding really happens in the formats and at the scales it claims, and
a Dense layer's output and gradients stay within FP8's error of the plain bfloat16 path."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.models.config import TransformerConfig
from jaxlm.nn.fp8 import BACKWARD, FORWARD, backward_fp8, current_scale, forward_fp8
from jaxlm.nn.layers import Dense


def on_grid(values: jax.Array, scale: jax.Array, q_dtype) -> bool:
    """Every value / scale is a number of the format (up to the float32 rounding of the division)."""
    scaled = np.asarray(values, np.float32) / np.float32(scale)
    return np.allclose(scaled.astype(q_dtype).astype(np.float32), scaled, rtol=1e-6, atol=0)


def relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def activations():
    return jax.random.normal(jax.random.key(0), (4, 16, 64), jnp.float32) * 3.0


def test_forward_rounds_to_e4m3_at_the_tensors_own_scale(activations):
    scale = current_scale(activations, FORWARD)
    assert float(scale) == pytest.approx(float(jnp.max(jnp.abs(activations))) / 448.0)
    rounded = forward_fp8(activations)
    assert on_grid(rounded, scale, FORWARD)
    assert not np.array_equal(np.asarray(rounded), np.asarray(activations))
    # three mantissa bits: half a unit in the last place is 2**-4 of the value, in the normal range
    normal = np.abs(np.asarray(activations)) > 2.0 ** -6 * float(scale)
    error = np.abs(np.asarray(rounded) - np.asarray(activations)) / np.abs(np.asarray(activations))
    assert error[normal].max() <= 2.0 ** -4
    assert float(jnp.max(jnp.abs(rounded))) == pytest.approx(float(jnp.max(jnp.abs(activations))))


def test_zeros_keep_a_unit_scale():
    assert float(current_scale(jnp.zeros((3, 3)), FORWARD)) == 1.0
    assert not np.any(np.asarray(forward_fp8(jnp.zeros((3, 3)))))


def test_gradients_pass_forward_rounding_and_are_rounded_to_e5m2(activations):
    cotangent = jax.random.normal(jax.random.key(1), activations.shape) * 1e-3
    _, through_input = jax.vjp(forward_fp8, activations)
    np.testing.assert_array_equal(through_input(cotangent)[0], cotangent)
    value, through_output = jax.vjp(backward_fp8, activations)
    np.testing.assert_array_equal(value, activations)
    (rounded,) = through_output(cotangent)
    assert on_grid(rounded, current_scale(cotangent, BACKWARD), BACKWARD)
    assert 0 < relative_error(rounded, cotangent) < 2.0 ** -3


@pytest.mark.parametrize("contract", [1, 2])
def test_fp8_dense_follows_the_plain_dense(activations, contract):
    plain = TransformerConfig(hidden_size=64, num_heads=4)
    fp8 = TransformerConfig(hidden_size=64, num_heads=4, fp8=True)
    x = activations.reshape(4, 16, 8, 8) if contract == 2 else activations
    layers = [Dense(c, 32, ("a",) * contract, ("b",), contract=contract, fp8_eligible=True) for c in (plain, fp8)]
    params = layers[0].init(jax.random.key(2), x)
    cotangent = jax.random.normal(jax.random.key(3), (4, 16, 32), jnp.bfloat16)

    def forward_and_grads(layer):
        y, pullback = jax.vjp(lambda p, x: layer.apply(p, x), params, x)
        grad_params, grad_x = pullback(cotangent)
        grad_params = nn.unbox(grad_params)["params"]
        return y, grad_params["kernel"], grad_params["bias"], grad_x

    ours, theirs = forward_and_grads(layers[1]), forward_and_grads(layers[0])
    for name, a, b in zip(("output", "kernel gradient", "bias gradient", "input gradient"), ours, theirs):
        error = relative_error(a, b)
        assert error < 0.08, f"{name}: {error}"
        assert name == "bias gradient" or error > 1e-3, f"{name} was not rounded to FP8"


def test_only_the_layers_projections_run_in_fp8(activations):
    """A head's Dense (not `fp8_eligible`) stays at the compute dtype under config.fp8."""
    config = TransformerConfig(hidden_size=64, num_heads=4, fp8=True)
    head, projection = (Dense(config, 32, ("a",), ("b",), fp8_eligible=eligible) for eligible in (False, True))
    params = head.init(jax.random.key(2), activations)
    plain = Dense(TransformerConfig(hidden_size=64, num_heads=4), 32, ("a",), ("b",)).apply(params, activations)
    np.testing.assert_array_equal(head.apply(params, activations), plain)
    assert relative_error(projection.apply(params, activations), plain) > 1e-3
