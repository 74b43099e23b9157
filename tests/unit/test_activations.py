"""GELU (exact and tanh) with its own backward pass: the same values as jax.nn.gelu, the same gradient as its
autodiff in float32 and a closer one in bfloat16, and only the input kept for the backward pass."""
import jax
import jax.numpy as jnp
import pytest

from jaxlm.nn.layers import gelu, gelu_tanh

X = jax.random.normal(jax.random.key(0), (4096,), jnp.float32) * 3


def _grad(fn, x):
    return jax.vmap(jax.grad(fn))(x)


@pytest.mark.parametrize("ours, approximate", [(gelu, False), (gelu_tanh, True)])
def test_gelu_matches_jax_values_and_gradients(ours, approximate):
    plain = lambda v: jax.nn.gelu(v, approximate=approximate)  # noqa: E731
    for dtype in (jnp.float32, jnp.bfloat16):
        assert jnp.array_equal(ours(X.astype(dtype)), plain(X.astype(dtype)))
    assert jnp.allclose(_grad(ours, X), _grad(plain, X), atol=2e-6, rtol=0)
    truth = _grad(plain, X.astype(jnp.bfloat16).astype(jnp.float32))
    ours_error = jnp.max(jnp.abs(_grad(ours, X.astype(jnp.bfloat16)).astype(jnp.float32) - truth))
    plain_error = jnp.max(jnp.abs(_grad(plain, X.astype(jnp.bfloat16)).astype(jnp.float32) - truth))
    assert ours_error <= plain_error and ours_error < 8e-3


@pytest.mark.parametrize("ours, approximate", [(gelu, False), (gelu_tanh, True)])
def test_gelu_keeps_only_its_input_for_the_backward_pass(ours, approximate):
    x = X.astype(jnp.bfloat16)
    saved = [leaf for leaf in jax.tree.leaves(jax.vjp(ours, x)[1]) if getattr(leaf, "shape", ()) == x.shape]
    plain = [leaf for leaf in jax.tree.leaves(jax.vjp(lambda v: jax.nn.gelu(v, approximate=approximate), x)[1])
             if getattr(leaf, "shape", ()) == x.shape]
    assert len(saved) == 1 and jnp.array_equal(saved[0], x)
    assert len(plain) >= 2
