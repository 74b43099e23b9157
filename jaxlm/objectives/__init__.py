"""jaxlm.objectives: each family's pretraining objective (batch format, loss, metrics), chosen by family."""
from __future__ import annotations

from jaxlm.objectives.base import Objective
from jaxlm.objectives.causal import CausalLm
from jaxlm.objectives.denoise import Seq2Seq
from jaxlm.objectives.mlm_nsp import MaskedLm, MlmNsp
from jaxlm.objectives.span import SpanMlmSbo


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
        return Seq2Seq(model, seq, data.max_target_length)
    raise ValueError(f"no objective for model.family={family!r}")


__all__ = ["CausalLm", "MaskedLm", "MlmNsp", "Objective", "Seq2Seq", "SpanMlmSbo", "make_objective"]
