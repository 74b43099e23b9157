"""ALBERT: factorised embeddings, one post-LN layer shared across depth, and the MLM + sentence-order heads."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.encoder import ACTIVATION, EncoderLayer
from jaxlm.models.heads import MlmHead, states_at
from jaxlm.nn.embed import BertEmbeddings, check_token_inputs
from jaxlm.nn.layers import Dense
from jaxlm.nn.stack import REMAT_POLICIES, scan_body
from jaxlm.parallel.logical import constrain

def shared_layer(config: TransformerConfig, name: str = "layer") -> nn.Module:
    """One EncoderLayer applied `num_layers` times (call with `run_shared`), rematerialised as
    `config.remat` says. With `config.scan_layers` the repeats are one nn.scan whose parameters are
    broadcast, not stacked: the parameter tree is the loop's (no "layers" axis), only the program
    changes (one traced body, so compile time does not grow with depth)."""
    layer_cls = scan_body(EncoderLayer) if config.scan_layers else EncoderLayer
    if config.remat != "none":
        layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[config.remat], prevent_cse=not config.scan_layers,
                             static_argnums=(3,))
    if config.scan_layers:
        layer_cls = nn.scan(layer_cls, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                            in_axes=nn.broadcast, length=config.num_layers)
    return layer_cls(config, name=name)


def run_shared(layer: nn.Module, config: TransformerConfig, x: jax.Array, *args) -> jax.Array:
    """x through `shared_layer`'s layer `num_layers` times; `args` go unchanged to each repeat."""
    if config.scan_layers:
        return layer(x, *args)[0]
    for _ in range(config.num_layers):
        x = layer(x, *args)
    return x


class AlbertEncoder(nn.Module):
    """input ids, segment ids and padding mask -> (hidden states [B, T, H], pooled [CLS] [B, H])."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg)
        self.projection = Dense(cfg, cfg.hidden_size, ("factor",), ("embed",))
        self.layer = shared_layer(cfg)
        self.pooler = Dense(cfg, cfg.hidden_size, ("embed",), ("embed_out",))

    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        x = self.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        return x, jnp.tanh(self.pooler(x[:, 0]))

    def hidden_states(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        """The last repeat's states [B, T, H] without the pooler (whose parameters then never exist)."""
        check_token_inputs(input_ids, segment_ids=segment_ids, padding_mask=padding_mask)
        if segment_ids is None:
            segment_ids = jnp.zeros_like(input_ids)
        if padding_mask is None:
            padding_mask = jnp.ones(input_ids.shape, bool)
        x = self.projection(self.embeddings(input_ids, segment_ids, deterministic))
        x = constrain(x, ACTIVATION)
        return run_shared(self.layer, self.config, x, padding_mask.astype(bool), deterministic)

    def word_embeddings(self, x: jax.Array) -> jax.Array:
        """E-wide states -> vocabulary logits through the tied word table."""
        return self.embeddings.word.attend(x)


class AlbertForPreTraining(nn.Module):
    """ALBERT with MLM logits at `masked_positions` [B, P, V] (every position's [B, T, V] when it is None) and
    sentence-order logits [B, 2]."""

    config: TransformerConfig

    def setup(self):
        self.encoder = AlbertEncoder(self.config)
        self.mlm = MlmHead(self.config)
        self.sop = Dense(self.config, 2, ("embed",), ("classes",))

    def __call__(self, input_ids, segment_ids=None, padding_mask=None, masked_positions=None,
                 deterministic: bool = True):
        hidden, pooled = self.encoder(input_ids, segment_ids, padding_mask, deterministic)
        mlm_logits = self.mlm(states_at(hidden, masked_positions), self.encoder.word_embeddings)
        return mlm_logits, self.sop(pooled).astype(jnp.float32)
