"""On a GPU: the cudnn attention kernel against xla, for BERT (padding) and a decoder (causal,
packed documents): largest output difference and forward+backward time of each.

    PYTHONPATH=. python3 bench/attention_kernels.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.nn.attention import dot_product_attention


def timed(fn, *args, repeats=20):
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeats * 1e3


def case(name, batch, length, heads, kv_heads, causal, packed, padded):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((batch, length, heads, 64)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((batch, length, kv_heads, 64)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((batch, length, kv_heads, 64)), jnp.bfloat16)
    lengths = rng.integers(length // 2, length + 1, batch) if padded else np.full(batch, length)
    padding = jnp.asarray(np.arange(length)[None, :] < lengths[:, None])
    segments = jnp.asarray(np.arange(length)[None, :].repeat(batch, 0) // (length // 4)) if packed else None
    kwargs = dict(padding_mask=padding if padded else None, causal=causal, segment_ids=segments)
    results = {}
    for kernel in ("xla", "cudnn"):
        forward = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, kernel=kernel, **kwargs))
        loss = jax.jit(jax.grad(lambda q, k, v: jnp.sum(
            dot_product_attention(q, k, v, kernel=kernel, **kwargs).astype(jnp.float32) ** 2), argnums=(0, 1, 2)))
        results[kernel] = (forward(q, k, v), loss(q, k, v), timed(loss, q, k, v))
    real = np.asarray(padding)[:, :, None, None]
    out_diff = float(np.max(np.abs(np.asarray(results["xla"][0], np.float32) - np.asarray(results["cudnn"][0], np.float32)) * real))
    grad_diff = max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
                    for a, b in zip(results["xla"][1], results["cudnn"][1]))
    print(f"{name:34s} out max|diff| {out_diff:.4f}  dq/dk/dv max|diff| {grad_diff:.4f}  "
          f"fwd+bwd ms xla {results['xla'][2]:.2f} cudnn {results['cudnn'][2]:.2f}")


if __name__ == "__main__":
    print(jax.devices()[0].device_kind)
    case("bert padding, 128", 256, 128, 12, 12, causal=False, packed=False, padded=True)
    case("bert padding, 512", 32, 512, 12, 12, causal=False, packed=False, padded=True)
    case("decoder causal, 1024", 16, 1024, 12, 12, causal=True, packed=False, padded=False)
    case("decoder causal packed GQA, 1024", 16, 1024, 12, 4, causal=True, packed=True, padded=False)
