"""Dense projections, LayerNorm, RMSNorm and the MLPs, with logical axis names on every parameter."""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxlm.nn.dropout import Dropout, kept_fraction
from jaxlm.nn.fp8 import fp8_dot_general
from jaxlm.parallel.logical import (constrain, explicit_axes, gathered, spec_of, target_platform,
                                    with_logical_partitioning)

if TYPE_CHECKING:
    from jaxlm.models.config import TransformerConfig


def normal_init(config: TransformerConfig, names: Sequence[str | None], fan_in: int = 1):
    """normal(initializer_range), divided by sqrt(fan_in) when the config asks for fan-in scaling."""
    std = config.initializer_range * (fan_in ** -0.5 if config.fan_in_init else 1.0)
    return with_logical_partitioning(nn.initializers.normal(std), names)


def zeros_init(names: Sequence[str | None]):
    return with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones_init(names: Sequence[str | None]):
    return with_logical_partitioning(nn.initializers.ones_init(), names)


_SQRT_HALF, _INV_SQRT_2PI = math.sqrt(0.5), 1 / math.sqrt(2 * math.pi)
_TANH_SCALE, _CUBIC = math.sqrt(2 / math.pi), 0.044715


def gelu_tanh_derivative(x: jax.Array) -> jax.Array:
    """d gelu_tanh(x) / dx, from x alone."""
    tanh = jnp.tanh(_TANH_SCALE * (x + _CUBIC * x ** 3))
    return 0.5 * (1 + tanh) + 0.5 * x * (1 - tanh ** 2) * _TANH_SCALE * (1 + 3 * _CUBIC * x ** 2)


def gelu_derivative(x: jax.Array) -> jax.Array:
    """d gelu(x) / dx, from x alone."""
    return 0.5 * (1 + jax.lax.erf(x * _SQRT_HALF)) + x * jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI


def _recomputing_derivative(activation, derivative):
    """`activation` keeping only its input for the backward pass, which recomputes `derivative` in float32:
    differentiated as written, XLA saves one or two more tensors of the MLP's width per layer. Reverse mode
    only, as any custom_vjp (jax.jvp raises)."""
    wrapped = jax.custom_vjp(activation)
    wrapped.defvjp(lambda x: (wrapped(x), x),
                   lambda x, grad: ((grad.astype(jnp.float32) * derivative(x.astype(jnp.float32))).astype(x.dtype),))
    return wrapped


def _gelu(x: jax.Array) -> jax.Array:
    """BERT's exact GELU, x (1 + erf(x / sqrt 2)) / 2 in float32, as PyTorch writes it. jax.nn.gelu writes
    erfc(-x / sqrt 2) instead, whose expansion is several times erf's arithmetic: there BERT-base's forward
    GELU ran at twice its memory bound on an H200."""
    wide = x.astype(jnp.float32)
    return (0.5 * wide * (1 + jax.lax.erf(wide * _SQRT_HALF))).astype(x.dtype)


def _gelu_tanh(x: jax.Array) -> jax.Array:
    """GPT-2's tanh-approximate GELU (`gelu_new`)."""
    return jax.nn.gelu(x, approximate=True)


gelu = _recomputing_derivative(_gelu, gelu_derivative)
gelu_tanh = _recomputing_derivative(_gelu_tanh, gelu_tanh_derivative)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _relu_gradient_from_output(x: jax.Array, out: jax.Array, kept: float) -> jax.Array:
    """`out`, a ReLU of `x` (then dropped out, dividing by `kept`), whose gradient in `x` comes from `out` alone:
    out > 0 exactly where x > 0 and the element was kept."""
    return out


def _relu_output_forward(x, out, kept):
    return out, out


def _relu_output_backward(kept, out, grad):
    return jnp.where(out > 0, grad / kept, jnp.zeros((), grad.dtype)), None


_relu_gradient_from_output.defvjp(_relu_output_forward, _relu_output_backward)


def relu_then(x: jax.Array, dropout: nn.Module, deterministic: bool) -> jax.Array:
    """dropout(relu(x)) whose backward pass keeps and reads only its output, which the next layer's weight
    gradient keeps anyway: differentiated as written, XLA also keeps x and the dropout's mask (or hashes the mask
    again) to compute the same gradient. The values and gradients are those of the composition written out."""
    out = jax.lax.stop_gradient(dropout(jax.nn.relu(x), deterministic=deterministic))
    kept = 1.0 if deterministic or dropout.rate == 0.0 else kept_fraction(dropout.rate)
    return _relu_gradient_from_output(x, out, kept)


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh, "relu": jax.nn.relu}
GATES = {"swiglu": jax.nn.silu, "geglu": gelu_tanh}


def _dense_parameters(module: nn.Module, config: TransformerConfig, in_shape: tuple[int, ...],
                      features: tuple[int, ...], in_axes: tuple[str, ...], out_axes: tuple[str, ...]):
    """A Dense's kernel [*in_shape, *features] and bias [*features] (None without `use_bias`), created in
    `module`'s scope and placed as compute reads them, in the parameters' dtype."""
    kernel = module.param("kernel", normal_init(config, in_axes + out_axes, math.prod(in_shape)),
                          (*in_shape, *features), jnp.dtype(config.param_dtype))
    kernel = gathered(kernel, in_axes + out_axes)
    if not config.use_bias:
        return kernel, None
    bias = module.param("bias", zeros_init(out_axes), features, jnp.dtype(config.param_dtype))
    return kernel, gathered(bias, out_axes)


def _project(config: TransformerConfig, x: jax.Array, kernel: jax.Array, bias: jax.Array | None, contract: int,
             fp8_eligible: bool) -> jax.Array:
    """x · kernel (+ bias) at the compute dtype, contracting x's last `contract` axes with the kernel's first."""
    features = kernel.shape[contract:]
    if bias is not None and len(features) > 1 and not explicit_axes():
        # Over one feature axis the bias becomes the GEMM's bias epilogue; over (heads, head_dim) XLA broadcasts it
        # to the whole output for cuBLAS to add (BERT-base: 50 MB written and read again per projection). Explicit
        # axes would have to merge a split axis.
        flat = _project(config, x, kernel.reshape(*kernel.shape[:contract], -1), bias.reshape(-1), contract,
                        fp8_eligible)
        return flat.reshape(*flat.shape[:-1], *features)
    dtype = jnp.dtype(config.dtype)
    # Under explicit axes a contraction over split dims (tensor-parallel rows) must name its output.
    out = P(*spec_of(x)[:-contract], *spec_of(kernel)[contract:]) if explicit_axes() else None
    dot_general = fp8_dot_general if config.fp8 and fp8_eligible else jax.lax.dot_general
    y = dot_general(x.astype(dtype), kernel.astype(dtype),
                    ((tuple(range(x.ndim - contract, x.ndim)), tuple(range(contract))), ((), ())), out_sharding=out)
    return y if bias is None else add_projection_bias(y, bias)


@jax.custom_vjp
def add_projection_bias(y: jax.Array, bias: jax.Array) -> jax.Array:
    """y + bias (over y's trailing axes) in y's dtype. The bias's gradient is the incoming one summed over the
    other axes in float32, where the transpose of the broadcast would sum it in y's dtype: in bfloat16, each
    addition rounded (over a step's 16k tokens, some elements off by a percent)."""
    return y + bias.astype(y.dtype)


def _add_projection_bias_forward(y, bias):
    return add_projection_bias(y, bias), bias


def _add_projection_bias_backward(bias, grad):
    rows = tuple(range(grad.ndim - bias.ndim))
    return grad, jnp.sum(_widened(grad), axis=rows).astype(bias.dtype)


def _widened(x: jax.Array) -> jax.Array:
    """`x` in float32. From bfloat16 by its bits (the high half of a float32's), exactly as a conversion would:
    where `x` rounds a float32 product to bfloat16 (the activation's gradient), XLA folds a conversion back into
    that product, which then feeds the rounding and the sum apart, and it no longer fuses the product into the
    sum's kernel (GPT-2: a float32 [tokens, 3072] written and read again in every layer)."""
    if x.dtype != jnp.bfloat16:
        return x.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


add_projection_bias.defvjp(_add_projection_bias_forward, _add_projection_bias_backward)


class Dense(nn.Module):
    """x · kernel + bias, contracting the last `contract` axes; both parameters carry logical names.
    `fp8_eligible`: a transformer layer's projection, whose matmul runs in FP8 under `config.fp8` (the heads'
    stay at the compute dtype, as FP8 recipes keep the first and last layers)."""

    config: TransformerConfig
    features: int | tuple[int, ...]
    in_axes: tuple[str, ...]
    out_axes: tuple[str, ...]
    contract: int = 1
    fp8_eligible: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = self.features if isinstance(self.features, tuple) else (self.features,)
        kernel, bias = _dense_parameters(self, self.config, x.shape[-self.contract:], features, self.in_axes,
                                         self.out_axes)
        return _project(self.config, x, kernel, bias, self.contract, self.fp8_eligible)


# A transformer layer's projection (attention, MLP): the Dense that runs in FP8 under `config.fp8`.
LayerDense = functools.partial(Dense, fp8_eligible=True)


class DenseParameters(nn.Module):
    """The kernel and bias a LayerDense of one input axis and these features would create under this name,
    without the product: `projections` stacks several to take them in one matmul."""

    config: TransformerConfig
    features: tuple[int, ...]
    in_axes: tuple[str, ...]
    out_axes: tuple[str, ...]

    @nn.compact
    def __call__(self, in_features: int):
        return _dense_parameters(self, self.config, (in_features,), self.features, self.in_axes, self.out_axes)


def projections(config: TransformerConfig, x: jax.Array, names: Sequence[str], features: tuple[int, ...],
                in_axes: tuple[str, ...], out_axes: tuple[str, ...], stackable: bool = True) -> list[jax.Array]:
    """LayerDense(config, features, in_axes, out_axes, name=n)(x) for each name in `names` (call it inside a
    compact module). Under `model.fused_projections`, on GPUs, unless the caller says they are not `stackable`:
    as one matmul of x with their kernels stacked [embed, len(names), *features], one GEMM of the combined width,
    and in the backward pass one GEMM for x's gradient where separate projections take one each and add them.
    Its outputs are slices of one array, which XLA copies where an operand must be dense (a custom call's). The
    parameters are the same either way. On a CPU the stacked matmul and its slices cost more than they save
    (bert-tiny's step on one CPU device: 557 -> 583 ms), and on TPUs nothing measured a gain."""
    if not (stackable and config.fused_projections and target_platform() == "gpu"):
        return [LayerDense(config, features, in_axes, out_axes, name=name)(x) for name in names]
    parts = [DenseParameters(config, features, in_axes, out_axes, name=name)(x.shape[-1]) for name in names]
    kernel = jnp.stack([kernel for kernel, _ in parts], axis=1)
    bias = None if parts[0][1] is None else jnp.stack([bias for _, bias in parts])
    y = _project(config, x, kernel, bias, 1, fp8_eligible=True)
    stacked_axis = y.ndim - len(features) - 1
    return [jax.lax.index_in_dim(y, index, stacked_axis, keepdims=False) for index in range(len(names))]


def norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None, eps: float, centre: bool,
         dtype: jnp.dtype) -> jax.Array:
    """LayerNorm or RMSNorm as `normalize` computes it: built for GPUs with its backward pass, elsewhere
    differentiated by JAX (on TPUs the barrier's kept statistics cost memory, and nothing measured a gain)."""
    return (normalize if target_platform() == "gpu" else _normalize_as_written)(x, scale, bias, eps, centre, dtype)


def _normalize_as_written(x: jax.Array, scale: jax.Array, bias: jax.Array | None, eps: float, centre: bool,
                          dtype: jnp.dtype) -> jax.Array:
    """LayerNorm (`centre`: subtract the row's mean; add `bias`) or RMSNorm (neither) of x over its last axis,
    computed in float32 and returned in `dtype`."""
    return _normalized(x, *_statistics(x, eps, centre), scale, bias, dtype)


# Differentiated, both norms keep their input and each row's mean and reciprocal deviation for the backward pass,
# which then sums the scale's and bias's gradients in one pass over the incoming gradient and the input. As
# written, XLA recomputes the row statistics there and writes (gradient x normalised input) in float32 to sum it:
# on a compile-only H100 BERT-base's norms moved 0.5 GB a layer more (plan: 15.4 -> 13.8 ms of elementwise bound).
normalize = jax.custom_vjp(_normalize_as_written, nondiff_argnums=(3, 4, 5))


def _statistics(x: jax.Array, eps: float, centre: bool) -> tuple[jax.Array | None, jax.Array]:
    """Each row's float32 mean (None without centring) and reciprocal root mean square about it."""
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True) if centre else None
    return mean, jax.lax.rsqrt(jnp.mean(jnp.square(x if mean is None else x - mean), axis=-1, keepdims=True) + eps)


def _normalized(x, mean, rstd, scale, bias=None, dtype=jnp.float32):
    y = (x.astype(jnp.float32) if mean is None else x.astype(jnp.float32) - mean) * rstd * scale
    return (y if bias is None else y + bias).astype(dtype)


def _statistics_in_one_read(x: jax.Array, eps: float, centre: bool) -> tuple[jax.Array | None, jax.Array]:
    """`_statistics` from one read of x: the float32 means of x and of its square, reduced side by side, give
    the variance as their difference (flax's `use_fast_variance`); `_statistics` reads x twice, the second
    time for the deviations about the mean. Float32 loses about 6e-8 x (mean^2 / variance + 1) of the variance
    to the difference, 1e-6 for a row whose mean is four deviations from 0. A shift by the row's first element
    would keep even that, but needs that element on every shard of a split feature axis."""
    if not centre:
        return _statistics(x, eps, centre)
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.maximum(jnp.mean(jnp.square(x), axis=-1, keepdims=True) - jnp.square(mean), 0.0)
    return mean, jax.lax.rsqrt(variance + eps)


def _normalize_forward(x, scale, bias, eps, centre, dtype):
    # the barrier keeps the statistics for the backward pass, where XLA would otherwise recompute them
    mean, rstd = jax.lax.optimization_barrier(_statistics_in_one_read(x, eps, centre))
    return _normalized(x, mean, rstd, scale, bias, dtype), (x, mean, rstd, scale, bias)


def _normalize_backward(eps, centre, dtype, residuals, grad):
    del eps, centre, dtype
    x, mean, rstd, scale, bias = residuals
    normalised = _normalized(x, mean, rstd, 1.0)
    grad = grad.astype(jnp.float32)
    rows = tuple(range(x.ndim - 1))
    scale_grad = _typed_as(jnp.sum(grad * normalised, axis=rows), scale)
    bias_grad = None if bias is None else _typed_as(jnp.sum(grad, axis=rows), bias)
    scaled = grad * scale
    along = scaled if mean is None else scaled - jnp.mean(scaled, axis=-1, keepdims=True)
    x_grad = rstd * (along - normalised * jnp.mean(scaled * normalised, axis=-1, keepdims=True))
    return _typed_as(x_grad, x), scale_grad, bias_grad


def _typed_as(gradient: jax.Array, primal: jax.Array) -> jax.Array:
    """A backward rule's gradient in its primal's dtype and, under explicit axes, its layout (which the type
    carries there: the sum over rows keeps the activations' split of the feature axis)."""
    gradient = gradient.astype(primal.dtype)
    return jax.sharding.reshard(gradient, P(*spec_of(primal))) if explicit_axes() else gradient


normalize.defvjp(_normalize_forward, _normalize_backward)


class LayerNorm(nn.Module):
    """LayerNorm over the last axis (logical name `axis`), computed in float32."""

    config: TransformerConfig
    axis: str = "embed"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        names = (self.axis,)
        scale = self.param("scale", ones_init(names), (x.shape[-1],), jnp.dtype(cfg.param_dtype))
        bias = self.param("bias", zeros_init(names), (x.shape[-1],), jnp.dtype(cfg.param_dtype))
        scale, bias = gathered(scale, names), gathered(bias, names)
        return norm(x, scale, bias, cfg.layer_norm_eps, True, jnp.dtype(cfg.dtype))


class RMSNorm(nn.Module):
    """Root-mean-square norm over the embedding axis (no centring, no bias), computed in float32."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        scale = self.param("scale", ones_init(("embed",)), (x.shape[-1],), jnp.dtype(cfg.param_dtype))
        return norm(x, gathered(scale, ("embed",)), None, cfg.layer_norm_eps, False, jnp.dtype(cfg.dtype))


def norm_layer(config: TransformerConfig, name: str) -> nn.Module:
    """LayerNorm or RMSNorm, as `config.norm` says."""
    return (RMSNorm if config.norm == "rmsnorm" else LayerNorm)(config, name=name)


def mlp_block(config: TransformerConfig, name: str) -> nn.Module:
    """The gated MLP for swiglu/geglu, else the plain one."""
    return (GatedMlp if config.gated_mlp else Mlp)(config, name=name)


class Mlp(nn.Module):
    """embed -> mlp (exact or tanh GELU, or ReLU, as `config.activation` says) -> embed, with dropout on
    the activations (`activation_dropout`) and the output (`hidden_dropout`)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        h = LayerDense(cfg, cfg.intermediate_size, ("embed",), ("mlp",), name="intermediate")(x)
        if cfg.activation == "relu":
            h = constrain(relu_then(h, Dropout(cfg.activation_dropout), deterministic), ("batch", "length", "mlp"))
        else:
            h = constrain(ACTIVATIONS[cfg.activation](h), ("batch", "length", "mlp"))
            h = Dropout(cfg.activation_dropout)(h, deterministic=deterministic)
        h = LayerDense(cfg, cfg.hidden_size, ("mlp",), ("embed",), name="output")(h)
        return Dropout(cfg.hidden_dropout)(h, deterministic=deterministic)


class GatedMlp(nn.Module):
    """SwiGLU (Llama) or GeGLU (T5 v1.1): embed -> act(gate) * up -> embed."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        gate, up = projections(cfg, x, ("gate", "up"), (cfg.intermediate_size,), ("embed",), ("mlp",))
        h = constrain(GATES[cfg.activation](gate) * up, ("batch", "length", "mlp"))
        h = Dropout(cfg.activation_dropout)(h, deterministic=deterministic)
        h = LayerDense(cfg, cfg.hidden_size, ("mlp",), ("embed",), name="down")(h)
        return Dropout(cfg.hidden_dropout)(h, deterministic=deterministic)
