"""Causal (next-token) LM for GPT-2 and Llama-style decoders, on packed or padded rows."""
from __future__ import annotations

import dataclasses
import functools

from jaxlm.objectives.base import FLOAT, INT, Field, Objective, layer_matmul_params
from jaxlm.objectives.losses import chunked_prediction_stats, prediction_stats, prediction_summary


def token_stats(logits, batch) -> dict:
    """Summed loss, correct predictions and weight of every target token."""
    return prediction_stats("lm", logits, batch["targets"], batch["target_weights"])


def token_summary(stats: dict) -> dict:
    loss, accuracy = prediction_summary("lm", stats)
    return {"loss": loss, "lm_acc": accuracy}


@dataclasses.dataclass(frozen=True)
class CausalLmObjective(Objective):
    """`segment_ids` number the documents packed in a row (0 = padding): attention never crosses
    them and positions restart in each, unless model.cross_document_attention. `targets` are the next tokens,
    weighted by `target_weights` (the token after a document's end-of-text is not a target)."""

    def fields(self):
        seq = self.max_seq_length
        return {"input_ids": Field((seq,), INT, ("length",)), "segment_ids": Field((seq,), INT, ("length",)),
                "targets": Field((seq,), INT, ("length",)), "target_weights": Field((seq,), FLOAT, ("length",))}

    @staticmethod
    def model_inputs(batch):
        return batch["input_ids"], None, batch["segment_ids"], batch["segment_ids"] > 0

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        chunks = self.config.logits_chunks
        if not chunks:
            return token_stats(self.apply(params, batch, rng, deterministic), batch)
        hidden = self.apply(params, batch, rng, deterministic, method="hidden")
        head = functools.partial(self.model.apply, {"params": params}, method="head")
        return chunked_prediction_stats("lm", head, hidden, batch["targets"], batch["target_weights"], chunks)

    def summarize(self, stats: dict) -> dict:
        return token_summary(stats)

    def flops_per_token(self) -> float:
        """6·N + 6·L·d·T (causal), N = the layers' matmuls plus the LM head."""
        c = self.config
        matmul_params = c.num_layers * layer_matmul_params(c) + c.hidden_size * c.vocab_size
        return 6 * matmul_params + 6 * c.num_layers * c.hidden_size * self.max_seq_length
