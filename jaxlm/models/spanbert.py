"""SpanBERT: the BERT encoder with BERT's MLM head and the span-boundary objective (SBO) head."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.encoder import BertEncoder
from jaxlm.models.heads import MlmHead, gather_positions
from jaxlm.nn.embed import Embed, vocabulary_columns
from jaxlm.nn.layers import ACTIVATIONS, Dense, LayerNorm, zeros_init


class SpanBoundaryHead(nn.Module):
    """Logits [B, P, V] for each span target from the states at the span's two boundary tokens and the
    target's offset in the span (facebookresearch/SpanBERT's BertPairTargetPredictionHead):
    [left; right; offset embedding] -> 2 x (dense, activation, LayerNorm) -> tied word table + bias.

    `position_size` is the offset embedding's width (0: hidden_size, as in the paper; the released
    code used 200). Offsets past `max_span_length - 1` are clipped to it.
    """

    config: TransformerConfig
    max_span_length: int = 10
    position_size: int = 0

    @nn.compact
    def __call__(self, hidden: jax.Array, pair_positions: jax.Array, span_offsets: jax.Array, decode) -> jax.Array:
        cfg = self.config
        offsets = Embed(cfg, self.max_span_length, ("relpos", "embed"), self.position_size, name="position")(
            jnp.clip(span_offsets, 0, self.max_span_length - 1))
        left = gather_positions(hidden, pair_positions[..., 0])
        right = gather_positions(hidden, pair_positions[..., 1])
        h = jnp.concatenate([left, right, offsets.astype(left.dtype)], axis=-1)
        # dense1/dense2, not dense_0/dense_1: jaxlm.convert.layout would stack `name_i` siblings as layers.
        for i in (1, 2):
            h = Dense(cfg, cfg.hidden_size, ("embed",), ("embed_out",), name=f"dense{i}")(h)
            h = LayerNorm(cfg, name=f"norm{i}")(ACTIVATIONS[cfg.activation](h))
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,), jnp.dtype(cfg.param_dtype))
        return decode(h).astype(jnp.float32) + vocabulary_columns(bias, cfg)


class SpanBertForPreTraining(nn.Module):
    """BERT encoder (no pooler: SpanBERT drops NSP), MLM logits at `masked_positions` [B, P, V] and SBO
    logits [B, P, V] for targets whose span boundaries are `pair_positions` [B, P, 2] (left, right)
    and whose offsets within their spans are `span_offsets` [B, P]."""

    config: TransformerConfig
    max_span_length: int = 10

    def setup(self):
        self.encoder = BertEncoder(self.config)
        self.mlm = MlmHead(self.config)
        self.sbo = SpanBoundaryHead(self.config, self.max_span_length)

    def __call__(self, input_ids, segment_ids, padding_mask, masked_positions, pair_positions, span_offsets,
                 deterministic: bool = True):
        hidden = self.encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        mlm_logits = self.mlm(gather_positions(hidden, masked_positions), self.encoder.word_embeddings)
        sbo_logits = self.sbo(hidden, pair_positions, span_offsets, self.encoder.word_embeddings)
        return mlm_logits, sbo_logits
