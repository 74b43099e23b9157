"""XLA attention under mixed precision (the logits' gradient rounded once for the bias's sum, `add_bias`; the
probabilities dropped out in the values' dtype) against the same attention in float32: outputs and gradients;
what the cudnn kernel hands cuDNN (the bias's dtype) and which gradients it has cuDNN compute."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.nn.attention import add_bias, dot_product_attention
from jaxlm.nn.dropout import keep_mask
from jaxlm.train.gpu_targets import cudnn_attention_traced

BATCH, LENGTH, HEADS, HEAD_DIM, RATE = 3, 24, 4, 16, 0.1


def _inputs():
    keys = jax.random.split(jax.random.key(0), 5)
    q, k, v = (jax.random.normal(key, (BATCH, LENGTH, HEADS, HEAD_DIM)) for key in keys[:3])
    bias = 2.0 * jax.random.normal(keys[3], (1, HEADS, LENGTH, LENGTH))
    padding = jnp.arange(LENGTH)[None, :] < jnp.array([[LENGTH], [LENGTH - 5], [7]])
    cotangent = jax.random.normal(keys[4], (BATCH, LENGTH, HEADS, HEAD_DIM))
    return q, k, v, bias, padding, cotangent


def _float32_attention(q, k, v, bias, padding, rng):
    """The textbook computation, all in float32, with keep_mask's mask."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q * HEAD_DIM ** -0.5, k) + bias
    weights = jax.nn.softmax(jnp.where(padding[:, None, None, :], logits, jnp.finfo(jnp.float32).min), axis=-1)
    keep, kept = keep_mask(rng, 1.0 - RATE, weights.shape)
    return jnp.einsum("bhqk,bkhd->bqhd", jnp.where(keep, weights / kept, 0.0), v)


def test_add_bias_has_the_gradients_of_a_broadcast_add():
    """The logits' gradient exactly as the plain add's; the bias's summed from it rounded to the logits' dtype."""
    q, _, _, bias, _, _ = _inputs()
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, q)
    for dtype in (jnp.float32, jnp.bfloat16):
        ours = jax.grad(lambda x, b: jnp.sum(jnp.sin(add_bias(x, b))), (0, 1))
        plain = jax.grad(lambda x, b: jnp.sum(jnp.sin(x.astype(jnp.float32) + b)), (0, 1))
        (dx, dbias), (dx_plain, dbias_plain) = ours(logits.astype(dtype), bias), plain(logits.astype(dtype), bias)
        assert dx.dtype == dtype and dbias.dtype == jnp.float32 and dbias.shape == bias.shape
        np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(dx_plain, np.float32))
        tolerance = 1e-6 if dtype == jnp.float32 else 0.01
        np.testing.assert_allclose(dbias, dbias_plain, atol=tolerance * np.abs(dbias_plain).max())


def test_bf16_attention_with_bias_and_dropout_follows_float32():
    q, k, v, bias, padding, cotangent = _inputs()
    rng = jax.random.key(7)

    def ours(q, k, v, bias):
        out = dot_product_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), padding_mask=padding, bias=bias,
                                    dropout_rate=RATE, dropout_rng=rng)
        return out.astype(jnp.float32)

    def reference(q, k, v, bias):
        return _float32_attention(q, k, v, bias, padding, rng)

    grads = jax.grad(lambda *a: jnp.sum(ours(*a) * cotangent), (0, 1, 2, 3))(q, k, v, bias)
    expected_grads = jax.grad(lambda *a: jnp.sum(reference(*a) * cotangent), (0, 1, 2, 3))(q, k, v, bias)
    # within 1.5% of the largest element: bf16's rounding (0.5–0.8% at 128 tokens), where adding the bias in
    # bf16 made the queries' gradient 2.7% off
    expected = reference(q, k, v, bias)
    assert float(jnp.abs(ours(q, k, v, bias) - expected).max()) < 0.015 * float(jnp.abs(expected).max())
    for name, got, want in zip(("query", "key", "value", "bias"), grads, expected_grads):
        assert float(jnp.abs(got - want).max()) < 0.015 * float(jnp.abs(want).max()), name


def test_cudnn_gets_the_bias_in_the_queries_dtype(monkeypatch):
    """cuDNN's bias gradient is wrong for a float32 bias (jax-ml/jax#32242), so the cudnn kernel casts T5's
    float32 bias to the queries' dtype first and its gradient comes back through the cast. This CPU has no
    cuDNN: jax.nn.dot_product_attention is run as XLA's, recording the bias the cudnn branch hands it."""
    q, k, v, bias, padding, cotangent = _inputs()
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    handed = []
    plain = jax.nn.dot_product_attention

    def as_xla(*args, implementation=None, **kwargs):
        handed.append((implementation, kwargs["bias"].dtype))
        return plain(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", as_xla)

    def loss(bias, kernel):
        out = dot_product_attention(q, k, v, kernel=kernel, bias=bias, padding_mask=padding)
        return jnp.sum(out.astype(jnp.float32) * cotangent)

    ours = jax.grad(loss)(bias, "cudnn")
    assert handed == [("cudnn", jnp.bfloat16)] and ours.dtype == jnp.float32
    reference = jax.grad(loss)(bias, "xla")
    assert np.allclose(ours, reference, atol=0.02 * float(jnp.max(jnp.abs(reference))))


def _cudnn_backward_outputs(**attention) -> list[str]:
    """The shapes of what cuDNN's backward pass writes for the cudnn kernel's gradients, from its jaxpr traced as
    for an H100 (JAX's cuDNN checks answered from the target description; nothing is compiled or run)."""
    q, k, v, *_ = (x.astype(jnp.bfloat16) if x.ndim == 4 else x for x in _inputs())

    def loss(q, k, v):
        return jnp.sum(dot_product_attention(q, k, v, kernel="cudnn", **attention).astype(jnp.float32))

    with cudnn_attention_traced():
        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    backward = [e for e in jaxpr.eqns if e.primitive.name.startswith("dot_product_attention_bwd")]
    assert len(backward) == 1, [e.primitive.name for e in jaxpr.eqns]
    return [str(out.aval.shape) for out in backward[0].outvars]


def test_cudnn_computes_no_gradient_for_the_mask_of_packed_documents():
    """The mask that keeps packed documents apart reaches cuDNN as a bias, whose gradient nothing reads: its
    backward pass writes the queries', keys' and values' gradients alone. A real bias (T5's) keeps its gradient."""
    segments = jnp.array([[1] * 10 + [2] * 14, [1] * 24, [1] * 7 + [0] * 17])
    masked = _cudnn_backward_outputs(causal=True, segment_ids=segments, padding_mask=segments > 0)
    assert masked == [str((BATCH, LENGTH, HEADS, HEAD_DIM))] * 3
    bias = _inputs()[3].astype(jnp.bfloat16)
    assert _cudnn_backward_outputs(bias=bias)[3:] == [str((1, HEADS, LENGTH, LENGTH))]
