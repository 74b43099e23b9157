"""Fine-tuning's task metrics and the first-subword alignment of word labels that NER is scored through."""
from __future__ import annotations

import re
import string
import warnings
from collections import Counter

import numpy as np
import seqeval.scheme
from seqeval.metrics import classification_report

from jaxlm.data.tokenizers.roles import special_ids

# --- token classification ---------------------------------------------------------------------

ENTITY_PREFIXES = ("B", "I", "E", "S")  # the boundaries seqeval's default mode reads (IOB1, IOB2, IOBES)


def names_entities(tags) -> bool:
    """Whether a tag set names entities (each tag O or PREFIX-TYPE: B-PER, I-PER), scored by entity F1, rather
    than being tags of their own (parts of speech), scored by accuracy alone. A set that mixes the two is a
    ValueError naming a tag that is neither."""
    def entity(tag):
        prefix, _, kind = tag.partition("-")
        return tag == "O" or (prefix in ENTITY_PREFIXES and bool(kind))

    odd = sorted(tag for tag in tags if not entity(tag))
    if not odd:
        return True
    named = sorted(tag for tag in tags if tag != "O" and entity(tag))
    if not named:
        return False
    raise ValueError(f"tag {odd[0]!r} is neither O nor an entity tag (B-, I-, E- or S-TYPE), as others are "
                     f"({', '.join(named[:3])}); fix the tag, or tag every word with tags of its own (NN, VB) for "
                     "tagging scored by accuracy")


def entity_scores(gold: list[list[str]], predicted: list[list[str]], scheme: str = "IOB2",
                  strict: bool = False) -> dict:
    """{precision, recall, f1, support, per_type: {type: {precision, recall, f1, support}}}: entity-level
    scores, micro-averaged over all sentences and per entity type (support: gold entities), by seqeval.

    By default seqeval's default mode, the conlleval.pl rules that published CoNLL and WNUT scores
    use: an I- tag that does not continue an entity of its type (after O, or after another type)
    starts one. `strict=True` is seqeval's strict mode: only entities well formed under `scheme`
    (a seqeval.scheme name: IOB2, IOE2, IOBES, BILOU) count, an orphan I- is none."""
    options = dict(mode="strict", scheme=getattr(seqeval.scheme, scheme)) if strict else {}
    with warnings.catch_warnings():  # seqeval's macro average (unused) of no entity types warns
        warnings.simplefilter("ignore", RuntimeWarning)
        # zero_division=0: seqeval's default value for 0/0, without its warning
        report = classification_report(gold, predicted, output_dict=True, zero_division=0, **options)
    rows = {name: {"precision": float(row["precision"]), "recall": float(row["recall"]),
                   "f1": float(row["f1-score"]), "support": int(row["support"])} for name, row in report.items()}
    scores = rows.pop("micro avg")
    del rows["macro avg"], rows["weighted avg"]
    return scores | {"per_type": rows}


def word_ids(tokenizer, words: list[str], add_special_tokens: bool = True) -> tuple[list[int], list[int | None]]:
    """(ids, word index of each id or None) of pre-split `words` (as NER data comes): the words
    joined with spaces and each token given the word its first character lies in (a separating
    space belongs to the word after it); a word the tokenizer drops (a zero-width space) has no id.
    For BERT's WordPiece these are transformers' ids and `word_ids()` with is_split_into_words=True
    (for byte-level BPE, unlike transformers', the first word has no leading space). With
    `add_special_tokens`, the tokenizer's CLS and SEP roles (BERT's [CLS] ... [SEP], RoBERTa's
    <s> ... </s>; those it has) wrap the ids."""
    ids, offsets = tokenizer.encode_with_offsets(" ".join(words))
    owner = [i for i, word in enumerate(words) for _ in range(len(word) + (i > 0))]
    words_of_ids: list[int | None] = [owner[start] for start, _ in offsets]
    if add_special_tokens:
        special = special_ids(tokenizer)
        if special["cls"] is not None:
            ids, words_of_ids = [special["cls"], *ids], [None, *words_of_ids]
        if special["sep"] is not None:
            ids, words_of_ids = [*ids, special["sep"]], [*words_of_ids, None]
    return ids, words_of_ids


def word_labels_to_subwords(word_ids_per_token, word_labels, ignore=-100) -> list:
    """Per token: its word's label on the first subword of each word, `ignore` on the word's other
    subwords and on special tokens (word id None)."""
    labels, previous = [], None
    for word in word_ids_per_token:
        labels.append(ignore if word is None or word == previous else word_labels[word])
        previous = word
    return labels


def subword_predictions_to_words(word_ids_per_token, token_predictions, num_words: int | None = None,
                                 missing=None) -> list:
    """Per word: the prediction at its first subword. `token_predictions` may be longer (padding).
    Words up to the last one with a token, or `num_words`; a word with no token (cut off by
    truncation, or text the tokenizer drops) gets `missing`."""
    first: dict = {}
    for word, prediction in zip(word_ids_per_token, token_predictions):
        if word is not None:
            first.setdefault(word, prediction)
    if num_words is None:
        num_words = max(first, default=-1) + 1
    return [first.get(word, missing) for word in range(num_words)]


# --- extractive QA: SQuAD v1.1's evaluate-v1.1.py ---------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, ASCII punctuation removed, the articles a/an/the removed as whole words,
    whitespace runs made one space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(predicted) & Counter(expected)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 where the normalized prediction equals some normalized gold answer, else 0.0."""
    return max(float(normalize_answer(prediction) == normalize_answer(gold)) for gold in golds)


def squad_f1(prediction: str, golds: list[str]) -> float:
    """The best token-overlap F1 of the normalized prediction against each gold answer (0 with no
    token in common, also when both are empty)."""
    return max(_token_f1(prediction, gold) for gold in golds)


def squad_scores(predictions: dict[str, str], dataset: list[dict]) -> dict[str, float]:
    """{"exact_match", "f1"}: means over `dataset`'s questions ({"id", "answers": [str]}) × 100, as
    evaluate-v1.1.py reports them; a question without a prediction scores 0."""
    if not dataset:
        raise ValueError("squad_scores: the dataset holds no question")
    exact = f1 = 0.0
    for question in dataset:
        if question["id"] in predictions:
            exact += squad_exact_match(predictions[question["id"]], question["answers"])
            f1 += squad_f1(predictions[question["id"]], question["answers"])
    return {"exact_match": 100.0 * exact / len(dataset), "f1": 100.0 * f1 / len(dataset)}


# --- sequence classification and regression ---------------------------------------------------


def softmax(logits) -> np.ndarray:
    """Probabilities over the last axis of host-side logits (or scores)."""
    logits = np.asarray(logits, np.float64)
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)



def _paired(labels, predictions) -> tuple[np.ndarray, np.ndarray]:
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.shape != predictions.shape or labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"need one prediction per label, at least one: {labels.shape} vs {predictions.shape}")
    return labels, predictions


def accuracy(labels, predictions) -> float:
    labels, predictions = _paired(labels, predictions)
    return float(np.mean(labels == predictions))


def macro_f1(labels, predictions) -> float:
    """F1 of each class (2·tp / (2·tp + fp + fn); 0 where tp = 0) averaged over the classes that
    occur in `labels` or `predictions`, as scikit-learn's f1_score(average="macro")."""
    labels, predictions = _paired(labels, predictions)
    scores = []
    for c in np.union1d(labels, predictions):
        tp = np.sum((labels == c) & (predictions == c))
        scores.append(2 * tp / (np.sum(labels == c) + np.sum(predictions == c)))
    return float(np.mean(scores))


def majority_baseline(train_labels, eval_labels) -> float:
    """Accuracy on `eval_labels` of always predicting the most frequent training label (the first
    seen, among equally frequent ones)."""
    majority = Counter(list(train_labels)).most_common(1)[0][0]
    return accuracy(eval_labels, [majority] * len(eval_labels))


def pearson(x, y) -> float:
    """Pearson's r (NaN where either side is constant)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 2:
        raise ValueError(f"pearson needs two 1-D sequences of one length, at least 2: {x.shape} vs {y.shape}")
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt(np.dot(x, x) * np.dot(y, y))
    return float(np.clip(np.dot(x, y) / denominator, -1.0, 1.0)) if denominator > 0 else float("nan")


def average_ranks(x) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks (scipy.stats.rankdata's "average")."""
    _, group, counts = np.unique(np.asarray(x), return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2)[group.reshape(-1)]


def spearman(x, y) -> float:
    """Spearman's rho: Pearson's r of the average ranks (NaN where either side is constant)."""
    return pearson(average_ranks(x), average_ranks(y))


# --- text generation ----------------------------------------------------------------------------


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F-measures by the rouge-score package (Porter stemming, as
    summarisation papers report them)."""
    from rouge_score import rouge_scorer  # it loads nltk: only generation tasks pay for it

    if len(predictions) != len(references) or not references:
        raise ValueError(f"rouge needs one prediction per reference, at least one: {len(predictions)} vs "
                         f"{len(references)}")
    kinds = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
    scores = [scorer.score(reference, prediction) for prediction, reference in zip(predictions, references)]
    return {kind: float(np.mean([s[kind].fmeasure for s in scores])) for kind in kinds}
