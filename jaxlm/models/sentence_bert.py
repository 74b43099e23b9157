"""Sentence-BERT networks (Reimers & Gurevych, 2019): an encoder whose real tokens' last-layer states,
averaged, are the sentence's vector, and the siamese classifier on (u, v, |u - v|) that SBERT trains on
NLI pairs. The backbone's parameters sit under `encoder`, as in pretraining and the task heads, so the
`encoder` tree of any encoder checkpoint loads, and a trained one is what `jaxlm embed` reads."""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.task_heads import EncoderHead, encoder_backbone, mean_states
from jaxlm.nn.layers import Dense


def sentence_vectors(encoder: nn.Module, input_ids, segment_ids, padding_mask, deterministic: bool) -> jax.Array:
    """Mean of the last-layer states over the real tokens, float32 [B, E] (no dropout: SBERT's pooling has none)."""
    if padding_mask is None:
        padding_mask = jnp.ones(input_ids.shape, bool)
    hidden = encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
    return mean_states(hidden.astype(jnp.float32), padding_mask)


def stack_pairs(config: TransformerConfig, ids_a, mask_a, ids_b, mask_b) -> tuple[jax.Array, jax.Array]:
    """Texts A over texts B as one batch [2B, T], the shorter side padded (masked) to the longer's length,
    so that both go through the encoder in one pass."""
    if ids_a.shape[0] != ids_b.shape[0]:
        raise ValueError(f"texts A and B come in pairs, but there are {ids_a.shape[0]} A rows and {ids_b.shape[0]} "
                         "B rows; give one B per A")
    length = max(ids_a.shape[1], ids_b.shape[1])
    pad = lambda x, value: jnp.pad(x, ((0, 0), (0, length - x.shape[1])), constant_values=value)
    mask_a = jnp.ones(ids_a.shape, bool) if mask_a is None else mask_a.astype(bool)
    mask_b = jnp.ones(ids_b.shape, bool) if mask_b is None else mask_b.astype(bool)
    ids = jnp.concatenate([pad(ids_a, config.pad_token_id), pad(ids_b, config.pad_token_id)])
    return ids, jnp.concatenate([pad(mask_a, False), pad(mask_b, False)])


class SentenceEncoder(EncoderHead):
    """Sentence embeddings [B, E] (float32): the backbone's states mean-pooled over the real tokens."""

    config: TransformerConfig
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        encoder = encoder_backbone(self)(self.config, name="encoder")
        return sentence_vectors(encoder, input_ids, segment_ids, padding_mask, deterministic)


class SiameseClassifier(EncoderHead):
    """Logits [B, num_labels] of sentence pairs: texts A and B embedded by one shared encoder (u, v), then a
    linear classifier on concat(u, v, |u - v|), sentence-transformers' SoftmaxLoss default."""

    config: TransformerConfig
    num_labels: int
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    @nn.compact
    def __call__(self, input_ids_a, padding_mask_a, input_ids_b, padding_mask_b, deterministic: bool = True):
        encoder = encoder_backbone(self)(self.config, name="encoder")
        ids, mask = stack_pairs(self.config, input_ids_a, padding_mask_a, input_ids_b, padding_mask_b)
        u, v = jnp.split(sentence_vectors(encoder, ids, None, mask, deterministic), 2)
        features = jnp.concatenate([u, v, jnp.abs(u - v)], axis=-1)
        logits = Dense(self.config, self.num_labels, ("embed",), ("classes",), name="classifier")(features)
        return logits.astype(jnp.float32)
