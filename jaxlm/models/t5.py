"""T5 (v1.0 and v1.1): a pre-RMSNorm encoder-decoder with bucketed relative position biases."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.seq2seq import EncoderDecoder
from jaxlm.nn.attention import Attention
from jaxlm.nn.dropout import Dropout
from jaxlm.nn.embed import Embed, vocabulary_columns
from jaxlm.nn.layers import mlp_block, normal_init, norm_layer
from jaxlm.nn.stack import make_layers, run_layers
from jaxlm.parallel.logical import constrain

ACTIVATION = ("batch", "length", "embed")


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
    """Hugging Face's `_relative_position_bucket`: key position - query position -> bucket in
    [0, num_buckets); exact buckets for small distances, log-spaced ones up to `max_distance`."""
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).astype(relative_position.dtype) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    # log(0) is -inf here, but those distances take the exact branch.
    large = max_exact + (jnp.log(distance.astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(relative_position.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(distance < max_exact, distance, large)


class RelativeBias(nn.Module):
    """The learned bias table [relative_buckets, heads] -> logit bias [B, heads, Tq, Tk] between
    query positions [B, Tq] and key positions [B, Tk] (B may be 1)."""

    config: TransformerConfig
    bidirectional: bool

    @nn.compact
    def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
        cfg = self.config
        table = self.param("embedding", normal_init(cfg, ("relpos", "heads")), (cfg.relative_buckets, cfg.num_heads),
                           jnp.dtype(cfg.param_dtype))
        relative = key_positions[:, None, :].astype(jnp.int32) - query_positions[:, :, None].astype(jnp.int32)
        buckets = relative_position_bucket(relative, self.bidirectional, cfg.relative_buckets,
                                           cfg.relative_max_distance)
        # a one-hot contraction, not a gather: the gradient is then a matmul, where a gather's is a scatter-add of
        # Tq x Tk updates onto 32 rows (on a GPU, atomics that contend); exact for finite values at the highest
        # precision
        one_hot = jax.nn.one_hot(buckets, cfg.relative_buckets, dtype=table.dtype)
        return jnp.einsum("bqkn,nh->bhqk", one_hot, table, precision=jax.lax.Precision.HIGHEST).astype(jnp.float32)


class T5EncoderLayer(nn.Module):
    """x = x + self_attn(norm(x), bias); x = x + mlp(norm(x))."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x, bias, padding_mask, deterministic: bool) -> jax.Array:
        cfg = self.config
        h = norm_layer(cfg, "self_attention_norm")(x)
        x = x + Attention(cfg, scale=1.0, name="self_attention")(h, padding_mask, deterministic, bias=bias)
        x = x + mlp_block(cfg, "mlp")(norm_layer(cfg, "mlp_norm")(x), deterministic)
        return constrain(x, ACTIVATION)


class T5DecoderLayer(nn.Module):
    """x = x + causal_self_attn(norm(x), bias); x = x + cross_attn(norm(x), encoder); x = x + mlp(norm(x))."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x, bias, padding_mask, encoder_states, encoder_mask, deterministic: bool,
                 decode: bool = False) -> jax.Array:
        cfg = self.config
        h = norm_layer(cfg, "self_attention_norm")(x)
        x = x + Attention(cfg, causal=True, scale=1.0, name="self_attention")(
            h, padding_mask, deterministic, bias=bias, decode=decode)
        h = norm_layer(cfg, "cross_attention_norm")(x)
        x = x + Attention(cfg, scale=1.0, name="cross_attention")(h, encoder_mask, deterministic,
                                                                  context=encoder_states)
        x = x + mlp_block(cfg, "mlp")(norm_layer(cfg, "mlp_norm")(x), deterministic)
        return constrain(x, ACTIVATION)


class T5Encoder(nn.Module):
    """Token embeddings [B, T, E] and padding mask [B, T] -> final-normed encoder states [B, T, E]."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.relative_bias = RelativeBias(cfg, bidirectional=True)
        self.layers = make_layers(T5EncoderLayer, cfg, cfg.num_layers, static_args=(4,))
        self.final_norm = norm_layer(cfg, "final_norm")
        self.dropout = Dropout(cfg.hidden_dropout)

    def __call__(self, x, padding_mask, deterministic: bool) -> jax.Array:
        positions = jnp.arange(x.shape[1])[None, :]
        bias = self.relative_bias(positions, positions)
        x = self.dropout(constrain(x, ACTIVATION), deterministic=deterministic)
        x = run_layers(self.layers, x, bias, padding_mask, deterministic)
        return self.dropout(self.final_norm(x), deterministic=deterministic)


class T5Decoder(nn.Module):
    """Token embeddings [B, T, E] at positions [B, T] over encoder states -> final-normed states [B, T, E].

    With `decode=True` on an existing cache the keys are every cache slot, so the bias runs from
    `positions` to slots 0..max_len-1 (slots not yet written are masked by the attention).
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.relative_bias = RelativeBias(cfg, bidirectional=False)
        self.layers = make_layers(T5DecoderLayer, cfg, cfg.decoder_layers, static_args=(6, 7))
        self.final_norm = norm_layer(cfg, "final_norm")
        self.dropout = Dropout(cfg.hidden_dropout)

    def __call__(self, x, positions, padding_mask, encoder_states, encoder_mask, deterministic: bool,
                 decode: bool) -> jax.Array:
        slots = self._cache_slots() if decode else None
        key_positions = positions if slots is None else jnp.arange(slots)[None, :]
        bias = self.relative_bias(positions, key_positions)
        x = self.dropout(constrain(x, ACTIVATION), deterministic=deterministic)
        x = run_layers(self.layers, x, bias, padding_mask, encoder_states, encoder_mask, deterministic, decode)
        return self.dropout(self.final_norm(x), deterministic=deterministic)

    def _cache_slots(self) -> int | None:
        """Length of the self-attention KV cache, or None before the call that creates it."""
        leaves = jax.tree_util.tree_flatten_with_path(self.variables.get("cache", {}))[0]
        lengths = [leaf.shape[-3] for path, leaf in leaves if getattr(path[-1], "key", None) == "cached_key"]
        return lengths[0] if lengths else None


class T5ForConditionalGeneration(EncoderDecoder):
    """T5 with its LM head: (source ids [B, Ts], decoder ids [B, Td]) -> logits [B, Td, V] in float32.

    v1.0: ReLU MLP, LM head tied to the shared embeddings, decoder states rescaled by
    hidden_size**-0.5 before it. v1.1: gated tanh-GELU MLP (`activation="geglu"`), its own `lm_head`
    (`tie_embeddings=False`), no rescaling. Attention logits are not scaled by 1/sqrt(head_dim); each
    stack's `relative_bias` table makes one bias per forward pass for all its self-attention layers.
    Cross-attention recomputes its keys and values from the encoder states on every `decode` call.

    T5's presets initialise as T5 does: tables normal(1.0), kernels normal(1 / sqrt(fan_in))
    (`fan_in_init`, initializer_range 1.0).
    """

    def setup(self):
        cfg = self.config
        self.shared = Embed(cfg, cfg.padded_vocab_size, ("vocab", "embed"))
        self.encoder = T5Encoder(cfg)
        self.decoder = T5Decoder(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = self.param("lm_head", normal_init(cfg, ("embed", "vocab")),
                                      (cfg.hidden_size, cfg.padded_vocab_size), jnp.dtype(cfg.param_dtype))

    def logits(self, hidden: jax.Array) -> jax.Array:
        if self.config.tie_embeddings:
            logits = self.shared.attend(hidden * jnp.asarray(self.config.hidden_size ** -0.5, hidden.dtype))
        else:
            logits = vocabulary_columns(hidden @ self.lm_head.astype(hidden.dtype), self.config)
        return logits.astype(jnp.float32)
