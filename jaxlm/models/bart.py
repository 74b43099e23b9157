"""BART: a post-LN encoder-decoder with learned positions and an LM head tied to the shared embeddings."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.models.config import TransformerConfig
from jaxlm.models.encoder import EncoderLayer
from jaxlm.models.seq2seq import EncoderDecoder
from jaxlm.nn.attention import Attention
from jaxlm.nn.dropout import Dropout
from jaxlm.nn.embed import Embed, check_positions, vocabulary_columns
from jaxlm.nn.layers import LayerNorm, Mlp, zeros_init
from jaxlm.nn.stack import make_layers, run_layers
from jaxlm.parallel.logical import constrain

ACTIVATION = ("batch", "length", "embed")


def shift_tokens_right(labels, pad_token_id: int, decoder_start_token_id: int):
    """Decoder inputs from [batch, length] labels, as Hugging Face BART makes them: the start token,
    then the labels shifted one step right, with ignored labels (-100) replaced by the pad id.
    NumPy in, NumPy out (data pipelines); anything else goes through jax.numpy."""
    xp = np if isinstance(labels, np.ndarray) else jnp
    start = xp.full_like(labels[:, :1], decoder_start_token_id)
    shifted = xp.concatenate([start, labels[:, :-1]], axis=1)
    return xp.where(shifted == -100, pad_token_id, shifted)


class BartEmbeddings(nn.Module):
    """Token embeddings + learned positions, LayerNorm (Hugging Face's `layernorm_embedding`), dropout.

    Position p reads table row p + `config.position_offset` (2 for BART); every slot is numbered,
    padding included, unlike RoBERTa's pad-aware numbering."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.position = Embed(cfg, cfg.max_position_embeddings, ("length", "embed"))
        self.norm = LayerNorm(cfg)
        self.dropout = Dropout(cfg.hidden_dropout)

    def __call__(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
        x = tokens + self.position(positions + self.config.position_offset)
        x = constrain(x, ACTIVATION)
        return self.dropout(self.norm(x), deterministic=deterministic)


class BartDecoderLayer(nn.Module):
    """Post-LN block: x = LN(x + self_attn(x)); x = LN(x + cross_attn(x, encoder)); x = LN(x + mlp(x))."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x, encoder_states, encoder_mask, padding_mask, deterministic: bool,
                 decode: bool = False) -> jax.Array:
        cfg = self.config
        h = Attention(cfg, causal=True, name="attention")(x, padding_mask, deterministic, decode=decode)
        x = LayerNorm(cfg, name="attention_norm")(x + h)
        h = Attention(cfg, name="cross_attention")(x, encoder_mask, deterministic, context=encoder_states)
        x = LayerNorm(cfg, name="cross_attention_norm")(x + h)
        x = LayerNorm(cfg, name="mlp_norm")(x + Mlp(cfg, name="mlp")(x, deterministic))
        return constrain(x, ACTIVATION)


class BartEncoder(nn.Module):
    """Token embeddings [B, T, E] and padding mask [B, T] -> encoder states [B, T, E]."""

    config: TransformerConfig

    def setup(self):
        self.embeddings = BartEmbeddings(self.config)
        self.layers = make_layers(EncoderLayer, self.config, self.config.num_layers, static_args=(3,))

    def __call__(self, tokens, padding_mask, deterministic: bool) -> jax.Array:
        positions = jnp.arange(tokens.shape[1])[None, :]
        x = self.embeddings(tokens, positions, deterministic)
        return run_layers(self.layers, x, padding_mask, deterministic)


class BartDecoder(nn.Module):
    """Token embeddings [B, T, E] at positions [B, T], over encoder states -> decoder states [B, T, E]."""

    config: TransformerConfig

    def setup(self):
        self.embeddings = BartEmbeddings(self.config)
        self.layers = make_layers(BartDecoderLayer, self.config, self.config.decoder_layers, static_args=(5, 6))

    def __call__(self, tokens, positions, padding_mask, encoder_states, encoder_mask, deterministic: bool,
                 decode: bool) -> jax.Array:
        x = self.embeddings(tokens, positions, deterministic)
        return run_layers(self.layers, x, encoder_states, encoder_mask, padding_mask, deterministic, decode)


class BartForConditionalGeneration(EncoderDecoder):
    """BART with its LM head: (source ids [B, Ts], decoder ids [B, Td]) -> logits [B, Td, V] in float32."""

    def setup(self):
        cfg = self.config
        self.shared = Embed(cfg, cfg.padded_vocab_size, ("vocab", "embed"))
        self.encoder = BartEncoder(cfg)
        self.decoder = BartDecoder(cfg)
        self.final_logits_bias = self.param("final_logits_bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,),
                                            jnp.dtype(cfg.param_dtype))

    def check_length(self, length: int, what: str) -> None:
        check_positions(length, self.config, what)

    def logits(self, hidden: jax.Array) -> jax.Array:
        bias = vocabulary_columns(self.final_logits_bias, self.config).astype(jnp.float32)
        return self.shared.attend(hidden).astype(jnp.float32) + bias
