"""Masked LM on gathered positions: with a sentence-pair task (BERT's next-sentence prediction,
ALBERT's sentence-order prediction) or alone (RoBERTa, DistilBERT)."""
from __future__ import annotations

import dataclasses

from jaxlm.objectives.base import FLOAT, INT, Field, Objective, layer_matmul_params
from jaxlm.objectives.losses import prediction_stats, prediction_summary


def masked_lm_fields(seq: int, preds: int, segments: bool = True) -> dict[str, Field]:
    fields = {"input_ids": Field((seq,), INT, ("length",)), "input_mask": Field((seq,), INT, ("length",)),
              "masked_positions": Field((preds,), INT, (None,)), "masked_labels": Field((preds,), INT, (None,)),
              "masked_weights": Field((preds,), FLOAT, (None,))}
    if segments:
        fields["segment_ids"] = Field((seq,), INT, ("length",))
    return fields


def mlm_stats(mlm_logits, batch) -> dict:
    return prediction_stats("mlm", mlm_logits, batch["masked_labels"], batch["masked_weights"])


def mlm_summary(stats: dict) -> dict:
    loss, accuracy = prediction_summary("mlm", stats)
    return {"mlm_loss": loss, "mlm_acc": accuracy}


def mlm_flops_per_token(config, seq: int, preds: int, extra_per_sequence: float = 0.0) -> float:
    """DESIGN.md's 6·N + 12·L·d·T, with the MLM head counted on predicted positions only."""
    c = config
    embed = c.embedding_size or c.hidden_size
    head_per_prediction = c.hidden_size * embed + embed * c.vocab_size
    projection = c.embedding_size * c.hidden_size if c.embedding_size else 0
    matmul_params = (c.num_layers * layer_matmul_params(c) + projection + head_per_prediction * preds / seq
                     + extra_per_sequence / seq)
    return 6 * matmul_params + 12 * c.num_layers * c.hidden_size * seq


@dataclasses.dataclass(frozen=True)
class MlmPairObjective(Objective):
    """Masked LM plus a sentence-pair task, `task`: BERT's next-sentence prediction ("nsp") or ALBERT's
    sentence-order prediction ("sop"); the pair label is `nsp_label` either way."""

    max_predictions: int = 20
    task: str = "nsp"

    def fields(self):
        return masked_lm_fields(self.max_seq_length, self.max_predictions) | {"nsp_label": Field((), INT, ())}

    @staticmethod
    def model_inputs(batch):
        return batch["input_ids"], batch["segment_ids"], batch["input_mask"], batch["masked_positions"]

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        """Sums over the batch: losses, correct predictions and counts, for exact aggregation."""
        mlm_logits, pair_logits = self.apply(params, batch, rng, deterministic)
        return mlm_stats(mlm_logits, batch) | prediction_stats("pair", pair_logits, batch["nsp_label"])

    def summarize(self, stats: dict) -> dict:
        mlm = mlm_summary(stats)
        pair_loss, pair_acc = prediction_summary("pair", stats)
        return {"loss": mlm["mlm_loss"] + pair_loss, **mlm, f"{self.task}_loss": pair_loss,
                f"{self.task}_acc": pair_acc}

    def flops_per_token(self) -> float:
        pooler_and_pair = self.config.hidden_size ** 2 + 2 * self.config.hidden_size
        return mlm_flops_per_token(self.config, self.max_seq_length, self.max_predictions, pooler_and_pair)


@dataclasses.dataclass(frozen=True)
class MaskedLmObjective(Objective):
    """Masked LM alone (RoBERTa, DistilBERT): no sentence pairs, no segment ids."""

    max_predictions: int = 20

    def fields(self):
        return masked_lm_fields(self.max_seq_length, self.max_predictions, segments=False)

    @staticmethod
    def model_inputs(batch):
        return batch["input_ids"], None, batch["input_mask"], batch["masked_positions"]

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        return mlm_stats(self.apply(params, batch, rng, deterministic), batch)

    def summarize(self, stats: dict) -> dict:
        mlm = mlm_summary(stats)
        return {"loss": mlm["mlm_loss"], **mlm}

    def flops_per_token(self) -> float:
        return mlm_flops_per_token(self.config, self.max_seq_length, self.max_predictions)
