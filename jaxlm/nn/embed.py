"""Token, learned-position and segment embeddings (summed and normalised as BERT does), and rotary positions."""
from __future__ import annotations

from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.nn.dropout import Dropout
from jaxlm.nn.layers import LayerNorm, normal_init
from jax.sharding import PartitionSpec as P

from jaxlm.parallel.logical import constrain, explicit_axes, gathered, layout, spec_of

if TYPE_CHECKING:
    from jaxlm.models.config import TransformerConfig


SMALL_TABLE = 16  # rows up to which `Embed` looks up by a one-hot contraction rather than a gather


class Embed(nn.Module):
    """A lookup table with logical axis names, `features` wide (0: hidden_size); `attend` uses it as a
    tied output projection."""

    config: TransformerConfig
    num_embeddings: int
    axes: tuple[str, str] = ("vocab", "embed")
    features: int = 0

    def setup(self):
        self.embedding = self.param(
            "embedding", normal_init(self.config, self.axes),
            (self.num_embeddings, self.features or self.config.hidden_size), jnp.dtype(self.config.param_dtype))

    def table(self) -> jax.Array:
        """The table in its parameter dtype as the lookup and the projection read it (`gathered`): rows
        whole, split over the vocabulary only, so each vocab shard looks up its own rows and one all-reduce
        sums them; from rows split over fsdp too, XLA would rematerialise the whole table for the lookup."""
        return jnp.asarray(gathered(self.embedding, self.axes))

    def __call__(self, ids: jax.Array) -> jax.Array:
        """[batch, length] ids -> [batch, length, features], cast to the compute dtype after the lookup: the
        gradient then sums the tokens of each row in the parameter dtype. Cast before, it summed in bfloat16,
        and a row shared by many tokens (BERT's two token-type rows, frequent words) lost precision.

        A gather's gradient is a scatter-add, on a GPU atomic additions that contend where many tokens share
        few rows; a table of at most SMALL_TABLE rows (token types) is read by a one-hot contraction instead,
        whose gradient is a matmul (exact: each output is one row times 1, at the highest precision).

        An id outside the table (a segment id past type_vocab_size, a token id past vocab_size, a negative one,
        which NumPy's indexing would count from the end) looks up a row of NaN either way, the gather's fill, so
        that the loss says so rather than a zero or another row standing in."""
        table = self.table()
        # Under explicit axes JAX cannot infer where a lookup from a split table goes: where activations go.
        out = layout((*ids.shape, table.shape[1]), ("batch", "length", self.axes[1])) if explicit_axes() else None
        if self.num_embeddings <= SMALL_TABLE:
            one_hot = jax.nn.one_hot(ids, self.num_embeddings, dtype=table.dtype)
            rows = jnp.einsum("...n,ne->...e", one_hot, table, precision=jax.lax.Precision.HIGHEST,
                              out_sharding=out)
            rows = jnp.where(((ids >= 0) & (ids < self.num_embeddings))[..., None], rows, jnp.nan)  # not zeros
        else:
            rows = table.at[ids].get(mode="fill", wrap_negative_indices=False, out_sharding=out)
        return rows.astype(jnp.dtype(self.config.dtype))

    def attend(self, x: jax.Array) -> jax.Array:
        """The table as the output projection: logits of the vocabulary's tokens, less the padding rows'."""
        return vocabulary_columns(jnp.einsum("...e,ve->...v", x, self.table().astype(jnp.dtype(self.config.dtype))),
                                  self.config)


def vocabulary_columns(x: jax.Array, config: TransformerConfig) -> jax.Array:
    """`x` [..., padded_vocab_size] (logits, a bias) without the padding rows' columns (`vocab_multiple`). Under
    explicit axes a split vocabulary is gathered first: a slice cannot leave uneven shards."""
    if x.shape[-1] == config.vocab_size:
        return x
    if explicit_axes():
        x = jax.sharding.reshard(x, P(*spec_of(x)[:-1], None))
    return x[..., :config.vocab_size]


def rotary_embedding(x: jax.Array, positions: jax.Array, theta: float = 10000.0) -> jax.Array:
    """RoPE on [batch, length, heads, head_dim] at [batch, length] positions, in the half-split layout
    (dimension i pairs with i + head_dim/2) that Hugging Face Llama checkpoints use."""
    half = x.shape[-1] // 2
    inv_freq = theta ** -(jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None, None] * inv_freq
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def learned_positions(input_ids: jax.Array, config: TransformerConfig) -> jax.Array:
    """[batch, length] learned-position ids: 0, 1, 2, ... when `config.position_offset` is 0 (BERT);
    otherwise Hugging Face RoBERTa's `create_position_ids_from_input_ids`: non-pad tokens are numbered
    from the offset, pad tokens sit at `config.pad_token_id`."""
    if not config.position_offset:
        return jnp.arange(input_ids.shape[1])[None, :]
    real = (input_ids != config.pad_token_id).astype(jnp.int32)
    numbered = jnp.cumsum(real, axis=1) - 1 + config.position_offset
    return numbered * real + config.pad_token_id * (1 - real)


def check_positions(length: int, config: TransformerConfig, what: str) -> None:
    """ValueError unless `length` tokens numbered from 0 fit the learned position table after
    `config.position_offset`: a lookup past its end reads no row (a gather fills NaN, a one-hot zeros)."""
    held = config.max_position_embeddings - config.position_offset
    if length > held:
        offset = f" after the offset {config.position_offset}" if config.position_offset else ""
        raise ValueError(f"{what} has length {length}, but model.max_position_embeddings="
                         f"{config.max_position_embeddings} holds {held} positions{offset}; shorten the sequences or "
                         "use a larger model")


def check_token_inputs(input_ids, what: str = "input_ids", **aligned) -> None:
    """ValueError unless `input_ids` is [batch, length] of integers and each of `aligned` that is given (segment
    ids, a padding mask, positions: name=array) has its shape, ids and positions holding integers; otherwise an
    IndexError or a broadcast deep inside, or a padding mask given where positions go, read as positions."""
    shape = tuple(jnp.shape(input_ids))
    if len(shape) != 2:
        raise ValueError(f"{what} must be [batch, length], not shape {shape}")
    for name, array in [(what, input_ids), *aligned.items()]:
        if array is None:
            continue
        if tuple(jnp.shape(array)) != shape:
            raise ValueError(f"{name} has shape {tuple(jnp.shape(array))} and {what} {shape}: give one per token")
        dtype = jnp.result_type(array)
        if "mask" not in name and not jnp.issubdtype(dtype, jnp.integer):
            hint = ": is it a padding mask given by position? pass it as padding_mask=" if dtype == bool else ""
            raise ValueError(f"{name} must hold integers, not {dtype}{hint}")


def embedding_axis(config: TransformerConfig) -> tuple[str, int]:
    """(logical name, width) of the token tables: ALBERT's narrow "factor" axis when `embedding_size`
    is set, else "embed" at hidden_size."""
    return ("factor", config.embedding_size) if config.embedding_size else ("embed", config.hidden_size)


class BertEmbeddings(nn.Module):
    """word + position (+ token-type, unless `type_vocab_size` is 0) embeddings, LayerNorm, dropout;
    at ALBERT's narrow width when `embedding_size` is set."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        axis, width = embedding_axis(cfg)
        self.word = Embed(cfg, cfg.padded_vocab_size, ("vocab", axis), width)
        self.position = Embed(cfg, cfg.max_position_embeddings, ("length", axis), width)
        if cfg.type_vocab_size:
            self.token_type = Embed(cfg, cfg.type_vocab_size, ("segment", axis), width)
        self.norm = LayerNorm(cfg, axis)
        self.dropout = Dropout(cfg.hidden_dropout)

    def __call__(self, input_ids, segment_ids, deterministic: bool) -> jax.Array:
        check_positions(input_ids.shape[1], self.config, "input_ids")
        x = self.word(input_ids) + self.position(learned_positions(input_ids, self.config))
        if self.config.type_vocab_size:
            x = x + self.token_type(segment_ids)
        x = constrain(x, ("batch", "length", embedding_axis(self.config)[0]))
        return self.dropout(self.norm(x), deterministic=deterministic)
