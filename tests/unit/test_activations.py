"""The GELUs with their own backward passes, keeping only their input. GPT-2's tanh GELU: the same values as
jax.nn.gelu, the same gradient as its autodiff in float32 and a closer one in bfloat16. BERT's exact GELU: the
values and gradients of PyTorch's (the formula Hugging Face's BERT runs)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxlm.nn.layers import ACTIVATIONS, gelu, gelu_tanh

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


@pytest.mark.parametrize("activation", [gelu_tanh, gelu])
def test_the_gelus_keep_only_their_input_for_the_backward_pass(activation):
    x = X.astype(jnp.bfloat16)
    saved = [leaf for leaf in jax.tree.leaves(jax.vjp(activation, x)[1]) if getattr(leaf, "shape", ()) == x.shape]
    plain = [leaf for leaf in jax.tree.leaves(jax.vjp(_plain, x)[1]) if getattr(leaf, "shape", ()) == x.shape]
    assert len(saved) == 1 and jnp.array_equal(saved[0], x)
    assert len(plain) >= 2


def test_exact_gelu_matches_pytorch_values_and_gradients():
    assert ACTIVATIONS["gelu"] is gelu
    theirs = torch.tensor(np.asarray(X), requires_grad=True)
    torch.nn.functional.gelu(theirs).sum().backward()
    assert np.allclose(gelu(X), torch.nn.functional.gelu(theirs).detach().numpy(), atol=1e-6, rtol=0)
    assert np.allclose(_grad(gelu, X), theirs.grad.numpy(), atol=1e-6, rtol=0)
    half = X.astype(jnp.bfloat16)
    their_half = torch.tensor(np.asarray(half.astype(jnp.float32))).to(torch.bfloat16)
    ours = np.asarray(gelu(half).astype(jnp.float32))
    assert np.allclose(ours, torch.nn.functional.gelu(their_half).float().numpy(), rtol=2 ** -8, atol=2e-5)
