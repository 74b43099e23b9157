"""BERT's pretraining objective: masked LM on gathered positions plus next-sentence prediction."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxlm.models.config import TransformerConfig
from jaxlm.models.heads import BertForPreTraining
from jaxlm.objectives.losses import ratio, weighted_cross_entropy

BATCH_AXES = {
    "input_ids": ("batch", "length"),
    "segment_ids": ("batch", "length"),
    "input_mask": ("batch", "length"),
    "masked_positions": ("batch", None),
    "masked_labels": ("batch", None),
    "masked_weights": ("batch", None),
    "nsp_label": ("batch",),
}


@dataclasses.dataclass(frozen=True)
class MlmNsp:
    """Owns the batch format, the loss and the metrics; the trainer sees only this interface."""

    config: TransformerConfig
    max_seq_length: int
    max_predictions: int

    @property
    def model(self) -> BertForPreTraining:
        return BertForPreTraining(self.config)

    def batch_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        seq, preds = self.max_seq_length, self.max_predictions
        shapes = {"input_ids": (seq,), "segment_ids": (seq,), "input_mask": (seq,),
                  "masked_positions": (preds,), "masked_labels": (preds,), "masked_weights": (preds,),
                  "nsp_label": ()}
        return {name: jax.ShapeDtypeStruct((batch_size, *shape),
                                           jnp.float32 if name == "masked_weights" else jnp.int32)
                for name, shape in shapes.items()}

    def init(self, rng: jax.Array):
        batch = {k: jnp.zeros(v.shape, v.dtype) for k, v in self.batch_shapes(1).items()}
        return self.model.init(rng, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                               batch["masked_positions"])["params"]

    def stats(self, params, batch, rng: jax.Array | None, deterministic: bool = False) -> dict:
        """Sums over the batch: losses, correct predictions and counts, for exact aggregation."""
        mlm_logits, nsp_logits = self.model.apply(
            {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"],
            batch["masked_positions"], deterministic=deterministic,
            rngs=None if deterministic else {"dropout": rng})
        mlm_loss, mlm_correct, mlm_count = weighted_cross_entropy(
            mlm_logits, batch["masked_labels"], batch["masked_weights"])
        nsp_loss, nsp_correct, nsp_count = weighted_cross_entropy(nsp_logits, batch["nsp_label"])
        return {"mlm_loss_sum": mlm_loss, "mlm_correct": mlm_correct, "mlm_count": mlm_count,
                "nsp_loss_sum": nsp_loss, "nsp_correct": nsp_correct, "nsp_count": nsp_count}

    @staticmethod
    def summarize(stats: dict) -> dict:
        mlm_loss = ratio(stats["mlm_loss_sum"], stats["mlm_count"])
        nsp_loss = ratio(stats["nsp_loss_sum"], stats["nsp_count"])
        return {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss,
                "mlm_acc": ratio(stats["mlm_correct"], stats["mlm_count"]),
                "nsp_loss": nsp_loss, "nsp_acc": ratio(stats["nsp_correct"], stats["nsp_count"])}

    def loss(self, params, batch, rng):
        """(scalar loss, summed stats); the function the trainer differentiates."""
        stats = self.stats(params, batch, rng)
        return self.summarize(stats)["loss"], stats

    def flops_per_token(self) -> float:
        """DESIGN.md's MFU numerator: 6·N + 12·L·d·T, with the MLM head counted on predictions only."""
        c, seq = self.config, self.max_seq_length
        layer = 4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size
        head_per_prediction = c.hidden_size ** 2 + c.hidden_size * c.vocab_size
        pooler_and_nsp = c.hidden_size ** 2 + 2 * c.hidden_size
        matmul_params = (c.num_layers * layer + head_per_prediction * self.max_predictions / seq
                         + pooler_and_nsp / seq)
        return 6 * matmul_params + 12 * c.num_layers * c.hidden_size * seq
