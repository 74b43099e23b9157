"""jaxlm.objectives: the pretraining objectives (batch format, loss, metrics); jaxlm.families says
which family trains with which."""
from __future__ import annotations

from jaxlm.objectives.base import Objective
from jaxlm.objectives.causal import CausalLmObjective
from jaxlm.objectives.denoise import Seq2SeqObjective
from jaxlm.objectives.mlm_nsp import MaskedLmObjective, MlmPairObjective
from jaxlm.objectives.span import SpanMlmSboObjective

__all__ = ["CausalLmObjective", "MaskedLmObjective", "MlmPairObjective", "Objective", "Seq2SeqObjective",
           "SpanMlmSboObjective"]
