"""What every objective shares: the batch declared once (shapes, dtypes, logical axes), zero and
synthetic batches from it, init, the loss the trainer differentiates, and the matmul-FLOP counts."""
from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.models.config import TransformerConfig

INT, FLOAT = jnp.int32, jnp.float32


@dataclasses.dataclass(frozen=True)
class Field:
    shape: tuple[int, ...]
    dtype: object
    axes: tuple[str | None, ...]


@dataclasses.dataclass(frozen=True)
class Objective:
    """Subclasses declare `fields()`, `model_inputs(batch)`, `stats` and `summarize`; `network` is the
    module class the family registers (jaxlm.families), built from `config`."""

    config: TransformerConfig
    max_seq_length: int
    network: Callable[[TransformerConfig], nn.Module]

    @property
    def model(self) -> nn.Module:
        return self.network(self.config)

    def fields(self) -> dict[str, Field]:
        raise NotImplementedError

    @property
    def batch_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {name: ("batch", *f.axes) for name, f in self.fields().items()}

    def batch_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        return {name: jax.ShapeDtypeStruct((batch_size, *f.shape), f.dtype) for name, f in self.fields().items()}

    def init(self, rng: jax.Array):
        batch = {k: jnp.zeros(v.shape, v.dtype) for k, v in self.batch_shapes(1).items()}
        return self.model.init(rng, *self.model_inputs(batch))["params"]

    def apply(self, params, batch: dict, rng: jax.Array | None, deterministic: bool, method: str | None = None):
        """The network (or its `method`) on the batch's model inputs."""
        return self.model.apply({"params": params}, *self.model_inputs(batch), deterministic=deterministic,
                                rngs=None if deterministic else {"dropout": rng}, method=method)

    def loss(self, params, batch, rng):
        """(scalar loss, summed stats); the function the trainer differentiates."""
        stats = self.stats(params, batch, rng)
        return self.summarize(stats)["loss"], stats

    def synthetic_batch(self, batch_size: int, seed: int = 0) -> dict[str, np.ndarray]:
        """A well-formed random batch (ids above the special range, every weight on): for benchmarks."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, f in self.fields().items():
            shape = (batch_size, *f.shape)
            if f.dtype == FLOAT:
                out[name] = np.ones(shape, np.float32)
            elif name.endswith("positions"):
                out[name] = np.sort(rng.integers(1, max(2, self.max_seq_length - 1), shape), axis=-1).astype(np.int32)
            elif name.endswith(("mask", "segment_ids")):
                out[name] = np.ones(shape, np.int32)
            elif name.endswith("label"):
                out[name] = rng.integers(0, 2, shape, dtype=np.int32)
            else:
                out[name] = rng.integers(min(1000, self.config.vocab_size // 2), self.config.vocab_size, shape,
                                         dtype=np.int32)
        return out


def layer_matmul_params(config: TransformerConfig, cross_attention: bool = False) -> int:
    """Parameters in one layer's matmuls: attention projections (and cross-attention) plus the MLP."""
    c = config
    attention = 2 * c.hidden_size * c.num_heads * c.head_dim + 2 * c.hidden_size * c.kv_heads * c.head_dim
    mlp = (3 if c.gated_mlp else 2) * c.hidden_size * c.intermediate_size
    return attention * (2 if cross_attention else 1) + mlp
