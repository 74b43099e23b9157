"""Pretraining heads: BERT's masked-LM head on gathered positions and the next-sentence head, and the
masked-LM-only model (RoBERTa, DistilBERT)."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.encoder import BertEncoder
from jaxlm.nn.embed import embedding_axis, vocabulary_columns
from jaxlm.nn.layers import ACTIVATIONS, Dense, LayerNorm, zeros_init


def gather_positions(hidden: jax.Array, positions: jax.Array) -> jax.Array:
    """[B, T, E] states at [B, P] positions -> [B, P, E]; a position outside [0, T) gives NaN (a negative one
    too, which NumPy's indexing would count from the end)."""
    positions = positions.astype(jnp.int32)
    positions = jnp.where(positions < 0, hidden.shape[1], positions)
    return jnp.take_along_axis(hidden, positions[..., None], axis=1, mode="fill")


def states_at(hidden: jax.Array, positions: jax.Array | None) -> jax.Array:
    """The states at `positions` [B, P] (`gather_positions`), or at every position when it is None."""
    return hidden if positions is None else gather_positions(hidden, positions)


class MlmHead(nn.Module):
    """dense (to ALBERT's narrow width when `embedding_size` is set), the config's activation, LayerNorm,
    then the decoder tied to the token embeddings plus a bias."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, states: jax.Array, decode) -> jax.Array:
        cfg = self.config
        axis, width = embedding_axis(cfg)
        out_axis = "embed_out" if axis == "embed" else axis
        h = Dense(cfg, width, ("embed",), (out_axis,), name="transform")(states)
        h = LayerNorm(cfg, axis, name="norm")(ACTIVATIONS[cfg.activation](h))
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,), jnp.dtype(cfg.param_dtype))
        return decode(h).astype(jnp.float32) + vocabulary_columns(bias, cfg)


class BertForPreTraining(nn.Module):
    """BERT with MLM logits at `masked_positions` [B, P, V] (every position's [B, T, V] when it is None) and NSP
    logits [B, 2]."""

    config: TransformerConfig

    def setup(self):
        self.encoder = BertEncoder(self.config)
        self.mlm = MlmHead(self.config)
        self.nsp = Dense(self.config, 2, ("embed",), ("classes",))

    def __call__(self, input_ids, segment_ids=None, padding_mask=None, masked_positions=None,
                 deterministic: bool = True):
        hidden, pooled = self.encoder(input_ids, segment_ids, padding_mask, deterministic)
        mlm_logits = self.mlm(states_at(hidden, masked_positions), self.encoder.word_embeddings)
        nsp_logits = self.nsp(pooled).astype(jnp.float32)
        return mlm_logits, nsp_logits


class MaskedLM(nn.Module):
    """Encoder (no pooler) and the masked-LM head: RoBERTa's and DistilBERT's pretraining model.

    Logits [B, P, V] at `masked_positions` [B, P], or at every position [B, T, V] when it is None.
    """

    config: TransformerConfig

    def setup(self):
        self.encoder = BertEncoder(self.config)
        self.mlm = MlmHead(self.config)

    def __call__(self, input_ids, segment_ids=None, padding_mask=None, masked_positions=None,
                 deterministic: bool = True):
        hidden = self.encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        return self.mlm(states_at(hidden, masked_positions), self.encoder.word_embeddings)
