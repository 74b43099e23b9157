"""SpanBERT's objective: masked LM plus the span boundary objective (SBO) on the same targets."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import numpy as np

from jaxlm.objectives.base import INT, Field, Objective
from jaxlm.objectives.losses import prediction_stats, prediction_summary
from jaxlm.objectives.mlm_nsp import masked_lm_fields, mlm_flops_per_token, mlm_stats, mlm_summary


@dataclasses.dataclass(frozen=True)
class SpanMlmSboObjective(Objective):
    """Every masked target also has `pair_positions` (the tokens just left and right of its span)
    and `span_offsets` (its 0-based place in the span); loss = MLM + SBO."""

    max_predictions: int = 20
    max_span_length: int = 10

    @property
    def model(self) -> nn.Module:
        return self.network(self.config, self.max_span_length)

    def fields(self):
        preds = self.max_predictions
        return masked_lm_fields(self.max_seq_length, preds) | {
            "pair_positions": Field((preds, 2), INT, (None, None)), "span_offsets": Field((preds,), INT, (None,))}

    @staticmethod
    def model_inputs(batch):
        return (batch["input_ids"], batch["segment_ids"], batch["input_mask"], batch["masked_positions"],
                batch["pair_positions"], batch["span_offsets"])

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        mlm_logits, sbo_logits = self.apply(params, batch, rng, deterministic)
        return mlm_stats(mlm_logits, batch) | prediction_stats("sbo", sbo_logits, batch["masked_labels"],
                                                                batch["masked_weights"])

    def summarize(self, stats: dict) -> dict:
        mlm = mlm_summary(stats)
        sbo_loss, sbo_acc = prediction_summary("sbo", stats)
        return {"loss": mlm["mlm_loss"] + sbo_loss, **mlm, "sbo_loss": sbo_loss, "sbo_acc": sbo_acc}

    def synthetic_batch(self, batch_size: int, seed: int = 0) -> dict:
        batch = super().synthetic_batch(batch_size, seed)
        batch["span_offsets"] = np.random.default_rng(seed).integers(
            0, self.max_span_length, batch["span_offsets"].shape, dtype=np.int32)
        return batch

    def flops_per_token(self) -> float:
        c = self.config
        sbo_per_prediction = 3 * c.hidden_size * c.hidden_size + c.hidden_size ** 2 + c.hidden_size * c.vocab_size
        return mlm_flops_per_token(c, self.max_seq_length, self.max_predictions,
                                   sbo_per_prediction * self.max_predictions)
