"""The GELUs with their own backward passes, keeping only their input. GPT-2's tanh GELU: the same values as
jax.nn.gelu, the same gradient as its autodiff in float32 and a closer one in bfloat16. BERT's exact GELU: the
values and gradients of PyTorch's (the formula Hugging Face's BERT runs). T5's ReLU and the dropout after it,
keeping only their output: the values and gradients of the two written out, bit for bit."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxlm.nn.dropout import HASHED, Dropout
from jaxlm.nn.layers import ACTIVATIONS, gelu, gelu_tanh, relu_then

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


class _ReluDropout(nn.Module):
    rate: float
    ours: bool

    @nn.compact
    def __call__(self, x, deterministic):
        if self.ours:
            return relu_then(x, Dropout(self.rate), deterministic)
        return Dropout(self.rate)(jax.nn.relu(x), deterministic=deterministic)


@pytest.mark.parametrize("impl", ["threefry2x32", HASHED])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_relu_then_dropout_matches_the_two_written_out(impl, dtype):
    x = (jax.random.normal(jax.random.key(1), (8, 64, 96)) * 2).astype(dtype).at[0, 0, :4].set(0)
    cotangent = jax.random.normal(jax.random.key(2), x.shape).astype(dtype)
    rngs = {"dropout": jax.random.key(3, impl=impl)}
    for rate, deterministic in ((0.1, False), (0.5, False), (0.1, True), (0.0, False)):
        results = []
        for ours in (True, False):
            module = _ReluDropout(rate, ours)
            out, vjp = jax.vjp(lambda v: module.apply({}, v, deterministic, rngs=rngs), x)
            results.append((out, vjp(cotangent)[0]))
        (out, grad), (plain_out, plain_grad) = results
        assert jnp.array_equal(out, plain_out) and jnp.array_equal(grad, plain_grad), (rate, deterministic)
        dropped = float(jnp.mean((out == 0) & (x > 0)) / jnp.mean(x > 0))  # the share of positives dropped
        assert abs(dropped - (0.0 if deterministic else rate)) < 0.03, (rate, deterministic, dropped)


def test_relu_then_dropout_keeps_only_its_output():
    x = jax.random.normal(jax.random.key(1), (8, 64, 96), jnp.bfloat16)
    rngs = {"dropout": jax.random.key(3, impl=HASHED)}
    saved = {}
    for ours in (True, False):
        out, vjp = jax.vjp(lambda v: _ReluDropout(0.1, ours).apply({}, v, False, rngs=rngs), x)
        saved[ours] = [leaf for leaf in jax.tree.leaves(vjp) if getattr(leaf, "shape", ()) == x.shape]
    assert len(saved[True]) == 1 and jnp.array_equal(saved[True][0], out)
    assert any(leaf.dtype == jnp.bool_ for leaf in saved[False])  # relu's x > 0, which ours reads from its output
