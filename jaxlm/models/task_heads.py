"""Fine-tuning heads on an encoder backbone (the one its config's family registers in jaxlm.families:
BertEncoder, or AlbertEncoder for ALBERT; its parameters under `encoder`, as in pretraining): sequence
classification and regression, token classification, extractive question answering and multiple choice, each
pooling as its Hugging Face counterpart does, and token classification through a CRF; and a decoder's sequence
classification from its last token."""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.crf import CRF
from jaxlm.models.decoder import Decoder
from jaxlm.models.heads import states_at
from jaxlm.nn.dropout import Dropout
from jaxlm.nn.layers import Dense, normal_init

# How a sequence is summarised before the classifier: BERT's and ALBERT's tanh pooler; RoBERTa's
# dense + tanh on the first token's state; DistilBERT's dense + ReLU on it; that state alone; the
# mean of the real tokens' states.
POOLINGS = ("pooler", "first_dense_tanh", "first_dense_relu", "first", "mean")


def check_labels(head: nn.Module) -> None:
    if head.num_labels < 1:
        raise ValueError(f"{type(head).__name__}: num_labels={head.num_labels}; use 1 (regression) or more classes")


def encoder_backbone(head: nn.Module) -> Callable[..., nn.Module]:
    """The head's `backbone`, or where it gives none the encoder its config's family registers (the one the
    fine-tune command uses); ValueError for a family without one, naming those with one."""
    if head.backbone is not None:
        return head.backbone
    from jaxlm import families  # the registry imports jaxlm.models, so not at import time
    family = families.get(head.config.family)
    if family.backbone is None:
        encoders = [name for name in families.FAMILIES if families.get(name).backbone is not None]
        decoder_head = family.generates == "causal" and isinstance(head, SequenceClassifier)
        instead = "; a decoder's is DecoderClassifier" if decoder_head else ""
        raise ValueError(f"{type(head).__name__} sits on an encoder, which a {head.config.family} model has not; "
                         f"families with one: {', '.join(encoders)}{instead}")
    return family.backbone


def family_pooling(head: nn.Module, choices: bool = False) -> str:
    """The head's `pooling`, or where it gives none its family's Hugging Face head's."""
    if head.pooling is not None:
        return head.pooling
    from jaxlm import families  # the registry imports jaxlm.models, so not at import time
    family = families.get(head.config.family)
    return family.choice_pooling if choices else family.pooling


class EncoderHead(nn.Module):
    """A head on its config's family's encoder, checked when built: the family has one, and `num_labels`, where the
    head has it, is 1 or more."""

    def __post_init__(self):
        if hasattr(self, "num_labels"):
            check_labels(self)
        encoder_backbone(self)
        super().__post_init__()


def mean_states(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    weights = mask[..., None].astype(hidden.dtype)
    return (hidden * weights).sum(1) / jnp.maximum(weights.sum(1), 1)


def summarize(config: TransformerConfig, encoder: nn.Module, pooling: str, input_ids, segment_ids, padding_mask,
              deterministic: bool) -> jax.Array:
    """One vector per sequence [B, E] by `pooling`, dropout applied; called inside a head's compact
    `__call__`, so the dense layer of the first-token poolings is the head's `dense`."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r}; choose one of {', '.join(POOLINGS)}")
    dropout = Dropout(config.hidden_dropout)
    if padding_mask is None:
        padding_mask = jnp.ones(input_ids.shape, bool)
    if pooling == "pooler":
        return dropout(encoder(input_ids, segment_ids, padding_mask, deterministic)[1], deterministic=deterministic)
    hidden = encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
    if pooling == "mean":
        return dropout(mean_states(hidden, padding_mask), deterministic=deterministic)
    first = hidden[:, 0]
    if pooling == "first":
        return dropout(first, deterministic=deterministic)
    if pooling == "first_dense_tanh":  # RoBERTa drops out before its dense layer too
        first = dropout(first, deterministic=deterministic)
    dense = Dense(config, config.hidden_size, ("embed",), ("embed_out",), name="dense")(first)
    return dropout(jnp.tanh(dense) if pooling == "first_dense_tanh" else jax.nn.relu(dense),
                   deterministic=deterministic)


class SequenceClassifier(EncoderHead):
    """Logits [B, num_labels] of single sequences or segment-A/B pairs (num_labels=1: regression)."""

    config: TransformerConfig
    num_labels: int
    pooling: str | None = None  # None: the family's
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        encoder = encoder_backbone(self)(self.config, name="encoder")
        summary = summarize(self.config, encoder, family_pooling(self), input_ids, segment_ids, padding_mask,
                            deterministic)
        logits = Dense(self.config, self.num_labels, ("embed",), ("classes",), name="classifier")(summary)
        return logits.astype(jnp.float32)


class TokenClassifier(EncoderHead):
    """Logits [B, T, num_labels] at every token."""

    config: TransformerConfig
    num_labels: int
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        cfg = self.config
        encoder = encoder_backbone(self)(cfg, name="encoder")
        hidden = encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        hidden = Dropout(cfg.hidden_dropout)(hidden, deterministic=deterministic)
        logits = Dense(cfg, self.num_labels, ("embed",), ("classes",), name="classifier")(hidden)
        return logits.astype(jnp.float32)


class QuestionAnswering(EncoderHead):
    """(start logits, end logits), each [B, T], over the tokens of question + passage."""

    config: TransformerConfig
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        cfg = self.config
        encoder = encoder_backbone(self)(cfg, name="encoder")
        hidden = encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        logits = Dense(cfg, 2, ("embed",), ("classes",), name="qa_outputs")(hidden).astype(jnp.float32)
        return logits[..., 0], logits[..., 1]


class MultipleChoice(EncoderHead):
    """Scores [B, C] of C (context, choice) pairs per example; inputs are [B, C, T]."""

    config: TransformerConfig
    pooling: str | None = None  # None: the family's
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        if jnp.ndim(input_ids) != 3:
            raise ValueError("MultipleChoice reads input_ids [batch, choices, length], not shape "
                             f"{jnp.shape(input_ids)}")
        batch, choices, length = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(batch * choices, length)
        encoder = encoder_backbone(self)(self.config, name="encoder")
        summary = summarize(self.config, encoder, family_pooling(self, choices=True), flat(input_ids),
                            flat(segment_ids), flat(padding_mask), deterministic)
        scores = Dense(self.config, 1, ("embed",), ("classes",), name="classifier")(summary)
        return scores.astype(jnp.float32).reshape(batch, choices)


class CrfTagger(EncoderHead):
    """Emissions [B, W, num_labels] at the first subword of each word (`word_positions`; every token's [B, T,
    num_labels] when it is None), for a linear-chain CRF over the words; `labels` in tag order constrain its
    transitions to BIO's rules."""

    config: TransformerConfig
    num_labels: int
    labels: tuple[str, ...] | None = None
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    def setup(self):
        cfg = self.config
        self.encoder = encoder_backbone(self)(cfg)
        self.dropout = Dropout(cfg.hidden_dropout)
        self.classifier = Dense(cfg, self.num_labels, ("embed",), ("classes",))
        self.crf = CRF(self.num_labels, self.labels)

    def __call__(self, input_ids, segment_ids=None, padding_mask=None, word_positions=None,
                 deterministic: bool = True):
        hidden = self.encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        emissions = self.classifier(self.dropout(hidden, deterministic=deterministic)).astype(jnp.float32)
        if self.is_initializing():  # init runs __call__ only: create the CRF's scores too
            first = jnp.zeros(emissions.shape[:1] + (1,), jnp.int32)
            self.crf.log_likelihood(emissions[:, :1], first, first + 1)
        return states_at(emissions, word_positions)

    def log_likelihood(self, emissions, tags, mask):
        return self.crf.log_likelihood(emissions, tags, mask)

    def decode(self, emissions, mask):
        return self.crf.decode(emissions, mask)[0]


class DecoderClassifier(nn.Module):
    """Logits [B, num_labels] of a decoder (GPT-2, Llama) at each row's last real token (rows padded on
    either side: transformers' rightmost token that is not padding), through a bias-free `score` as transformers'
    *ForSequenceClassification; the decoder under `decoder`, as in CausalLM, so a pretrained one loads as it is."""

    config: TransformerConfig
    num_labels: int

    def __post_init__(self):
        check_labels(self)
        from jaxlm import families  # the registry imports jaxlm.models, so not at import time
        if families.get(self.config.family).generates != "causal":
            raise ValueError(f"DecoderClassifier sits on a decoder, which a {self.config.family} model is not; "
                             f"decoder families: {', '.join(families.names(generates='causal'))}")
        super().__post_init__()

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, padding_mask=None, deterministic: bool = True):
        cfg = self.config
        if padding_mask is None:
            padding_mask = jnp.ones(input_ids.shape, bool)
        documents = padding_mask.astype(jnp.int32)  # one document per row, padding apart
        hidden = Decoder(cfg, name="decoder")(input_ids, None, documents, documents > 0, deterministic)
        last = input_ids.shape[1] - 1 - jnp.argmax(documents[:, ::-1], axis=-1)  # rows padded on either side
        pooled = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
        score = self.param("score", normal_init(cfg, ("embed", "classes")), (cfg.hidden_size, self.num_labels),
                           jnp.dtype(cfg.param_dtype))
        return (pooled @ score.astype(pooled.dtype)).astype(jnp.float32)


class SpanLabeller(EncoderHead):
    """Logits [B, S, num_labels + 1] (class 0: no entity) of the spans from `span_starts` to `span_ends`
    (tokens, inclusive), each span represented by its boundary states and an attention-pooled summary of
    its tokens (a learned score per token, softmax within the span), through a two-layer classifier."""

    config: TransformerConfig
    num_labels: int
    backbone: Callable[..., nn.Module] | None = None  # None: the family's

    @nn.compact
    def __call__(self, input_ids, segment_ids=None, padding_mask=None, span_starts=None, span_ends=None,
                 deterministic: bool = True):
        cfg = self.config
        encoder = encoder_backbone(self)(cfg, name="encoder")
        hidden = encoder.hidden_states(input_ids, segment_ids, padding_mask, deterministic)
        hidden = Dropout(cfg.hidden_dropout)(hidden, deterministic=deterministic)
        scores = Dense(cfg, 1, ("embed",), (None,), name="attention")(hidden)[..., 0].astype(jnp.float32)
        positions = jnp.arange(hidden.shape[1])
        inside = (positions >= span_starts[..., None]) & (positions <= span_ends[..., None])  # [B, S, T]
        weights = jax.nn.softmax(jnp.where(inside, scores[:, None, :], -1e9), axis=-1).astype(hidden.dtype)
        summary = jnp.einsum("bst,bte->bse", weights, hidden)
        gather = lambda index: jnp.take_along_axis(hidden, index[..., None], axis=1)
        spans = jnp.concatenate([gather(span_starts), gather(span_ends), summary], axis=-1)
        spans = jax.nn.gelu(Dense(cfg, cfg.hidden_size, ("mlp",), ("embed",), name="span_dense")(spans))
        return Dense(cfg, self.num_labels + 1, ("embed",), ("classes",), name="classifier")(spans).astype(jnp.float32)
