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
    """A DenseGeneral whose kernel and bias carry logical axis names."""

    config: TransformerConfig
    features: int | tuple[int, ...]
    in_axes: tuple[str, ...]
    out_axes: tuple[str, ...]
    contract: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = self.features if isinstance(self.features, tuple) else (self.features,)
        return nn.DenseGeneral(
            features=features,
            axis=tuple(range(-self.contract, 0)),
            dtype=jnp.dtype(self.config.dtype),
            param_dtype=jnp.dtype(self.config.param_dtype),
            kernel_init=normal_init(self.config, self.in_axes + self.out_axes),
            bias_init=zeros_init(self.out_axes),
            name="dense",
        )(x)


class LayerNorm(nn.Module):
    """LayerNorm over the embedding axis, computed in float32."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.LayerNorm(
            epsilon=self.config.layer_norm_eps,
            dtype=jnp.dtype(self.config.dtype),
            param_dtype=jnp.dtype(self.config.param_dtype),
            scale_init=ones_init(("embed",)),
            bias_init=zeros_init(("embed",)),
            name="norm",
        )(x.astype(jnp.float32)).astype(jnp.dtype(self.config.dtype))


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
