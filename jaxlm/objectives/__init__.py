"""jaxlm.objectives: each family's pretraining objective (batch format, loss, metrics), chosen by family."""
from __future__ import annotations

from jaxlm.objectives.base import Objective
from jaxlm.objectives.causal import CausalLm
from jaxlm.objectives.denoise import Seq2Seq
from jaxlm.objectives.mlm_nsp import MaskedLm, MlmNsp
from jaxlm.objectives.span import SpanMlmSbo


def target_length(model, data) -> int:
    """Decoder length of an encoder-decoder: data.max_target_length, or by default T5's exact
    target length for span corruption of max_seq_length inputs, or max_seq_length (BART)."""
    if data.max_target_length:
        return data.max_target_length
    if model.family == "t5":
        from jaxlm.data.denoising import t5_input_target_lengths

        return t5_input_target_lengths(data.max_seq_length, data.noise_density, data.mean_span_length)[1]
    return data.max_seq_length


def make_objective(model, data) -> Objective:
    """The objective of `model.family` (a TransformerConfig) with the lengths of `data` (a DataConfig)."""
    family, seq = model.family, data.max_seq_length
    if family in ("bert", "albert"):
        return MlmNsp(model, seq, data.max_predictions)
    if family in ("roberta", "distilbert"):
        return MaskedLm(model, seq, data.max_predictions)
    if family == "spanbert":
        return SpanMlmSbo(model, seq, data.max_predictions)
    if family in ("gpt2", "llama"):
        return CausalLm(model, seq)
    if family in ("t5", "bart"):
        return Seq2Seq(model, seq, target_length(model, data))
    raise ValueError(f"no objective for model.family={family!r}")


__all__ = ["CausalLm", "MaskedLm", "MlmNsp", "Objective", "Seq2Seq", "SpanMlmSbo", "make_objective", "target_length"]
