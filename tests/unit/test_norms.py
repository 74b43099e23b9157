"""LayerNorm and RMSNorm with their own backward pass (built for GPUs): the values and gradients of the formulas
written out, also under explicit mesh axes, and only the input and each row's statistics kept for the backward
pass."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.sharding import PartitionSpec as P

from jaxlm.nn import layers
from jaxlm.nn.layers import normalize

KEYS = jax.random.split(jax.random.key(0), 4)
X = jax.random.normal(KEYS[0], (4, 16, 64)) * 3 + 2  # rows with a mean well away from 0
SCALE, BIAS = 1 + 0.1 * jax.random.normal(KEYS[1], (64,)), jax.random.normal(KEYS[2], (64,))
COTANGENT = jax.random.normal(KEYS[3], X.shape)
EPS = 1e-6


def written_out(x, scale, bias, centre):
    x = x.astype(jnp.float32)
    centred = x - jnp.mean(x, axis=-1, keepdims=True) if centre else x
    y = centred * jax.lax.rsqrt(jnp.mean(jnp.square(centred), axis=-1, keepdims=True) + EPS) * scale
    return y if bias is None else y + bias


def _gradients(norm, x, centre):
    bias = BIAS if centre else None
    return jax.grad(lambda *args: jnp.sum(norm(*args) * COTANGENT), argnums=(0, 1, 2))(x, SCALE, bias)


@pytest.mark.parametrize("centre", [True, False], ids=["layernorm", "rmsnorm"])
def test_values_and_gradients_are_the_written_out_formulas(centre):
    ours = lambda x, s, b: normalize(x, s, b, EPS, centre, jnp.float32)  # noqa: E731
    plain = lambda x, s, b: written_out(x, s, b, centre)  # noqa: E731
    bias = BIAS if centre else None
    np.testing.assert_allclose(ours(X, SCALE, bias), plain(X, SCALE, bias), rtol=1e-6, atol=1e-6)
    for mine, theirs in zip(_gradients(ours, X, centre), _gradients(plain, X, centre)):
        if theirs is None:
            assert mine is None
            continue
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(theirs))))
    # bfloat16 activations: the output in bfloat16 as the float32 formula rounds it, the input's gradient in
    # bfloat16 within its resolution of the float32 one
    x16 = X.astype(jnp.bfloat16)
    y16 = normalize(x16, SCALE, bias, EPS, centre, jnp.bfloat16)
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y16, plain(x16, SCALE, bias).astype(jnp.bfloat16))
    grad16 = _gradients(lambda x, s, b: normalize(x, s, b, EPS, centre, jnp.bfloat16), x16, centre)[0]
    truth = _gradients(plain, x16.astype(jnp.float32), centre)[0]
    assert grad16.dtype == jnp.bfloat16
    np.testing.assert_allclose(grad16.astype(jnp.float32), truth, rtol=1e-2, atol=1e-2 * float(jnp.max(jnp.abs(truth))))


def test_the_backward_pass_keeps_the_input_and_the_rows_statistics():
    x16 = X.astype(jnp.bfloat16)
    _, backward = jax.vjp(lambda x: normalize(x, SCALE, BIAS, EPS, True, jnp.bfloat16), x16)
    kept = [leaf for leaf in jax.tree.leaves(backward) if hasattr(leaf, "shape")]
    assert sum(leaf.shape == x16.shape for leaf in kept) == 1
    assert [leaf.dtype for leaf in kept if leaf.shape == x16.shape] == [jnp.bfloat16]
    mean, rstd = [leaf[..., 0] for leaf in kept if leaf.shape == (*X.shape[:-1], 1)]
    rows = x16.astype(jnp.float32)
    np.testing.assert_allclose(mean, jnp.mean(rows, axis=-1), rtol=1e-6)
    np.testing.assert_allclose(rstd, jax.lax.rsqrt(jnp.var(rows, axis=-1) + EPS), rtol=1e-5)


def test_gradients_keep_their_primals_layouts_under_explicit_axes():
    """Activations split over the batch and the features (explicit axes type the layout): the scale's and
    bias's gradients come back unsplit, as the parameters went in, and equal one device's."""
    mesh = jax.make_mesh((2, 4), ("data", "tensor"))
    expected = _gradients(lambda x, s, b: normalize(x, s, b, EPS, True, jnp.float32), X, True)
    with jax.set_mesh(mesh):
        assert mesh.are_all_axes_explicit
        x = jax.device_put(X, P("data", None, "tensor"))
        got = jax.jit(lambda x: _gradients(lambda x, s, b: normalize(x, s, b, EPS, True, jnp.float32), x, True))(x)
    assert [tuple(g.sharding.spec) for g in got] == [("data", None, "tensor"), (None,), (None,)]
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


def test_the_norm_layers_take_their_backward_pass_when_built_for_gpus(monkeypatch):
    calls = []
    monkeypatch.setattr(layers, "normalize", lambda *args: calls.append(args) or normalize(*args))
    for platform in ("gpu", "cpu"):
        monkeypatch.setattr(layers, "target_platform", lambda: platform)
        y = layers.norm(X, SCALE, BIAS, EPS, True, jnp.float32)
        np.testing.assert_allclose(y, written_out(X, SCALE, BIAS, True), rtol=1e-6, atol=1e-6)
    assert len(calls) == 1


def test_statistics_from_one_read_hold_rows_far_from_zero():
    """The GPU's forward pass takes the variance as E[x^2] - mean^2 in float32: rows whose mean lies over eight
    deviations from 0 keep it within 1e-5 of the two-pass formula, and a constant row's stays 0, not negative."""
    rows = jnp.concatenate([X + 8 * 3, jnp.full((1, 16, 64), 5.0)])
    for x in (rows, rows.astype(jnp.bfloat16)):
        (mean, rstd), (mean2, rstd2) = layers._statistics_in_one_read(x, EPS, True), layers._statistics(x, EPS, True)
        np.testing.assert_allclose(mean, mean2, rtol=1e-6)
        np.testing.assert_allclose(rstd[:-1], rstd2[:-1], rtol=1e-5)
        np.testing.assert_array_equal(rstd[-1], jax.lax.rsqrt(jnp.float32(EPS)))
