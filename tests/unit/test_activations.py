"""GPT-2's tanh GELU with its own backward pass: the same values as jax.nn.gelu, the same gradient as its
autodiff in float32 and a closer one in bfloat16, and only the input kept for the backward pass. BERT's exact
GELU is jax.nn.gelu itself."""
import jax
import jax.numpy as jnp

from jaxlm.nn.layers import ACTIVATIONS, gelu_tanh

X = jax.random.normal(jax.random.key(0), (4096,), jnp.float32) * 3


def _grad(fn, x):
    return jax.vmap(jax.grad(fn))(x)


def _plain(v):
    return jax.nn.gelu(v, approximate=True)


def test_gelu_tanh_matches_jax_values_and_gradients():
    for dtype in (jnp.float32, jnp.bfloat16):
        assert jnp.array_equal(gelu_tanh(X.astype(dtype)), _plain(X.astype(dtype)))
    assert jnp.allclose(_grad(gelu_tanh, X), _grad(_plain, X), atol=2e-6, rtol=0)
    truth = _grad(_plain, X.astype(jnp.bfloat16).astype(jnp.float32))
    ours_error = jnp.max(jnp.abs(_grad(gelu_tanh, X.astype(jnp.bfloat16)).astype(jnp.float32) - truth))
    plain_error = jnp.max(jnp.abs(_grad(_plain, X.astype(jnp.bfloat16)).astype(jnp.float32) - truth))
    assert ours_error <= plain_error and ours_error < 8e-3


def test_gelu_tanh_keeps_only_its_input_for_the_backward_pass():
    x = X.astype(jnp.bfloat16)
    saved = [leaf for leaf in jax.tree.leaves(jax.vjp(gelu_tanh, x)[1]) if getattr(leaf, "shape", ()) == x.shape]
    plain = [leaf for leaf in jax.tree.leaves(jax.vjp(_plain, x)[1]) if getattr(leaf, "shape", ()) == x.shape]
    assert len(saved) == 1 and jnp.array_equal(saved[0], x)
    assert len(plain) >= 2


def test_exact_gelu_is_jax_own():
    gelu = ACTIVATIONS["gelu"]
    assert jnp.array_equal(gelu(X), jax.nn.gelu(X, approximate=False))
    assert jnp.array_equal(_grad(gelu, X), _grad(lambda v: jax.nn.gelu(v, approximate=False), X))
