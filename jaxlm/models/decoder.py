"""Causal decoders: pre-norm self-attention blocks, as GPT-2 and Llama build them.

One network covers both families; the config picks the parts. GPT-2: learned positions,
LayerNorm, tanh-GELU MLP, biases, LM head tied to the token embeddings. Llama: rotary positions,
RMSNorm, SwiGLU MLP, grouped-query attention (`num_kv_heads`), no biases, untied LM head.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.nn.attention import Attention
from jaxlm.nn.dropout import Dropout
from jaxlm.nn.embed import Embed, check_positions, check_token_inputs, vocabulary_columns
from jaxlm.nn.layers import mlp_block, norm_layer, normal_init
from jaxlm.nn.stack import make_layers, run_layers
from jaxlm.parallel.logical import constrain

ACTIVATION = ("batch", "length", "embed")


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """[batch, length] positions that restart at 0 wherever the segment id changes (packed documents)."""
    index = jnp.arange(segment_ids.shape[1])
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)


class DecoderLayer(nn.Module):
    """Pre-norm block: x = x + attn(norm(x)); x = x + mlp(norm(x))."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x, positions, segment_ids, padding_mask, deterministic: bool, decode: bool = False) -> jax.Array:
        cfg = self.config
        h = norm_layer(cfg, "attention_norm")(x)
        x = x + Attention(cfg, causal=True, name="attention")(h, padding_mask, deterministic, positions, segment_ids,
                                                             decode=decode)
        x = x + mlp_block(cfg, "mlp")(norm_layer(cfg, "mlp_norm")(x), deterministic)
        return constrain(x, ACTIVATION)


class Decoder(nn.Module):
    """Token ids [B, T] -> final-normed hidden states [B, T, E].

    `segment_ids` [B, T] keeps packed documents apart and restarts positions in each (unless
    config.cross_document_attention);
    `padding_mask` [B, T] is true at real (right-padded) tokens. `decode=True` runs on the KV cache
    (see `Attention`): pass `positions`, and a `padding_mask` over the cache slots if any are padding.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.token = Embed(cfg, cfg.padded_vocab_size, ("vocab", "embed"))
        if cfg.position_embedding == "learned":
            self.position = Embed(cfg, cfg.max_position_embeddings, ("length", "embed"))
        self.dropout = Dropout(cfg.hidden_dropout)
        self.layers = make_layers(DecoderLayer, cfg, cfg.num_layers, static_args=(5, 6))
        self.final_norm = norm_layer(cfg, "final_norm")

    def __call__(self, input_ids, positions=None, segment_ids=None, padding_mask=None,
                 deterministic: bool = True, decode: bool = False) -> jax.Array:
        cfg = self.config
        check_token_inputs(input_ids, positions=positions, segment_ids=segment_ids,
                           padding_mask=None if decode else padding_mask)  # decoding's covers the cache
        if cfg.position_embedding == "learned":
            check_positions(input_ids.shape[1], cfg, "input_ids")
        if cfg.cross_document_attention:
            segment_ids = None  # the row is one sequence; the padding mask still keeps its padding out
        if positions is None:
            if decode and "cache" in self.variables:  # counted from 0 again, each token would be the first
                raise ValueError("decode=True on an existing cache needs positions [batch, length]: the absolute "
                                 "positions of these tokens")
            positions = (jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
                         if segment_ids is None else segment_positions(segment_ids))
        x = self.token(input_ids)
        if cfg.position_embedding == "learned":
            x = x + self.position(positions)
        x = self.dropout(constrain(x, ACTIVATION), deterministic=deterministic)
        x = run_layers(self.layers, x, positions, segment_ids, padding_mask, deterministic, decode)
        return self.final_norm(x)

    def word_embeddings(self, x: jax.Array) -> jax.Array:
        return self.token.attend(x)


class CausalLM(nn.Module):
    """A decoder with its LM head: token ids [B, T] -> next-token logits [B, T, V] in float32.

    The head is the token embedding table when `tie_embeddings` (GPT-2), else its own `lm_head`.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.decoder = Decoder(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = self.param("lm_head", normal_init(cfg, ("embed", "vocab")),
                                      (cfg.hidden_size, cfg.padded_vocab_size), jnp.dtype(cfg.param_dtype))

    def __call__(self, input_ids, positions=None, segment_ids=None, padding_mask=None,
                 deterministic: bool = True, decode: bool = False) -> jax.Array:
        return self.head(self.hidden(input_ids, positions, segment_ids, padding_mask, deterministic, decode))

    def hidden(self, input_ids, positions=None, segment_ids=None, padding_mask=None,
               deterministic: bool = True, decode: bool = False) -> jax.Array:
        """The decoder's final states [B, T, E], before the head."""
        return self.decoder(input_ids, positions, segment_ids, padding_mask, deterministic, decode)

    def head(self, hidden: jax.Array) -> jax.Array:
        """float32 logits [B, T, V] of final states [B, T, E]."""
        if self.config.tie_embeddings:
            logits = self.decoder.word_embeddings(hidden)
        else:
            logits = vocabulary_columns(hidden @ self.lm_head.astype(hidden.dtype), self.config)
        return constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))
