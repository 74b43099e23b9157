"""ALBERT: factorised embeddings, one post-LN layer shared across depth, and the MLM + sentence-order heads."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.encoder import ACTIVATION, EncoderLayer
from jaxlm.models.heads import gather_positions
from jaxlm.nn.embed import Embed, learned_positions
from jaxlm.nn.layers import ACTIVATIONS, Dense, LayerNorm, zeros_init
from jaxlm.nn.stack import REMAT_POLICIES, _scan_body

FACTORED = ("batch", "length", "factor")


def factor_width(config: TransformerConfig) -> int:
    """E, the width of the token/position/type tables (hidden_size when `embedding_size` is 0)."""
    return config.embedding_size or config.hidden_size


def _on_factor(tree):
    """Boxed parameters with their "embed" axis renamed "factor"."""
    rename = lambda box: box.replace(names=tuple("factor" if n == "embed" else n for n in box.names))
    is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
    return jax.tree.map(lambda x: rename(x) if is_box(x) else x, tree, is_leaf=is_box)


def factor_norm(config: TransformerConfig, name: str | None = None) -> nn.Module:
    """The shared LayerNorm over an E-wide axis, its parameters named ("factor",) instead of ("embed",)."""
    return nn.map_variables(LayerNorm, "params", trans_out_fn=_on_factor, init=True)(config, name=name)


class AlbertEmbeddings(nn.Module):
    """BERT's embeddings at width E: word + position (+ token-type) tables [*, E], LayerNorm, dropout."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        narrow = dataclasses.replace(cfg, hidden_size=factor_width(cfg))
        self.word = Embed(narrow, cfg.vocab_size, ("vocab", "factor"))
        self.position = Embed(narrow, cfg.max_position_embeddings, ("length", "factor"))
        if cfg.type_vocab_size:
            self.token_type = Embed(narrow, cfg.type_vocab_size, ("segment", "factor"))
        self.norm = factor_norm(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def __call__(self, input_ids, segment_ids, deterministic: bool) -> jax.Array:
        x = self.word(input_ids) + self.position(learned_positions(input_ids, self.config))
        if self.config.type_vocab_size:
            x = x + self.token_type(segment_ids)
        x = nn.with_logical_constraint(x, FACTORED)
        return self.dropout(self.norm(x), deterministic=deterministic)


def shared_layer(config: TransformerConfig, name: str = "layer") -> nn.Module:
    """One EncoderLayer applied `num_layers` times (call with `run_shared`), rematerialised as
    `config.remat` says. With `config.scan_layers` the repeats are one nn.scan whose parameters are
    broadcast, not stacked: the parameter tree is the loop's (no "layers" axis), only the program
    changes (one traced body, so compile time does not grow with depth)."""
    layer_cls = _scan_body(EncoderLayer) if config.scan_layers else EncoderLayer
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
        self.embeddings = AlbertEmbeddings(cfg)
        self.projection = Dense(cfg, cfg.hidden_size, ("factor",), ("embed",))
        self.layer = shared_layer(cfg)
        self.pooler = Dense(cfg, cfg.hidden_size, ("embed",), ("embed_out",))

    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        x = self.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        return x, jnp.tanh(self.pooler(x[:, 0]))

    def hidden_states(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        """The last repeat's states [B, T, H] without the pooler (whose parameters then never exist)."""
        if segment_ids is None:
            segment_ids = jnp.zeros_like(input_ids)
        if padding_mask is None:
            padding_mask = jnp.ones(input_ids.shape, bool)
        x = self.projection(self.embeddings(input_ids, segment_ids, deterministic))
        x = nn.with_logical_constraint(x, ACTIVATION)
        return run_shared(self.layer, self.config, x, padding_mask.astype(bool), deterministic)

    def word_embeddings(self, x: jax.Array) -> jax.Array:
        """E-wide states -> vocabulary logits through the tied word table."""
        return self.embeddings.word.attend(x)


class AlbertMlmHead(nn.Module):
    """dense H -> E, the config's activation, LayerNorm(E), then the tied E-wide word table plus a bias."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, states: jax.Array, decode) -> jax.Array:
        cfg = self.config
        h = Dense(cfg, factor_width(cfg), ("embed",), ("factor",), name="transform")(states)
        h = factor_norm(cfg, name="norm")(ACTIVATIONS[cfg.activation](h))
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.vocab_size,), jnp.dtype(cfg.param_dtype))
        return decode(h).astype(jnp.float32) + bias


class AlbertForPreTraining(nn.Module):
    """ALBERT with MLM logits at `masked_positions` [B, P, V] and sentence-order logits [B, 2]."""

    config: TransformerConfig

    def setup(self):
        self.encoder = AlbertEncoder(self.config)
        self.mlm = AlbertMlmHead(self.config)
        self.sop = Dense(self.config, 2, ("embed",), ("classes",))

    def __call__(self, input_ids, segment_ids, padding_mask, masked_positions, deterministic: bool = True):
        hidden, pooled = self.encoder(input_ids, segment_ids, padding_mask, deterministic)
        mlm_logits = self.mlm(gather_positions(hidden, masked_positions), self.encoder.word_embeddings)
        return mlm_logits, self.sop(pooled).astype(jnp.float32)
