"""The fine-tuning tasks: for each head, the roles its records fill, its labels, network and objective,
the rows it encodes records into, how its outputs become predictions, and its metric and baseline."""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax.numpy as jnp
import numpy as np

from jaxlm import families, generate
from jaxlm.config import ConfigError, FinetuneConfig
from jaxlm.data.tokenizers.roles import sentinel_ids, special_ids
from jaxlm.finetune import data as task_data
from jaxlm.finetune import metrics, qa, spans
from jaxlm.finetune.features import DecoderEncoder, PairEncoder, Rows, stack
from jaxlm.models.config import TransformerConfig
from jaxlm.models.task_heads import (CrfTagger, DecoderClassifier, MultipleChoice, QuestionAnswering,
                                    SequenceClassifier, SpanLabeller, TokenClassifier)
from jaxlm.models.sentence_bert import SentenceEncoder, SiameseClassifier
from jaxlm.objectives.base import Objective
from jaxlm.objectives.causal import CausalLmObjective
from jaxlm.objectives.denoise import Seq2SeqObjective
from jaxlm.objectives.sentence_pairs import CosineSimilarityObjective, RankingObjective, SoftmaxPairObjective
from jaxlm.objectives.finetune import (CrfTaggingObjective, MultipleChoiceObjective, QuestionAnsweringObjective,
                                       SequenceClassificationObjective, SpanLabellingObjective,
                                       TokenClassificationObjective)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a task's rows and network depend on beyond its records: the model, its family, the
    fine-tune settings, the label list and the tokenizer."""

    model: TransformerConfig
    settings: FinetuneConfig
    labels: tuple[str, ...]
    tokenizer: object

    @property
    def family(self) -> families.Family:
        return families.get(self.model.family)

    @property
    def decoder(self) -> bool:
        return self.family.generates == "causal"

    def pair_encoder(self) -> PairEncoder | DecoderEncoder:
        if self.decoder:
            return DecoderEncoder(self.tokenizer, self.settings.max_length)
        return PairEncoder(self.tokenizer, self.settings.max_length, self.model.type_vocab_size > 1,
                           self.family.pair_separators)


LOWER_IS_BETTER = ("mse",)  # the metrics whose best checkpoint is the lowest


class Task:
    """One head. `roles`: the fields every labelled record has; `input_roles`: those prediction needs;
    `optional_roles`: read when the data has them. finetune.metric, else the first of `metric_names`, picks the
    best checkpoint (higher is better, but for LOWER_IS_BETTER). `own_settings`: the finetune settings this head
    reads that not every head does."""

    name = ""
    own_settings: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    input_roles: tuple[str, ...] = ()
    optional_roles: tuple[str, ...] = ()

    def metric_names(self, settings: FinetuneConfig, records: list[dict]) -> tuple[str, ...]:
        """The metrics `score` reports for `records`, the default one first."""
        raise NotImplementedError

    def metric_for(self, settings: FinetuneConfig, records: list[dict]) -> str:
        """The metric that picks the best checkpoint: finetune.metric, checked against what `score` reports."""
        names = self.metric_names(settings, records)
        if settings.metric and settings.metric not in names:
            raise ConfigError(f"finetune.metric={settings.metric!r}: {self.name} reports {', '.join(names)}")
        return settings.metric or names[0]

    def field_names(self, settings: FinetuneConfig) -> dict[str, str]:
        """Role -> the data's field: finetune.fields renames, a role it does not name keeps its name."""
        roles = (*self.roles, *self.optional_roles)
        unknown = sorted(set(settings.fields) - set(roles))
        if unknown:
            raise ConfigError(f"finetune.fields names {', '.join(unknown)}, which {self.name} does not read; "
                              f"its roles: {', '.join(roles)}")
        return {role: settings.fields.get(role, role) for role in roles}

    def labels(self, settings: FinetuneConfig, train: list[dict]) -> tuple[str, ...]:
        return ()

    def check_settings(self, settings: FinetuneConfig) -> None:
        """Raise ConfigError for settings this task cannot run with."""

    def check_inputs(self, records: list[dict], labels: tuple[str, ...], where: str) -> None:
        """Raise ValueError naming the first record whose inputs the task cannot read (`predict`'s records too)."""

    def check(self, records: list[dict], labels: tuple[str, ...], where: str, settings: FinetuneConfig) -> None:
        """Raise ValueError naming the first labelled record that the task cannot use with `settings`."""
        self.check_inputs(records, labels, where)

    def objective(self, ctx: Context) -> Objective:
        raise NotImplementedError

    def rows(self, ctx: Context, records: list[dict], labelled: bool) -> Rows:
        raise NotImplementedError

    def outputs(self, objective: Objective) -> Callable:
        """(params, batch) -> the device outputs predictions are read from (deterministic)."""
        return lambda params, batch: objective.apply(params, batch, None, True)

    def predict(self, ctx: Context, outputs, rows: Rows, records: list[dict]) -> list[dict]:
        raise NotImplementedError

    def predictions(self, ctx: Context, runner, params, rows: Rows, records: list[dict]) -> list[dict]:
        """One prediction per record: `predict` over the runner's outputs (generation overrides it)."""
        return self.predict(ctx, runner.outputs(params, rows), rows, records)

    def score(self, ctx: Context, predictions: list[dict], records: list[dict]) -> dict:
        raise NotImplementedError

    def baseline(self, ctx: Context, train: list[dict], records: list[dict]) -> dict:
        """The trivial predictor's metrics (majority class, no entity, first token)."""
        raise NotImplementedError


def label_predictions(labels: tuple[str, ...], logits: np.ndarray) -> list[dict]:
    probabilities = metrics.softmax(logits)
    return [{"label": labels[int(p.argmax())], "probabilities": dict(zip(labels, np.round(p, 6).tolist()))}
            for p in probabilities]


# ---------------------------------------------------------------- sequence classification and regression

class SequenceClassification(Task):
    """One label (or, with finetune.regression, one score) per text or text pair."""

    name = "sequence_classification"
    own_settings = ("regression", "pooling")
    roles = ("text", "label")
    input_roles = ("text",)
    optional_roles = ("text_pair",)

    def metric_names(self, settings, records):
        return ("pearson", "spearman", "mse") if settings.regression else ("accuracy", "macro_f1")

    def labels(self, settings, train):
        return () if settings.regression else task_data.label_list(train, settings.labels)

    def check(self, records, labels, where, settings):
        if labels:
            task_data.check_labels(records, labels, where)
        else:
            task_data.check_scores(records, where)

    def objective(self, ctx):
        family, settings = ctx.family, ctx.settings
        if ctx.decoder:
            network = functools.partial(DecoderClassifier, num_labels=len(ctx.labels) or 1)
        else:
            network = functools.partial(SequenceClassifier, num_labels=len(ctx.labels) or 1,
                                        pooling=settings.pooling or family.pooling, backbone=family.backbone)
        return SequenceClassificationObjective(ctx.model, settings.max_length, network, regression=settings.regression)

    def rows(self, ctx, records, labelled):
        encoder, rows = ctx.pair_encoder(), []
        for record in records:
            pair = record.get("text_pair")
            row = encoder.encode(encoder.ids(record["text"]), None if pair is None else encoder.ids(pair))
            target = record["label"] if labelled else (0.0 if ctx.settings.regression else ctx.labels[0])
            row["label"] = (np.float32(target) if ctx.settings.regression else np.int32(ctx.labels.index(target)))
            row["example_weight"] = np.float32(1)
            rows.append(row)
        return stack(rows, list(range(len(records))), [None] * len(records))

    def predict(self, ctx, outputs, rows, records):
        if ctx.settings.regression:
            return [{"score": float(x)} for x in outputs[:, 0]]
        return label_predictions(ctx.labels, outputs)

    def score(self, ctx, predictions, records):
        if ctx.settings.regression:
            gold, predicted = [float(r["label"]) for r in records], [p["score"] for p in predictions]
            return {"pearson": metrics.pearson(gold, predicted), "spearman": metrics.spearman(gold, predicted),
                    "mse": float(np.mean((np.asarray(gold) - predicted) ** 2))}
        gold, predicted = [r["label"] for r in records], [p["label"] for p in predictions]
        return {"accuracy": metrics.accuracy(gold, predicted), "macro_f1": metrics.macro_f1(gold, predicted)}

    def baseline(self, ctx, train, records):
        if ctx.settings.regression:
            mean = np.mean([float(r["label"]) for r in train])
            return {"mse": float(np.mean([(float(r["label"]) - mean) ** 2 for r in records])), "pearson": 0.0}
        return {"accuracy": metrics.majority_baseline([r["label"] for r in train], [r["label"] for r in records])}


# ---------------------------------------------------------------- token classification (optionally with a CRF)

def tag_rows(ctx: Context, records: list[dict], labelled: bool) -> Rows:
    """Per record: ids (truncated to max_length, the closing special token kept) and each token's word;
    labels on the first subword of each word."""
    length, rows, meta = ctx.settings.max_length, [], []
    encoder = ctx.pair_encoder()
    for record in records:
        ids, words = metrics.word_ids(ctx.tokenizer, record["words"])
        if len(ids) > length:
            ids, words = ids[:length - 1] + ids[-1:], words[:length - 1] + words[-1:]
        row = encoder.pad_row(ids, [0] * len(ids))
        tags = [ctx.labels.index(t) for t in record["tags"]] if labelled else [0] * len(record["words"])
        token_labels = metrics.word_labels_to_subwords(words, tags)
        first = np.asarray([label != -100 for label in token_labels], bool)
        row["labels"] = np.zeros(length, np.int32)
        row["labels"][:len(ids)] = np.maximum(token_labels, 0)
        row["label_weights"] = np.zeros(length, np.float32)
        row["label_weights"][:len(ids)] = first
        if ctx.settings.crf:  # the CRF runs over the words that kept a first subword
            positions = np.flatnonzero(first)
            row["word_positions"] = np.zeros(length, np.int32)
            row["word_positions"][:len(positions)] = positions
            row["word_tags"] = np.zeros(length, np.int32)
            row["word_tags"][:len(positions)] = row["labels"][positions]
            row["word_mask"] = np.zeros(length, np.int32)
            row["word_mask"][:max(len(positions), 1)] = 1
            row["example_weight"] = np.float32(1)
            del row["labels"], row["label_weights"]
        rows.append(row)
        meta.append(words)
    return stack(rows, list(range(len(records))), meta)


class TokenClassification(Task):
    """A tag per word, predicted at its first subword: entity tags (BIO/IOB2) scored by seqeval's entity F1 and
    tag accuracy, other tags (parts of speech) by tag accuracy alone."""

    name = "token_classification"
    own_settings = ("crf",)
    roles = ("words", "tags")
    input_roles = ("words",)

    def metric_names(self, settings, records):
        if metrics.names_entities(settings.labels):
            return ("f1", "precision", "recall", "tag_accuracy")
        return ("tag_accuracy",)

    def labels(self, settings, train):
        return task_data.label_list(train, settings.labels, field="tags")

    def check(self, records, labels, where, settings):
        task_data.check_tag_lengths(records, where)
        task_data.check_labels(records, labels, where, field="tags")
        try:
            metrics.names_entities(labels)
        except ValueError as err:
            raise ValueError(f"{where} (or finetune.labels): {err}") from None

    def objective(self, ctx):
        family, settings = ctx.family, ctx.settings
        if settings.crf:
            network = functools.partial(CrfTagger, num_labels=len(ctx.labels), labels=ctx.labels,
                                        backbone=family.backbone)
            return CrfTaggingObjective(ctx.model, settings.max_length, network)
        network = functools.partial(TokenClassifier, num_labels=len(ctx.labels), backbone=family.backbone)
        return TokenClassificationObjective(ctx.model, settings.max_length, network)

    def rows(self, ctx, records, labelled):
        return tag_rows(ctx, records, labelled)

    def outputs(self, objective):
        if isinstance(objective, CrfTaggingObjective):
            return objective.decode
        return lambda params, batch: jnp.argmax(objective.apply(params, batch, None, True), -1)

    def predict(self, ctx, outputs, rows, records):
        predictions = []
        for index, record in enumerate(records):
            words, tags = rows.meta[index], outputs[index]
            if ctx.settings.crf:  # tags of the words that kept a first subword, in order
                kept = sorted({w for w in words if w is not None})
                per_word = dict(zip(kept, tags))
            else:
                per_word = dict(enumerate(metrics.subword_predictions_to_words(words, tags)))
            outside = "O" if "O" in ctx.labels else ctx.labels[0]  # for words truncation cut off
            named = {word: ctx.labels[int(tag)] for word, tag in per_word.items() if tag is not None}
            predictions.append({"tags": [named.get(i, outside) for i in range(len(record["words"]))]})
        return predictions

    def score(self, ctx, predictions, records):
        gold = [t for r in records for t in r["tags"]]
        accuracy = {"tag_accuracy": metrics.accuracy(gold, [t for p in predictions for t in p["tags"]])}
        if not metrics.names_entities(ctx.labels):
            return accuracy
        scores = metrics.entity_scores([r["tags"] for r in records], [p["tags"] for p in predictions])
        return {"f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"]} | accuracy

    def baseline(self, ctx, train, records):
        accuracy = {"tag_accuracy": metrics.majority_baseline([t for r in train for t in r["tags"]],
                                                              [t for r in records for t in r["tags"]])}
        return ({"f1": 0.0} if metrics.names_entities(ctx.labels) else {}) | accuracy


class SpanLabelling(TokenClassification):
    """Entities as spans of up to finetune.max_span_length words, each classified (or "no entity") from
    its boundary states and an attention-pooled summary; non-overlapping spans taken greedily by
    probability, read back as BIO tags and scored by seqeval."""

    name = "span_labelling"
    own_settings = ("max_span_length",)

    def check(self, records, labels, where, settings):
        super().check(records, labels, where, settings)
        if not metrics.names_entities(labels):
            raise ValueError(f"{where}: span_labelling finds entities, and tags {', '.join(labels[:3])} name none "
                             "(give O, B-TYPE and I-TYPE tags); finetune.task=token_classification tags words with "
                             "tags of their own")

    def objective(self, ctx):
        types = spans.entity_types(ctx.labels)
        network = functools.partial(SpanLabeller, num_labels=len(types), backbone=ctx.family.backbone)
        return SpanLabellingObjective(ctx.model, ctx.settings.max_length, network,
                                      max_spans=max_spans(ctx.settings))

    def rows(self, ctx, records, labelled):
        settings, types = ctx.settings, spans.entity_types(ctx.labels)
        encoder, rows, meta = ctx.pair_encoder(), [], []
        for record in records:
            ids, words = metrics.word_ids(ctx.tokenizer, record["words"])
            if len(ids) > settings.max_length:
                ids, words = ids[:settings.max_length - 1] + ids[-1:], words[:settings.max_length - 1] + words[-1:]
            bounds = spans.word_bounds(words)
            candidates = spans.candidates(bounds, settings.max_span_length)
            gold = spans.gold_spans(record["tags"], types) if labelled else {}
            rows.append(encoder.pad_row(ids, [0] * len(ids)) | spans.span_arrays(bounds, candidates, gold,
                                                                                   max_spans(settings)))
            meta.append(candidates)
        return stack(rows, list(range(len(records))), meta)

    def outputs(self, objective):
        return lambda params, batch: objective.apply(params, batch, None, True)

    def predict(self, ctx, outputs, rows, records):
        types = spans.entity_types(ctx.labels)
        return [{"tags": spans.decode(logits, candidates, types, len(record["words"]))}
                for logits, candidates, record in zip(outputs, rows.meta, records)]


def max_spans(settings: FinetuneConfig) -> int:
    """The candidate spans a row can hold: every start word (at most max_length - 2) times every length."""
    return (settings.max_length - 2) * settings.max_span_length


# ---------------------------------------------------------------- multiple choice

class MultipleChoiceTask(Task):
    """(context, choice) pairs scored against each other; `label` is the right choice's index."""

    name = "multiple_choice"
    own_settings = ("pooling",)
    roles = ("context", "choices", "label")
    input_roles = ("context", "choices")

    def metric_names(self, settings, records):
        return ("accuracy",)

    def labels(self, settings, train):
        """The choice indices, "0" to "C-1": every record has the same number C of choices."""
        return tuple(str(i) for i in range(len(train[0]["choices"])))

    def check_inputs(self, records, labels, where):
        task_data.check_choices(records, len(labels), where)

    def objective(self, ctx):
        family = ctx.family
        network = functools.partial(MultipleChoice, pooling=ctx.settings.pooling or family.choice_pooling,
                                    backbone=family.backbone)
        return MultipleChoiceObjective(ctx.model, ctx.settings.max_length, network, choices=len(ctx.labels))

    def rows(self, ctx, records, labelled):
        encoder, rows = ctx.pair_encoder(), []
        for record in records:
            context = encoder.ids(record["context"])
            pairs = [encoder.encode(context, encoder.ids(choice)) for choice in record["choices"]]
            row = {name: np.stack([pair[name] for pair in pairs]) for name in pairs[0]}
            row["label"] = np.int32(record["label"] if labelled else 0)
            row["example_weight"] = np.float32(1)
            rows.append(row)
        return stack(rows, list(range(len(records))), [None] * len(records))

    def predict(self, ctx, outputs, rows, records):
        return [{"choice": int(p.argmax()), "probabilities": np.round(metrics.softmax(p), 6).tolist()}
                for p in outputs]

    def score(self, ctx, predictions, records):
        return {"accuracy": metrics.accuracy([int(r["label"]) for r in records], [p["choice"] for p in predictions])}

    def baseline(self, ctx, train, records):
        return {"accuracy": metrics.majority_baseline([int(r["label"]) for r in train],
                                                      [int(r["label"]) for r in records])}


# ---------------------------------------------------------------- extractive question answering

class QuestionAnsweringTask(Task):
    """An answer span in the context: long contexts in overlapping windows, the best span over a
    question's windows mapped back to the context's characters; SQuAD v1.1 exact match and F1."""

    name = "question_answering"
    own_settings = ("doc_stride", "max_query_length", "max_answer_length", "n_best")
    roles = ("id", "question", "context", "answers")
    input_roles = ("id", "question", "context")

    def metric_names(self, settings, records):
        return SQUAD_METRICS

    def check_settings(self, settings):
        budget = settings.max_length - settings.max_query_length - 3
        if budget <= settings.doc_stride:
            raise ConfigError(f"finetune.doc_stride={settings.doc_stride} must be smaller than the context tokens a "
                              f"window holds after the longest question ({budget} = max_length {settings.max_length} "
                              f"- max_query_length {settings.max_query_length} - 3 special tokens); lower doc_stride "
                              "or max_query_length, or raise max_length")

    def check(self, records, labels, where, settings):
        task_data.check_answers(records, where)

    def objective(self, ctx):
        network = functools.partial(QuestionAnswering, backbone=ctx.family.backbone)
        return QuestionAnsweringObjective(ctx.model, ctx.settings.max_length, network)

    def rows(self, ctx, records, labelled):
        settings, rows, owner, meta = ctx.settings, [], [], []
        for index, record in enumerate(records):
            for window in qa.qa_windows(ctx.tokenizer, record["question"], record["context"], settings.max_length,
                                        settings.doc_stride, settings.max_query_length,
                                        record["answers"] if labelled else None):
                rows.append(window.row())
                owner.append(index)
                meta.append(window)
        return stack(rows, owner, meta)

    def predict(self, ctx, outputs, rows, records):
        start, end = outputs
        predictions = []
        for index, record in enumerate(records):
            mine = np.flatnonzero(rows.owner == index)
            answers = qa.decode_answers(start[mine], end[mine], [rows.meta[i] for i in mine], record["context"],
                                        ctx.settings.n_best, ctx.settings.max_answer_length)
            predictions.append(qa.prediction_record(answers))
        return predictions

    def score(self, ctx, predictions, records):
        return squad_metrics(records, [p["answer"] for p in predictions])

    def baseline(self, ctx, train, records):
        return squad_metrics(records, [qa.first_token_answer(r["context"]) for r in records])


# ---------------------------------------------------------------- Sentence-BERT

SENTENCE_LOSSES = ("softmax", "cosine", "ranking")


class SentenceEmbedding(Task):
    """A siamese encoder with mean pooling trained on pairs (text, text_pair) by finetune.loss: softmax
    (a class per pair, NLI style), cosine (a similarity score per pair) or ranking (positive pairs, the
    batch's other pairs as negatives). `jaxlm embed` reads the result."""

    name = "sentence_embedding"
    own_settings = ("loss",)
    roles = ("text", "text_pair")
    input_roles = ("text", "text_pair")
    optional_roles = ("label",)

    def metric_names(self, settings, records):
        return {"softmax": ("accuracy", "macro_f1"), "cosine": ("spearman", "pearson")}.get(
            settings.loss, ("recall_at_1", "positive_cosine"))

    def labels(self, settings, train):
        if settings.loss not in SENTENCE_LOSSES:
            raise ConfigError(f"finetune.loss={settings.loss!r}; sentence_embedding trains with one of "
                              f"{', '.join(SENTENCE_LOSSES)}")
        return task_data.label_list(train, settings.labels) if settings.loss == "softmax" else ()

    def check(self, records, labels, where, settings):
        if labels:
            task_data.check_labels(records, labels, where)
        elif settings.loss == "cosine":  # ranking reads no label: a pair is a positive, whatever it says
            task_data.check_scores(records, where)

    def objective(self, ctx):
        settings, backbone = ctx.settings, ctx.family.backbone
        if settings.loss == "softmax":
            network = functools.partial(SiameseClassifier, num_labels=len(ctx.labels), backbone=backbone)
            return SoftmaxPairObjective(ctx.model, settings.max_length, network)
        network = functools.partial(SentenceEncoder, backbone=backbone)
        kind = CosineSimilarityObjective if settings.loss == "cosine" else RankingObjective
        return kind(ctx.model, settings.max_length, network)

    def rows(self, ctx, records, labelled):
        encoder, rows, loss = ctx.pair_encoder(), [], ctx.settings.loss
        for record in records:
            a, b = (encoder.encode(encoder.ids(record[role])) for role in ("text", "text_pair"))
            row = {"input_ids_a": a["input_ids"], "input_mask_a": a["input_mask"], "input_ids_b": b["input_ids"],
                   "input_mask_b": b["input_mask"], "pair_weight": np.float32(1)}
            if loss == "softmax":
                row["label"] = np.int32(ctx.labels.index(record["label"]) if labelled else 0)
            elif loss == "cosine":
                row["score"] = np.float32(record["label"] if labelled else 0.0)
            rows.append(row)
        return stack(rows, list(range(len(records))), [None] * len(records))

    def outputs(self, objective):
        if isinstance(objective, SoftmaxPairObjective):
            return lambda params, batch: objective.apply(params, batch, None, True)
        return lambda params, batch: objective.embeddings(params, batch, None, True)

    def predict(self, ctx, outputs, rows, records):
        if ctx.settings.loss == "softmax":
            return label_predictions(ctx.labels, outputs)
        u, v = (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12) for x in outputs)
        similarity = u @ v.T  # rank: where its own text_pair stands among all the input's, for its text
        ranks = 1 + (similarity > np.diag(similarity)[:, None]).sum(1)
        return [{"cosine": float(c), "rank": int(r)} for c, r in zip(np.diag(similarity), ranks)]

    def score(self, ctx, predictions, records):
        if ctx.settings.loss == "softmax":
            gold, predicted = [r["label"] for r in records], [p["label"] for p in predictions]
            return {"accuracy": metrics.accuracy(gold, predicted), "macro_f1": metrics.macro_f1(gold, predicted)}
        similarity = [p["cosine"] for p in predictions]
        if ctx.settings.loss == "cosine":
            gold = [float(r["label"]) for r in records]
            return {"spearman": metrics.spearman(gold, similarity), "pearson": metrics.pearson(gold, similarity)}
        return {"recall_at_1": float(np.mean([p["rank"] == 1 for p in predictions])),
                "positive_cosine": float(np.mean(similarity))}

    def baseline(self, ctx, train, records):
        if ctx.settings.loss == "softmax":
            return {"accuracy": metrics.majority_baseline([r["label"] for r in train], [r["label"] for r in records])}
        if ctx.settings.loss == "cosine":
            return {"spearman": 0.0}
        return {"recall_at_1": 1 / len(records)}


# ---------------------------------------------------------------- text to text (T5, BART) and prompt/response (decoders)

def squad_cast(record: dict) -> dict:
    """A question as T5 casts SQuAD: "question: Q context: C" -> the first answer."""
    cast = {"source": f"question: {record['question']} context: {record['context']}"}
    if record.get("answers"):
        cast["target"] = record["answers"][0]["text"]
    return cast


def generated_texts(ctx: Context, runner, params, ids: np.ndarray, mask: np.ndarray, max_new_tokens: int) -> list[str]:
    """What the model generates after each row of `ids` (greedy, or finetune.num_beams beam search), by
    jaxlm.generate on the run's mesh, in batches of the run's size; end-of-text, padding and T5's sentinels dropped
    (as transformers' `skip_special_tokens` drops them)."""
    model = ctx.family.network(ctx.model)
    special = special_ids(ctx.tokenizer)
    dropped = {special["eos"], special["pad"], *sentinel_ids(ctx.tokenizer)}
    texts, size = [], runner.size
    for start in range(0, len(ids), size):
        result = generate.generate(model, params, ids[start:start + size], mask[start:start + size],
                                   max_new_tokens=max_new_tokens, eos_id=special["eos"],
                                   num_beams=ctx.settings.num_beams, mesh=runner.setup.mesh, rules=runner.setup.rules)
        for tokens, length in zip(result.tokens, result.lengths):
            texts.append(ctx.tokenizer.decode([int(t) for t in tokens[:length] if int(t) not in dropped]).strip())
    return texts


def text_metric_names(records: list[dict]) -> tuple[str, ...]:
    """SQuAD's metrics when the records are SQuAD questions, else ROUGE's, ROUGE-L first."""
    return SQUAD_METRICS if records and "question" in records[0] else ("rougeL", "rouge1", "rouge2")


def text_scores(records: list[dict], texts: list[str], target: str) -> dict:
    """`text_metric_names` of the texts against each record's `target` text."""
    if text_metric_names(records) == SQUAD_METRICS:
        return squad_metrics(records, texts)
    scores = metrics.rouge(texts, [r[target] for r in records])
    return {name: scores[name] for name in text_metric_names(records)}


class TextToText(Task):
    """Text in, text out (T5, BART): teacher-forced loss on the target; predictions generated and
    scored by SQuAD's exact match and F1 when the records are SQuAD questions (cast as T5 casts them),
    else by ROUGE."""

    name = "text_to_text"
    own_settings = ("prefix", "num_beams", "max_target_length")
    roles = ()
    optional_roles = ("source", "target", "id", "question", "context", "answers")

    def metric_names(self, settings, records):
        return text_metric_names(records)

    def cast(self, records: list[dict]) -> list[dict]:
        return [squad_cast(r) if "question" in r else r for r in records]

    def check_inputs(self, records, labels, where):
        for index, record in enumerate(records):
            if "question" in record:
                if "context" not in record:
                    raise ValueError(f"{where}: record {index + 1} has a question but no context")
            elif "source" not in record:
                raise ValueError(f"{where}: record {index + 1} has neither a source text nor a question; name the "
                                 "input with finetune.fields.source")

    def check(self, records, labels, where, settings):
        self.check_inputs(records, labels, where)
        for index, record in enumerate(records):
            if "target" not in record and "answers" not in record:
                raise ValueError(f"{where}: record {index + 1} has no target text (fields: {', '.join(record)}); "
                                 "name it with finetune.fields.target")

    def objective(self, ctx):
        return Seq2SeqObjective(ctx.model, ctx.settings.max_length, ctx.family.network,
                                ctx.settings.max_target_length)

    def rows(self, ctx, records, labelled):
        settings, special = ctx.settings, special_ids(ctx.tokenizer)
        pad = special["pad"] if special["pad"] is not None else 0
        rows = []
        for record in self.cast(records):
            source = ctx.tokenizer.encode(settings.prefix + record["source"], add_special_tokens=True)
            target = ctx.tokenizer.encode(record.get("target", "") if labelled else "", add_special_tokens=True)
            source = source[:settings.max_length - 1] + source[-1:] if len(source) > settings.max_length else source
            target = (target[:settings.max_target_length - 1] + target[-1:]
                      if len(target) > settings.max_target_length else target)
            decoder = [ctx.model.decoder_start_token_id, *target[:-1]]
            row = {"input_ids": np.full(settings.max_length, pad, np.int32),
                   "input_mask": np.zeros(settings.max_length, np.int32),
                   "decoder_input_ids": np.full(settings.max_target_length, pad, np.int32),
                   "targets": np.full(settings.max_target_length, pad, np.int32),
                   "target_weights": np.zeros(settings.max_target_length, np.float32)}
            row["input_ids"][:len(source)], row["input_mask"][:len(source)] = source, 1
            row["decoder_input_ids"][:len(decoder)], row["targets"][:len(target)] = decoder, target
            row["target_weights"][:len(target)] = 1
            rows.append(row)
        return stack(rows, list(range(len(records))), [None] * len(records))

    def predictions(self, ctx, runner, params, rows, records):
        texts = generated_texts(ctx, runner, params, rows.arrays["input_ids"], rows.arrays["input_mask"] > 0,
                                ctx.settings.max_target_length)
        return [{"text": text} for text in texts]

    def score(self, ctx, predictions, records):
        return text_scores(records, [p["text"] for p in predictions], "target")

    def baseline(self, ctx, train, records):
        return text_scores(records, [""] * len(records), "target")


class CausalLanguageModelling(Task):
    """A decoder fine-tuned on prompt/response pairs, the loss on the response (and its end-of-text
    token) only; predictions generated after the prompt, scored by ROUGE against the response."""

    name = "causal_lm"
    own_settings = ("num_beams", "max_target_length")
    roles = ("prompt", "response")
    input_roles = ("prompt",)

    def metric_names(self, settings, records):
        return text_metric_names(records)

    def check_settings(self, settings):
        if settings.max_target_length >= settings.max_length:
            raise ConfigError(f"finetune.max_target_length={settings.max_target_length} leaves no room for the prompt "
                              f"in finetune.max_length={settings.max_length}; lower the one or raise the other")

    def check_inputs(self, records, labels, where):
        for index, record in enumerate(records):
            if not record["prompt"].strip():
                raise ValueError(f"{where}: record {index + 1} has an empty prompt; generation starts from one")

    def objective(self, ctx):
        return CausalLmObjective(ctx.model, ctx.settings.max_length, ctx.family.network)

    def rows(self, ctx, records, labelled):
        """A prompt longer than its room loses its first tokens, so the response keeps
        max_target_length of its own (its end included)."""
        settings, special = ctx.settings, special_ids(ctx.tokenizer)
        length, eos = settings.max_length, special["eos"]
        pad = special["pad"] if special["pad"] is not None else eos
        rows, meta = [], []
        for record in records:
            prompt = ctx.tokenizer.encode(record["prompt"])
            response = (ctx.tokenizer.encode(record["response"]) if labelled else [])[:settings.max_target_length - 1]
            response = [*response, eos]
            prompt = prompt[max(0, len(prompt) + len(response) - length - 1):]
            ids = [*prompt, *response]
            row = {"input_ids": np.full(length, pad, np.int32), "segment_ids": np.zeros(length, np.int32),
                   "targets": np.zeros(length, np.int32), "target_weights": np.zeros(length, np.float32)}
            inputs, targets = ids[:-1], ids[1:]
            row["input_ids"][:len(inputs)], row["segment_ids"][:len(inputs)] = inputs, 1
            row["targets"][:len(targets)] = targets
            row["target_weights"][len(prompt) - 1:len(targets)] = 1  # targets that are response tokens
            rows.append(row)
            meta.append(prompt[max(0, len(prompt) + settings.max_target_length - length):])  # generation's room
        return stack(rows, list(range(len(records))), meta)

    def predictions(self, ctx, runner, params, rows, records):
        width = max(len(prompt) for prompt in rows.meta)
        ids = np.zeros((len(rows), width), np.int32)
        mask = np.zeros((len(rows), width), bool)
        for index, prompt in enumerate(rows.meta):
            ids[index, :len(prompt)], mask[index, :len(prompt)] = prompt, True
        texts = generated_texts(ctx, runner, params, ids, mask, ctx.settings.max_target_length)
        return [{"response": text} for text in texts]

    def score(self, ctx, predictions, records):
        return text_scores(records, [p["response"] for p in predictions], "response")

    def baseline(self, ctx, train, records):
        return text_scores(records, [""] * len(records), "response")


SQUAD_METRICS = ("f1", "exact_match")


def squad_metrics(records: list[dict], answers: list[str]) -> dict:
    """{f1, exact_match} of answers to SQuAD questions (every gold answer counts), each record against its own
    answer: records are matched by their place, not their ids, which may repeat."""
    dataset = [{"id": str(i), "answers": [a["text"] for a in r["answers"]]} for i, r in enumerate(records)]
    scores = metrics.squad_scores({str(i): answer for i, answer in enumerate(answers)}, dataset)
    return {name: scores[name] for name in SQUAD_METRICS}


TASKS: dict[str, Task] = {task.name: task for task in (SequenceClassification(), TokenClassification(), SpanLabelling(),
                                                      MultipleChoiceTask(), QuestionAnsweringTask(),
                                                      SentenceEmbedding(), TextToText(), CausalLanguageModelling())}
