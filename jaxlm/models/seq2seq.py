"""The encoder-decoder interface T5 and BART share: the forward pass, split into `encode` and `decode`
for generation, with the decoder's positions, masks and KV-cache contract."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.nn.embed import check_token_inputs
from jaxlm.parallel.logical import constrain


def as_mask(mask: jax.Array | None) -> jax.Array | None:
    return None if mask is None else mask.astype(bool)


def check_encoder_states(states, padding_mask, rows: int, width: int) -> None:
    """ValueError unless `states` are [rows, Ts, width] and `padding_mask` (if any) [rows, Ts]: states of another
    batch broadcast against the decoder's rows, and another width met the cross-attention's kernels."""
    shape = tuple(jnp.shape(states))
    if len(shape) != 3 or shape[0] != rows or shape[2] != width:
        raise ValueError(f"encoder_states has shape {shape}; the decoder reads [batch, source length, hidden_size] = "
                         f"[{rows}, Ts, {width}], as encode returns them for its {rows} rows")
    if padding_mask is not None and tuple(jnp.shape(padding_mask)) != shape[:2]:
        raise ValueError(f"padding_mask has shape {tuple(jnp.shape(padding_mask))} and encoder_states {shape}: give "
                         "the encoder's mask, one per source token")


class EncoderDecoder(nn.Module):
    """(source ids [B, Ts], decoder ids [B, Td]) -> logits [B, Td, V] in float32.

    A family's `setup` makes `shared`, the token table both stacks embed with; `encoder`, which maps
    (embeddings [B, T, E], mask, deterministic) to states; and `decoder`, which maps (embeddings,
    positions, mask, encoder states, encoder mask, deterministic, decode) to states. It defines
    `logits` of the decoder states and, where its positions run out, `check_length`.

    Masks are true at real (right-padded) tokens. `encode` and `decode` split the forward pass for
    generation; `decode=True` runs the decoder's self-attention on a KV cache (see `Attention`).
    """

    config: TransformerConfig

    def __call__(self, input_ids, decoder_input_ids, padding_mask=None, decoder_padding_mask=None,
                 deterministic: bool = True) -> jax.Array:
        states = self.encode(input_ids, padding_mask, deterministic)
        return self.decode(decoder_input_ids, states, padding_mask, None, decoder_padding_mask, deterministic)

    def encode(self, input_ids, padding_mask=None, deterministic: bool = True) -> jax.Array:
        """Encoder states [B, Ts, E] of source ids [B, Ts]."""
        check_token_inputs(input_ids, padding_mask=padding_mask)
        self.check_length(input_ids.shape[1], "input_ids")
        return self.encoder(self.shared(input_ids), as_mask(padding_mask), deterministic)

    def decode(self, decoder_input_ids, encoder_states, padding_mask=None, decoder_positions=None,
               decoder_padding_mask=None, deterministic: bool = True, decode: bool = False) -> jax.Array:
        """Logits [B, Td, V] of decoder ids [B, Td] over encoder states; `padding_mask` is the encoder's.

        With `decode=True` the first call (ids [B, max_len], `mutable=["cache"]`) creates the cache;
        each later call must give `decoder_positions` [B, Td], the absolute positions of its tokens,
        and `decoder_padding_mask`, if any, covers the cache slots [B, max_len].
        """
        check_token_inputs(decoder_input_ids, "decoder_input_ids", decoder_positions=decoder_positions,
                           decoder_padding_mask=None if decode else decoder_padding_mask)
        check_encoder_states(encoder_states, padding_mask, jnp.shape(decoder_input_ids)[0], self.config.hidden_size)
        if decoder_positions is None:
            if decode and "cache" in self.variables:
                raise ValueError("decode=True on an existing cache needs decoder_positions [batch, length]: "
                                 "the absolute positions of these tokens")
            self.check_length(decoder_input_ids.shape[1], "decoder_input_ids")
            decoder_positions = jnp.arange(decoder_input_ids.shape[1])[None, :]
        hidden = self.decoder(self.shared(decoder_input_ids), decoder_positions, as_mask(decoder_padding_mask),
                              encoder_states, as_mask(padding_mask), deterministic, decode)
        return constrain(self.logits(hidden), ("batch", "length", "vocab"))

    def check_length(self, length: int, what: str) -> None:
        """Raise unless `length` tokens fit the model's positions (relative positions always do)."""

    def logits(self, hidden: jax.Array) -> jax.Array:
        """float32 logits [B, T, V] of decoder states [B, T, E]."""
        raise NotImplementedError
