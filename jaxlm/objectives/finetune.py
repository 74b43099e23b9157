"""Fine-tuning tasks as objectives (batch format, loss, metrics) for the heads of jaxlm.models.task_heads:
sequence classification or regression, token classification, extractive QA and multiple choice. Losses
are the ones Hugging Face's heads compute: means over the weighted examples, tokens or positions. A row
of weight 0 (the padding that fills an epoch's last batch) counts for nothing."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxlm.objectives.base import FLOAT, INT, Field, Objective, layer_matmul_params
from jaxlm.objectives.losses import prediction_stats, prediction_summary, ratio


def encoder_fields(seq: int, choices: int = 0) -> dict[str, Field]:
    shape, axes = ((choices, seq), (None, "length")) if choices else ((seq,), ("length",))
    return {name: Field(shape, INT, axes) for name in ("input_ids", "segment_ids", "input_mask")}


def encoder_inputs(batch: dict):
    return batch["input_ids"], batch["segment_ids"], batch["input_mask"]


def encoder_flops_per_token(config, seq: int, head_params: int = 0) -> float:
    """6·N + 12·L·d·T with the head's parameters spread over the sequence's tokens."""
    matmul_params = config.num_layers * layer_matmul_params(config) + head_params / seq
    return 6 * matmul_params + 12 * config.num_layers * config.hidden_size * seq


def accuracy_summary(stats: dict, name: str = "label") -> dict:
    loss, accuracy = prediction_summary(name, stats)
    return {"loss": loss, "accuracy": accuracy}


@dataclasses.dataclass(frozen=True)
class SequenceClassificationObjective(Objective):
    """`label` per sequence: a class (cross-entropy) or, with `regression`, a float (mean squared error),
    counted with `example_weight`."""

    regression: bool = False

    def fields(self):
        return encoder_fields(self.max_seq_length) | {"label": Field((), FLOAT if self.regression else INT, ()),
                                                      "example_weight": Field((), FLOAT, ())}

    model_inputs = staticmethod(encoder_inputs)

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        logits = self.apply(params, batch, rng, deterministic)
        weights = batch["example_weight"]
        if not self.regression:
            return prediction_stats("label", logits, batch["label"], weights)
        error = (logits[:, 0] - batch["label"]) ** 2
        return {"label_squared_error": jnp.sum(error * weights), "label_count": jnp.sum(weights)}

    def summarize(self, stats: dict) -> dict:
        if not self.regression:
            return accuracy_summary(stats)
        mse = ratio(stats["label_squared_error"], stats["label_count"])
        return {"loss": mse, "mse": mse}

    def flops_per_token(self) -> float:
        return encoder_flops_per_token(self.config, self.max_seq_length, self.config.hidden_size ** 2)


@dataclasses.dataclass(frozen=True)
class TokenClassificationObjective(Objective):
    """`labels` per token, counted where `label_weights` is 1 (a word's first subword)."""

    def fields(self):
        seq = self.max_seq_length
        return encoder_fields(seq) | {"labels": Field((seq,), INT, ("length",)),
                                      "label_weights": Field((seq,), FLOAT, ("length",))}

    model_inputs = staticmethod(encoder_inputs)

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        logits = self.apply(params, batch, rng, deterministic)
        return prediction_stats("label", logits, batch["labels"], batch["label_weights"])

    def summarize(self, stats: dict) -> dict:
        return accuracy_summary(stats)

    def flops_per_token(self) -> float:
        return encoder_flops_per_token(self.config, self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class CrfTaggingObjective(Objective):
    """`word_tags` of the words whose first subwords `word_positions` point at (`word_mask`, its first
    step on even in a padding row); loss = the CRF's negative log-likelihood, mean over the sequences
    weighted by `example_weight`."""

    def fields(self):
        seq = self.max_seq_length
        words = {name: Field((seq,), INT, ("length",)) for name in ("word_positions", "word_tags", "word_mask")}
        return encoder_fields(seq) | words | {"example_weight": Field((), FLOAT, ())}

    @staticmethod
    def model_inputs(batch):
        return (*encoder_inputs(batch), batch["word_positions"])

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        emissions = self.apply(params, batch, rng, deterministic)
        likelihood = self.model.apply({"params": params}, emissions, batch["word_tags"], batch["word_mask"],
                                      method="log_likelihood")
        weights = batch["example_weight"]
        return {"crf_nll_sum": -jnp.sum(likelihood * weights), "crf_count": jnp.sum(weights)}

    def summarize(self, stats: dict) -> dict:
        return {"loss": ratio(stats["crf_nll_sum"], stats["crf_count"])}

    def decode(self, params, batch):
        """The Viterbi tags [B, W] of the words (deterministic)."""
        emissions = self.apply(params, batch, None, True)
        return self.model.apply({"params": params}, emissions, batch["word_mask"], method="decode")

    def flops_per_token(self) -> float:
        return encoder_flops_per_token(self.config, self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class SpanLabellingObjective(Objective):
    """`span_labels` (0: no entity) of up to `max_spans` candidate spans per row, from `span_starts` to
    `span_ends`, counted where `span_weights` is 1; loss = the mean cross-entropy over those spans."""

    max_spans: int = 256

    def fields(self):
        spans = {name: Field((self.max_spans,), INT, (None,)) for name in ("span_starts", "span_ends", "span_labels")}
        return (encoder_fields(self.max_seq_length) | spans
                | {"span_weights": Field((self.max_spans,), FLOAT, (None,))})

    @staticmethod
    def model_inputs(batch):
        return (*encoder_inputs(batch), batch["span_starts"], batch["span_ends"])

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        logits = self.apply(params, batch, rng, deterministic)
        return prediction_stats("span", logits, batch["span_labels"], batch["span_weights"])

    def summarize(self, stats: dict) -> dict:
        loss, accuracy = prediction_summary("span", stats)
        return {"loss": loss, "span_acc": accuracy}

    def flops_per_token(self) -> float:
        return encoder_flops_per_token(self.config, self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class QuestionAnsweringObjective(Objective):
    """`start_position` and `end_position` of the answer's tokens; loss = (start CE + end CE) / 2 over
    the windows whose `answer_weight` is 1 (a window without the answer points at [CLS], position 0)."""

    def fields(self):
        return encoder_fields(self.max_seq_length) | {"start_position": Field((), INT, ()),
                                                      "end_position": Field((), INT, ()),
                                                      "answer_weight": Field((), FLOAT, ())}

    model_inputs = staticmethod(encoder_inputs)

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        start, end = self.apply(params, batch, rng, deterministic)
        weights = batch["answer_weight"]
        return (prediction_stats("start", start, batch["start_position"], weights)
                | prediction_stats("end", end, batch["end_position"], weights))

    def summarize(self, stats: dict) -> dict:
        start_loss, start_acc = prediction_summary("start", stats)
        end_loss, end_acc = prediction_summary("end", stats)
        return {"loss": (start_loss + end_loss) / 2, "start_acc": start_acc, "end_acc": end_acc}

    def flops_per_token(self) -> float:
        return encoder_flops_per_token(self.config, self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class MultipleChoiceObjective(Objective):
    """`choices` (context, choice) sequences per example and the index of the right one, `label`, counted
    with `example_weight`."""

    choices: int = 4

    def fields(self):
        return encoder_fields(self.max_seq_length, self.choices) | {"label": Field((), INT, ()),
                                                                    "example_weight": Field((), FLOAT, ())}

    model_inputs = staticmethod(encoder_inputs)

    def stats(self, params, batch, rng, deterministic: bool = False) -> dict:
        logits = self.apply(params, batch, rng, deterministic)
        return prediction_stats("label", logits, batch["label"], batch["example_weight"])

    def summarize(self, stats: dict) -> dict:
        return accuracy_summary(stats)

    def flops_per_token(self) -> float:
        return encoder_flops_per_token(self.config, self.max_seq_length, self.config.hidden_size ** 2)
