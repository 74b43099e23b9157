"""Dense projections, LayerNorm and the GELU MLP, with logical axis names on every parameter."""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig


def normal_init(config: TransformerConfig, names: Sequence[str | None]):
    return nn.with_logical_partitioning(nn.initializers.normal(config.initializer_range), tuple(names))


def zeros_init(names: Sequence[str | None]):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(names))


def ones_init(names: Sequence[str | None]):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), tuple(names))


def gelu(x: jax.Array) -> jax.Array:
    """BERT's exact (erf) GELU."""
    return jax.nn.gelu(x, approximate=False)


class Dense(nn.Module):
    """x · kernel + bias, contracting the last `contract` axes; both parameters carry logical names."""

    config: TransformerConfig
    features: int | tuple[int, ...]
    in_axes: tuple[str, ...]
    out_axes: tuple[str, ...]
    contract: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        features = self.features if isinstance(self.features, tuple) else (self.features,)
        in_shape = x.shape[-self.contract:]
        param_dtype, dtype = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        kernel = self.param("kernel", normal_init(cfg, self.in_axes + self.out_axes),
                            (*in_shape, *features), param_dtype)
        bias = self.param("bias", zeros_init(self.out_axes), features, param_dtype)
        y = jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype),
                                ((tuple(range(x.ndim - self.contract, x.ndim)), tuple(range(self.contract))), ((), ())))
        return y + bias.astype(dtype)


class LayerNorm(nn.Module):
    """LayerNorm over the embedding axis, computed in float32."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        scale = self.param("scale", ones_init(("embed",)), (x.shape[-1],), jnp.dtype(cfg.param_dtype))
        bias = self.param("bias", zeros_init(("embed",)), (x.shape[-1],), jnp.dtype(cfg.param_dtype))
        x = x.astype(jnp.float32)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(variance + cfg.layer_norm_eps) * scale + bias
        return y.astype(jnp.dtype(cfg.dtype))


class Mlp(nn.Module):
    """embed -> mlp (GELU) -> embed."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        h = Dense(cfg, cfg.intermediate_size, ("embed",), ("mlp",), name="intermediate")(x)
        h = nn.with_logical_constraint(gelu(h), ("batch", "length", "mlp"))
        h = Dense(cfg, cfg.hidden_size, ("mlp",), ("embed",), name="output")(h)
        return nn.Dropout(cfg.hidden_dropout)(h, deterministic=deterministic)
