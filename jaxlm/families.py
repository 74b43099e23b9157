"""The one registry of model families: each family's network, objective, stored-row layout, per-epoch
transform, tokenizer roles, Hugging Face converter and abilities. No other module compares family names."""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

import flax.linen as nn

from jaxlm.data import examples
from jaxlm.data.denoising import bart_target_length, t5_lengths
from jaxlm.data.settings import DataConfig
from jaxlm.models.albert import AlbertEncoder, AlbertForPreTraining
from jaxlm.models.bart import BartForConditionalGeneration
from jaxlm.models.config import TransformerConfig
from jaxlm.models.decoder import CausalLM
from jaxlm.models.encoder import BertEncoder
from jaxlm.models.heads import BertForPreTraining, MaskedLM
from jaxlm.models.spanbert import SpanBertForPreTraining
from jaxlm.models.t5 import T5ForConditionalGeneration
from jaxlm.objectives import (CausalLmObjective, MaskedLmObjective, MlmPairObjective, Objective, Seq2SeqObjective,
                              SpanMlmSboObjective)

# (model config, data settings, network class) -> the family's pretraining objective
ObjectiveFactory = Callable[[TransformerConfig, DataConfig, Callable], Objective]

# Token roles (jaxlm/data/tokenizers/roles.py) each kind of stored rows needs.
MLM_ROLES = ("cls", "sep", "mask", "pad")
CAUSAL_ROLES = ("eos",)
T5_ROLES = ("eos", "sentinels")
BART_ROLES = ("bos", "eos", "mask")

# The data settings that only some objectives read (the rest, lengths, tokenizer and corpus, every family reads).
MLM_SETTINGS = ("mask_prob", "max_predictions", "whole_word_masking")
PAIR_SETTINGS = ("short_seq_prob", "dupe_factor")
SPAN_SETTINGS = ("mask_prob", "max_predictions", "span_p", "max_span")  # SpanBERT masks whole words always
CAUSAL_SETTINGS = ("packed",)
T5_SETTINGS = ("noise_density", "mean_span_length", "max_target_length")
BART_SETTINGS = ("mask_ratio", "poisson_lambda", "permute_sentences", "max_target_length")

# Fine-tuning heads (issue 11) that fit an encoder or a decoder.
ENCODER_HEADS = ("sequence_classification", "token_classification", "span_labelling", "question_answering",
                 "multiple_choice", "sentence_embedding")
DECODER_HEADS = ("causal_lm", "sequence_classification")
ENCODER_DECODER_HEADS = ("text_to_text",)


@dataclasses.dataclass(frozen=True)
class Family:
    """One family, registered once."""

    name: str
    network: Callable[..., nn.Module]  # the pretraining network, built from a TransformerConfig
    objective: ObjectiveFactory
    layout: str  # its stored rows (jaxlm/data/layouts.py)
    transform: examples.TransformFactory  # what each epoch draws on those rows
    roles: tuple[str, ...]  # token roles its rows need from the tokenizer
    data_settings: tuple[str, ...]  # of the settings that only some objectives read, those its rows and transform do
    # Hugging Face conversion: the module of {name}_config_from_hf, ..._params_to_hf; the auto class
    # that loads what to-hf writes; the head parameter groups a checkpoint may lack, and the
    # architecture of the bare backbone that AutoModel loads when they are missing
    converters: str = ""
    auto_class: str = ""
    hf_heads: tuple[str, ...] = ()
    hf_backbone: str = ""
    # abilities
    embeds: bool = False  # jaxlm embed: pooled encoder states
    generates: str = ""  # jaxlm generate: "causal", "seq2seq" or "" (cannot)
    # jaxlm eval: how it scores continuations (perplexity, choices): "causal" (next-token likelihood),
    # "masked" (pseudo-log-likelihood through the masked-LM head) or "seq2seq" (target likelihood)
    scores: str = ""
    heads: tuple[str, ...] = ()  # fine-tuning heads that fit
    # the encoder the fine-tuning heads sit on (jaxlm/models/task_heads.py), and how its sequence and
    # multiple-choice heads pool it, as the family's Hugging Face heads do
    backbone: Callable[..., nn.Module] | None = None
    pooling: str = "pooler"
    choice_pooling: str = "pooler"
    pair_separators: int = 1  # separator tokens between the segments of a pair: RoBERTa's </s></s> is 2
    factorised_embeddings: bool = False  # token embeddings model.embedding_size wide, projected up (ALBERT)
    positions: tuple[str, ...] = ("learned",)  # the model.position_embedding kinds its network reads

    def make_objective(self, config: TransformerConfig, data: DataConfig) -> Objective:
        return self.objective(config, data, self.network)

    def converter(self, suffix: str) -> Callable:
        """`{name}_{suffix}` of the family's converter module, e.g. converter("params_from_hf")."""
        if not self.converters:
            raise ValueError(f"the {self.name} family has no Hugging Face converter")
        return getattr(importlib.import_module(self.converters), f"{self.name}_{suffix}")


def _pairs(task: str) -> ObjectiveFactory:
    return lambda config, data, network: MlmPairObjective(config, data.max_seq_length, network,
                                                           data.max_predictions, task)


def _masked_lm(config, data, network) -> Objective:
    return MaskedLmObjective(config, data.max_seq_length, network, data.max_predictions)


def _span_mlm_sbo(config, data, network) -> Objective:
    return SpanMlmSboObjective(config, data.max_seq_length, network, data.max_predictions, data.max_span)


def _causal_lm(config, data, network) -> Objective:
    return CausalLmObjective(config, data.max_seq_length, network)


def _seq2seq(target_length: Callable[[DataConfig], int]) -> ObjectiveFactory:
    return lambda config, data, network: Seq2SeqObjective(config, data.max_seq_length, network,
                                                           target_length(data))


# an encoder's attention applies RoPE, when asked, on top of its learned positions
ENCODER = dict(embeds=True, scores="masked", heads=ENCODER_HEADS, backbone=BertEncoder, positions=("learned", "rope"))
DECODER = dict(generates="causal", scores="causal", heads=DECODER_HEADS, positions=("learned", "rope"))
ENCODER_DECODER = dict(generates="seq2seq", scores="seq2seq", heads=ENCODER_DECODER_HEADS)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bert", BertForPreTraining, _pairs("nsp"), "nsp_pairs", examples.nsp_transform, MLM_ROLES,
           MLM_SETTINGS + PAIR_SETTINGS, "jaxlm.convert.hf", "AutoModelForPreTraining", ("mlm", "nsp"), "BertModel",
           **ENCODER),
    Family("roberta", MaskedLM, _masked_lm, "sentence_rows", examples.sentence_mlm_transform, MLM_ROLES, MLM_SETTINGS,
           "jaxlm.convert.hf_encoders", "AutoModelForMaskedLM", ("mlm",), "RobertaModel", **ENCODER,
           pooling="first_dense_tanh", pair_separators=2),
    Family("distilbert", MaskedLM, _masked_lm, "sentence_rows", examples.sentence_mlm_transform, MLM_ROLES,
           MLM_SETTINGS, "jaxlm.convert.hf_encoders", "AutoModelForMaskedLM", ("mlm",), "DistilBertModel", **ENCODER,
           pooling="first_dense_relu", choice_pooling="first_dense_relu"),
    Family("albert", AlbertForPreTraining, _pairs("sop"), "sop_pairs", examples.sop_transform, MLM_ROLES,
           MLM_SETTINGS + PAIR_SETTINGS, "jaxlm.convert.hf_albert", "AutoModelForPreTraining",
           **(ENCODER | dict(backbone=AlbertEncoder)), factorised_embeddings=True),
    Family("spanbert", SpanBertForPreTraining, _span_mlm_sbo, "sentence_rows", examples.span_transform, MLM_ROLES,
           SPAN_SETTINGS, **ENCODER),
    Family("gpt2", CausalLM, _causal_lm, "causal", examples.causal_transform, CAUSAL_ROLES, CAUSAL_SETTINGS,
           "jaxlm.convert.hf_decoder", "AutoModelForCausalLM", **DECODER),
    Family("llama", CausalLM, _causal_lm, "causal", examples.causal_transform, CAUSAL_ROLES, CAUSAL_SETTINGS,
           "jaxlm.convert.hf_decoder", "AutoModelForCausalLM", **DECODER),
    Family("t5", T5ForConditionalGeneration, _seq2seq(lambda data: t5_lengths(data)[1]), "t5_chunks",
           examples.t5_transform, T5_ROLES, T5_SETTINGS, "jaxlm.convert.hf_t5", "AutoModelForSeq2SeqLM",
           **ENCODER_DECODER, positions=("relative",)),
    Family("bart", BartForConditionalGeneration, _seq2seq(bart_target_length), "bart_rows", examples.bart_transform,
           BART_ROLES, BART_SETTINGS, "jaxlm.convert.hf_bart", "AutoModelForSeq2SeqLM", **ENCODER_DECODER),
)}


OBJECTIVE_SETTINGS = tuple(sorted({name for family in FAMILIES.values() for name in family.data_settings}))


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"model.family={name!r}; choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def names(**abilities) -> list[str]:
    """The families with every given ability, e.g. names(embeds=True), names(generates="causal")."""
    return [f.name for f in FAMILIES.values() if all(getattr(f, k) == v for k, v in abilities.items())]


def make_objective(config: TransformerConfig, data: DataConfig) -> Objective:
    """The pretraining objective of `config.family` with the lengths of `data`."""
    return get(config.family).make_objective(config, data)
