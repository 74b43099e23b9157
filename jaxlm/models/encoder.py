"""The BERT encoder: embeddings, post-LN self-attention blocks and the [CLS] pooler."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.nn.attention import Attention
from jaxlm.nn.embed import BertEmbeddings, check_token_inputs
from jaxlm.nn.layers import Dense, LayerNorm, Mlp
from jaxlm.nn.stack import make_layers, run_layers
from jaxlm.parallel.logical import constrain

ACTIVATION = ("batch", "length", "embed")


class EncoderLayer(nn.Module):
    """Post-LN block: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, padding_mask: jax.Array, deterministic: bool) -> jax.Array:
        x = LayerNorm(self.config, name="attention_norm")(
            x + Attention(self.config, name="attention")(x, padding_mask, deterministic))
        x = LayerNorm(self.config, name="mlp_norm")(x + Mlp(self.config, name="mlp")(x, deterministic))
        return constrain(x, ACTIVATION)


class BertEncoder(nn.Module):
    """input ids, segment ids and padding mask -> (hidden states [B, T, E], pooled [CLS] [B, E])."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg)
        self.layers = make_layers(EncoderLayer, cfg, cfg.num_layers, static_args=(3,))
        self.pooler = Dense(cfg, cfg.hidden_size, ("embed",), ("embed_out",))

    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        x = self.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        pooled = jnp.tanh(self.pooler(x[:, 0]))
        return x, pooled

    def hidden_states(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        """The last layer's states [B, T, E] without the pooler (whose parameters then never exist)."""
        check_token_inputs(input_ids, segment_ids=segment_ids, padding_mask=padding_mask)
        if segment_ids is None:
            segment_ids = jnp.zeros_like(input_ids)
        if padding_mask is None:
            padding_mask = jnp.ones(input_ids.shape, bool)
        x = self.embeddings(input_ids, segment_ids, deterministic)
        return run_layers(self.layers, x, padding_mask.astype(bool), deterministic)

    def word_embeddings(self, x: jax.Array) -> jax.Array:
        return self.embeddings.word.attend(x)
