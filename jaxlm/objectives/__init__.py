"""jaxlm.objectives: the pretraining objectives (batch format, loss, metrics), jaxlm.families saying
which family trains with which; and the fine-tuning tasks (objectives.finetune)."""
from __future__ import annotations

from jaxlm.objectives.base import Objective
from jaxlm.objectives.causal import CausalLmObjective
from jaxlm.objectives.denoise import Seq2SeqObjective
from jaxlm.objectives.finetune import (CrfTaggingObjective, MultipleChoiceObjective, QuestionAnsweringObjective,
                                       SequenceClassificationObjective, SpanLabellingObjective,
                                       TokenClassificationObjective)
from jaxlm.objectives.mlm_nsp import MaskedLmObjective, MlmPairObjective
from jaxlm.objectives.sentence_pairs import CosineSimilarityObjective, RankingObjective, SoftmaxPairObjective
from jaxlm.objectives.span import SpanMlmSboObjective

__all__ = ["CausalLmObjective", "CosineSimilarityObjective", "CrfTaggingObjective", "MaskedLmObjective",
           "MlmPairObjective", "MultipleChoiceObjective", "Objective", "QuestionAnsweringObjective", "RankingObjective",
           "Seq2SeqObjective", "SequenceClassificationObjective", "SoftmaxPairObjective", "SpanLabellingObjective",
           "SpanMlmSboObjective", "TokenClassificationObjective"]
