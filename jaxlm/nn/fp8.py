"""FP8 matmuls with current scaling: both inputs rounded to float8_e4m3fn and the output's gradient to
float8_e5m2, each at a per-tensor scale taken from its own absolute maximum in the same step.

Current scaling (torchao's "tensorwise" recipe) keeps no state: flax's `Fp8DotGeneralOp` scales by an
amax history that lives in an extra variable collection which the optimizer must overwrite, not
update, and which every checkpoint, restore and mesh change would have to carry. Here the scale costs
one reduction per tensor. The matmul itself is written as quantize-dequantize around a plain
`dot_general` (flax's `fp8_ops.qdq`), the form XLA's GPU compiler rewrites into an FP8 GEMM on Hopper;
elsewhere it runs as the same arithmetic at the compute dtype.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

FORWARD, BACKWARD = jnp.float8_e4m3fn, jnp.float8_e5m2


def current_scale(x: jax.Array, q_dtype) -> jax.Array:
    """amax(|x|) over the format's largest value, so that x / scale spans the format; 1 where x holds
    no finite non-zero maximum."""
    amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
    usable = (amax > 0) & jnp.isfinite(amax)
    return jnp.where(usable, amax / fp8_ops.get_fp8_max(q_dtype, jnp.float32), 1.0)


def quantized(x: jax.Array, q_dtype) -> jax.Array:
    """x rounded to `q_dtype` at its current scale, given back in x's dtype."""
    return fp8_ops.qdq(x, q_dtype, current_scale(x, q_dtype), x.dtype)


@jax.custom_vjp
def forward_fp8(x: jax.Array) -> jax.Array:
    """An input of the matmul in e4m3; its gradient passes straight through (nothing is clipped)."""
    return quantized(x, FORWARD)


def _forward_fp8_fwd(x):
    return quantized(x, FORWARD), None


def _forward_fp8_bwd(_, g):
    return (g,)


forward_fp8.defvjp(_forward_fp8_fwd, _forward_fp8_bwd)


@jax.custom_vjp
def backward_fp8(y: jax.Array) -> jax.Array:
    """The identity, whose gradient is rounded to e5m2: both backward matmuls then read FP8 operands."""
    return y


def _backward_fp8_fwd(y):
    return y, None


def _backward_fp8_bwd(_, g):
    return (quantized(g, BACKWARD),)


backward_fp8.defvjp(_backward_fp8_fwd, _backward_fp8_bwd)


def fp8_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, out_sharding=None) -> jax.Array:
    """`jax.lax.dot_general` of FP8-rounded inputs, with an FP8-rounded output gradient."""
    y = jax.lax.dot_general(forward_fp8(lhs), forward_fp8(rhs), dimension_numbers, out_sharding=out_sharding)
    return backward_fp8(y)
