"""On a GPU: the cudnn and flash attention kernels against xla, for BERT (padding), a decoder (causal,
packed documents) and T5's encoder (relative bias shared by the batch, its gradient too): largest output and
gradient difference from xla and forward+backward time of each, without dropout (cuDNN has none), then flash
and xla with dropout 0.1 (their masks differ: times only).

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


# (kernel, attention dropout); cuDNN's kernel only where there is a GPU (the CPU can check the script, small)
RUNS = [("xla", 0.0), ("cudnn", 0.0), ("flash", 0.0), ("xla", 0.1), ("flash", 0.1)]
if jax.default_backend() != "gpu":
    RUNS.remove(("cudnn", 0.0))


def case(name, batch, length, heads, kv_heads, causal, packed, padded, bias=False):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((batch, length, heads, 64)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((batch, length, kv_heads, 64)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((batch, length, kv_heads, 64)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((1, heads, length, length)), jnp.float32) if bias else None
    lengths = rng.integers(length // 2, length + 1, batch) if padded else np.full(batch, length)
    padding = jnp.asarray(np.arange(length)[None, :] < lengths[:, None])
    segments = jnp.asarray(np.arange(length)[None, :].repeat(batch, 0) // (length // 4)) if packed else None
    kwargs = dict(padding_mask=padding if padded else None, causal=causal, segment_ids=segments)
    results, line = {}, f"{name:34s}"
    for kernel, rate in RUNS:
        def attention(q, k, v, b):
            return dot_product_attention(q, k, v, kernel=kernel, bias=b, dropout_rate=rate,
                                         dropout_rng=jax.random.key(1) if rate else None, **kwargs)
        forward = jax.jit(attention)
        loss = jax.jit(jax.grad(lambda q, k, v, b: jnp.sum(attention(q, k, v, b).astype(jnp.float32) ** 2),
                                argnums=(0, 1, 2) if b is None else (0, 1, 2, 3)))
        results[kernel, rate] = (forward(q, k, v, b), loss(q, k, v, b))
        line += f"  {kernel}{' drop' if rate else ''} {timed(loss, q, k, v, b):.2f} ms"
    real = np.asarray(padding)[:, :, None, None]
    for kernel in dict.fromkeys(k for k, rate in RUNS if k != "xla" and not rate):
        out_diff = float(np.max(np.abs(np.asarray(results["xla", 0.0][0], np.float32)
                                       - np.asarray(results[kernel, 0.0][0], np.float32)) * real))
        grad_diff = max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(c, np.float32)))
                              / np.max(np.abs(np.asarray(a, np.float32))))
                        for a, c in zip(results["xla", 0.0][1], results[kernel, 0.0][1]))
        line += f"  {kernel}: out max|diff| {out_diff:.4f}, grads' max|diff| / max|grad| {grad_diff:.4f}"
    print(line, flush=True)


if __name__ == "__main__":
    print(jax.devices()[0].device_kind)
    case("bert padding, 128", 256, 128, 12, 12, causal=False, packed=False, padded=True)
    case("bert padding, 512", 32, 512, 12, 12, causal=False, packed=False, padded=True)
    case("decoder causal, 1024", 16, 1024, 12, 12, causal=True, packed=False, padded=False)
    case("decoder causal packed GQA, 1024", 16, 1024, 12, 4, causal=True, packed=True, padded=False)
    case("t5 encoder bias padding, 512", 64, 512, 12, 12, causal=False, packed=False, padded=True, bias=True)
