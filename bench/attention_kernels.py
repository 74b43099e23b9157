"""On a GPU: the cudnn and flash attention kernels against xla, for BERT (padding), a decoder (causal,
packed documents) and T5's encoder (relative bias shared by the batch, its gradient too): largest output and
gradient difference from xla and forward+backward time of each, without dropout (cuDNN has none), then flash
and xla with dropout 0.1 (their masks differ: times only).

`--sweep` times the flash kernels' forward and backward passes, with attention dropout 0.1, under other
settings (`jaxlm/nn/flash.py`'s module constants: tile sizes, Triton warps and stages, the bias's gradient
stored, fused into the queries' kernel with its query rows, key groups and batch chunks, or in a kernel of its
own) on T5's encoder, BERT's and GPT-2's shapes, and
checks each setting's T5 gradients against xla's without dropout. Without a GPU it compiles each setting for a
compile-only H100 instead (JAX's CUDA plugin on the path), which finds the settings the chip cannot take.

    PYTHONPATH=. python3 bench/attention_kernels.py [--sweep]
    PYTHONPATH=.venv/cuda-plugin:. JAX_PLATFORMS=cpu python3 bench/attention_kernels.py --sweep
"""
import argparse
import contextlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import triton as plgpu

from jaxlm.nn import flash
from jaxlm.nn.attention import dot_product_attention


def timed(fn, *args, repeats=20):
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeats * 1e3


def relative_difference(expected, got) -> float:
    """max |expected - got| / max |expected|."""
    expected, got = np.asarray(expected, np.float32), np.asarray(got, np.float32)
    return float(np.max(np.abs(expected - got)) / np.max(np.abs(expected)))


# (kernel, attention dropout); cuDNN's kernel only where there is a GPU (the CPU can check the script, small)
RUNS = [("xla", 0.0), ("cudnn", 0.0), ("flash", 0.0), ("xla", 0.1), ("flash", 0.1)]
if jax.default_backend() != "gpu":
    RUNS.remove(("cudnn", 0.0))


def attention_inputs(batch, length, heads, padded, bias, kv_heads=None, device=None):
    """(q, k, v, bias, padding mask, dropout key) of a shape, random, the absent ones None; with `device`
    (compile-only) their shapes alone."""
    key_type = jax.eval_shape(lambda: jax.random.key(0)).dtype
    shapes = [((batch, length, heads, 64), jnp.bfloat16)] + [((batch, length, kv_heads or heads, 64), jnp.bfloat16)] * 2
    shapes += [((1, heads, length, length), jnp.float32) if bias else None,
               ((batch, length), jnp.bool_) if padded else None, ((), key_type)]
    if device is not None:
        return [None if s is None else jax.ShapeDtypeStruct(*s, sharding=device) for s in shapes]
    rng = np.random.default_rng(0)
    lengths = rng.integers(length // 2, length + 1, batch)
    return [jnp.asarray(rng.standard_normal(s[0]), s[1]) for s in shapes[:3]] + [
        None if shapes[3] is None else jnp.asarray(rng.standard_normal(shapes[3][0]), jnp.float32),
        None if shapes[4] is None else jnp.asarray(np.arange(length)[None, :] < lengths[:, None]),
        jax.random.key(1)]


def case(name, batch, length, heads, kv_heads, causal, packed, padded, bias=False):
    q, k, v, b, padding, _ = attention_inputs(batch, length, heads, padded, bias, kv_heads)
    segments = jnp.asarray(np.arange(length)[None, :].repeat(batch, 0) // (length // 4)) if packed else None
    kwargs = dict(padding_mask=padding, causal=causal, segment_ids=segments)
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
    real = np.ones((batch, length, 1, 1), bool) if padding is None else np.asarray(padding)[:, :, None, None]
    for kernel in dict.fromkeys(k for k, rate in RUNS if k != "xla" and not rate):
        out_diff = float(np.max(np.abs(np.asarray(results["xla", 0.0][0], np.float32)
                                       - np.asarray(results[kernel, 0.0][0], np.float32)) * real))
        grad_diff = max(relative_difference(a, c) for a, c in zip(results["xla", 0.0][1], results[kernel, 0.0][1]))
        line += f"  {kernel}: out max|diff| {out_diff:.4f}, grads' max|diff| / max|grad| {grad_diff:.4f}"
    print(line, flush=True)


def triton(num_warps=4, num_stages=3):
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def every_kernel(**params) -> dict:
    """The module constants that give all four kernels these Triton parameters."""
    return dict(TRITON=triton(**params), BIAS_SUM_TRITON=triton(**params))


# name: flash's module constants it changes (the first is the kernels' own: 4 warps, 3 stages, the bias's gradient
# summed in 2); on an H200 "2 stages" (the default before) took 2.13, 0.61 and 0.90 ms, "3 stages" 2.03, 0.59, 0.86
SETTINGS = {
    "as built": {},
    "2 stages": every_kernel(num_stages=2),
    "the bias's gradient summed in dq's kernel, dq rows 16, groups of 8": dict(BIAS_GRADIENT="fused"),
    "fused, dq rows 32, groups of 4": dict(BIAS_GRADIENT="fused", DQ_BLOCK=32, GROUP_BLOCKS=4),
    "fused, dq rows 64, groups of 2": dict(BIAS_GRADIENT="fused", DQ_BLOCK=64, GROUP_BLOCKS=2),
    "fused, dq rows 64, groups of 1": dict(BIAS_GRADIENT="fused", DQ_BLOCK=64, GROUP_BLOCKS=1),
    "fused, dq rows 64, groups of 2, 8 warps, 2 stages": dict(BIAS_GRADIENT="fused", DQ_BLOCK=64, GROUP_BLOCKS=2,
                                                              **every_kernel(num_warps=8, num_stages=2)),
    "fused, dq rows 64, groups of 2, 8 chunks": dict(BIAS_GRADIENT="fused", DQ_BLOCK=64, GROUP_BLOCKS=2,
                                                     BIAS_CHUNKS=8),
    "the bias's gradient in a kernel of its own": dict(BIAS_GRADIENT="separate"),
    "the bias's gradient in a kernel of its own, 8 warps, 2 stages": dict(BIAS_GRADIENT="separate",
                                                                          **every_kernel(num_warps=8, num_stages=2)),
    "8 warps, 2 stages": every_kernel(num_warps=8, num_stages=2),
    "4 stages": every_kernel(num_stages=4),
    "tiles of 128, 8 warps, 2 stages": dict(BLOCK=128, **every_kernel(num_warps=8, num_stages=2)),
    "tiles of 128, 4 warps, 2 stages": dict(BLOCK=128, **every_kernel(num_stages=2)),
    "tiles of 128, 8 warps, 3 stages (too much shared memory)": dict(BLOCK=128, **every_kernel(num_warps=8)),
    "tiles of 32": dict(BLOCK=32),
    "tiles of 32, 2 warps": dict(BLOCK=32, **every_kernel(num_warps=2)),
    "fused, tiles of 128, 8 warps, 2 stages, dq rows 32, groups of 2": dict(
        BIAS_GRADIENT="fused", BLOCK=128, DQ_BLOCK=32, GROUP_BLOCKS=2, **every_kernel(num_warps=8, num_stages=2)),
}
TRITON_CALL = 'custom_call_target="__gpu$xla.gpu.triton"'
# (name, batch, length, heads, causal, padded, bias): T5-base's encoder, BERT-base at 128, GPT-2 at 1024
SWEEP_SHAPES = [("t5 encoder", 64, 512, 12, False, True, True), ("bert 128", 256, 128, 12, False, True, False),
                ("gpt2 1024", 16, 1024, 12, True, False, False)]


@contextlib.contextmanager
def flash_settings(values):
    """The flash kernels traced with other values of `jaxlm.nn.flash`'s module constants (read when a kernel is
    traced), and traced afresh."""
    before = {name: getattr(flash, name) for name in values}
    for name, value in values.items():
        setattr(flash, name, value)
    jax.clear_caches()
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(flash, name, value)
        jax.clear_caches()


def sweep_grad(kernel, causal, rate, bias):
    """jit of the gradient of sum(attention ** 2) in q, k, v (and the bias, with one)."""
    def loss(q, k, v, b, padding, key):
        out = dot_product_attention(q, k, v, kernel=kernel, bias=b, padding_mask=padding, causal=causal,
                                    dropout_rate=rate, dropout_rng=key if rate else None)
        return jnp.sum(out.astype(jnp.float32) ** 2)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3) if bias else (0, 1, 2)))


def _reason(error: Exception) -> str:
    """The last line of why a setting failed, short enough for a table cell."""
    return str(error).strip().splitlines()[-1][:80]


def sweep():
    """Each setting's fwd+bwd ms per shape (or, without a GPU, whether it compiles for an H100)."""
    on_gpu = jax.default_backend() == "gpu"
    device, target = None, contextlib.nullcontext
    if not on_gpu:
        from jaxlm.train import aot  # needs JAX's CUDA plugin: only without a GPU
        h100 = aot.topology_devices("h100")[0]
        # the mesh in context is how the kernels know they are built for a GPU (not Pallas's interpret mode)
        mesh = jax.sharding.Mesh([h100], ("data",))
        device, target = jax.sharding.SingleDeviceSharding(h100), lambda: jax.set_mesh(mesh)
    inputs = {shape[0]: attention_inputs(*shape[1:4], *shape[5:], device=device) for shape in SWEEP_SHAPES}
    reference = None
    if on_gpu:
        reference = sweep_grad("xla", False, 0.0, True)(*inputs["t5 encoder"])
    print("| setting | " + " | ".join(f"{s[0]} ms" for s in SWEEP_SHAPES) + " | t5 grads' max|diff| / max|grad| |")
    print("|---" * (len(SWEEP_SHAPES) + 2) + "|")
    for name, values in SETTINGS.items():
        cells = []
        with target(), flash_settings(values):
            for shape_name, _, _, _, causal, _, bias in SWEEP_SHAPES:
                grad = sweep_grad("flash", causal, 0.1, bias)
                try:
                    if on_gpu:
                        cells.append(f"{timed(grad, *inputs[shape_name]):.2f}")
                    else:
                        text = grad.lower(*inputs[shape_name]).compile().as_text()
                        cells.append("compiles" if TRITON_CALL in text else "compiles, but not as Triton kernels")
                except Exception as error:  # a setting the chip cannot take: its reason, and on to the next
                    cells.append(_reason(error))
            check = "n/a"
            if on_gpu:
                try:
                    ours = sweep_grad("flash", False, 0.0, True)(*inputs["t5 encoder"])
                    check = f"{max(relative_difference(a, c) for a, c in zip(reference, ours)):.4f}"
                except Exception as error:
                    check = _reason(error)
        print(f"| {name} | " + " | ".join(cells) + f" | {check} |", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time the flash kernels under other tile settings")
    if parser.parse_args().sweep:
        raise SystemExit(sweep())
    print(jax.devices()[0].device_kind)
    case("bert padding, 128", 256, 128, 12, 12, causal=False, packed=False, padded=True)
    case("bert padding, 512", 32, 512, 12, 12, causal=False, packed=False, padded=True)
    case("decoder causal, 1024", 16, 1024, 12, 12, causal=True, packed=False, padded=False)
    case("decoder causal packed GQA, 1024", 16, 1024, 12, 4, causal=True, packed=True, padded=False)
    case("t5 encoder bias padding, 512", 64, 512, 12, 12, causal=False, packed=False, padded=True, bias=True)
