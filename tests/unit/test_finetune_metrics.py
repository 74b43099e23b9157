"""Fine-tuning metrics: entity scores against seqeval on real WNUT-16 tags, first-subword label
alignment against transformers' tokenizer, SQuAD v1.1 EM/F1 on hand-derived numbers, classification
on hand-made cases, Pearson and Spearman against scipy."""
import dataclasses
import types

import numpy as np
import pytest
from seqeval.metrics import f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import IOB2

from jaxlm.config import ConfigError, FinetuneConfig
from jaxlm.corpora.models import bert_vocab_path, wnut16_path
from jaxlm.data.tokenizers.load import load_tokenizer
from jaxlm.finetune.metrics import (accuracy, average_ranks, entity_scores, macro_f1, majority_baseline, names_entities,
                                    normalize_answer, pearson, spearman, squad_exact_match, squad_f1,
                                    squad_scores, subword_predictions_to_words, word_ids,
                                    word_labels_to_subwords)
from jaxlm.finetune.tasks import TASKS, squad_metrics


@pytest.fixture(scope="module")
def wnut16() -> list[tuple[list[str], list[str]]]:
    """(words, tags) of each tweet."""
    tweets = []
    for block in wnut16_path().read_text(encoding="utf-8").split("\n\t\n"):
        rows = [line.split("\t") for line in block.split("\n") if line.strip()]
        if rows:
            tweets.append(([w for w, _ in rows], [t for _, t in rows]))
    return tweets


@pytest.fixture(scope="module")
def bert():
    return load_tokenizer(bert_vocab_path())


def perturbed(tags: list[str], types: list[str], k: int) -> tuple[list[str], int]:
    """`tags` with its entities, numbered from `k`, dropped (k % 5 == 0), given another type (1),
    their end moved one word right where an O follows, else their start (2), or left as they are;
    and the next k."""
    out = list(tags)
    for type_, start, end in get_entities(tags):
        if k % 5 == 0:
            out[start:end + 1] = ["O"] * (end + 1 - start)
        elif k % 5 == 1:
            other = types[(types.index(type_) + 1) % len(types)]
            out[start:end + 1] = [f"{t[:2]}{other}" for t in tags[start:end + 1]]
        elif k % 5 == 2 and end + 1 < len(tags) and tags[end + 1] == "O":
            out[end + 1] = f"I-{type_}"
        elif k % 5 == 2 and end > start:
            out[start] = "O"  # leaves an I- without B-
        k += 1
    return out, k


def test_wnut16_asset(wnut16):
    assert len(wnut16) == 2394 and sum(len(words) for words, _ in wnut16) == 46469
    types = {t[2:] for _, tags in wnut16 for t in tags if t != "O"}
    assert len(types) == 10 and {"person", "geo-loc", "company"} <= types


def test_entity_scores_equal_seqeval_on_wnut16(wnut16):
    gold = [tags for _, tags in wnut16]
    types = sorted({t[2:] for tags in gold for t in tags if t != "O"})
    predicted, k = [], 0
    for tags in gold:
        tags, k = perturbed(tags, types, k)
        predicted.append(tags)
    assert k == 1496  # the gold entities, one per B- tag

    def only(type_, sequences):
        return [[t if t[2:] == type_ else "O" for t in tags] for tags in sequences]

    for strict, mode in ((False, {}), (True, {"mode": "strict", "scheme": IOB2})):
        scores = entity_scores(gold, predicted, strict=strict)
        assert scores["precision"] == precision_score(gold, predicted, **mode)
        assert scores["recall"] == recall_score(gold, predicted, **mode)
        assert scores["f1"] == f1_score(gold, predicted, **mode)
        assert scores["support"] == 1496 and set(scores["per_type"]) == set(types)
        for type_, row in scores["per_type"].items():
            assert row["precision"] == pytest.approx(precision_score(only(type_, gold), only(type_, predicted), **mode))
            assert row["recall"] == pytest.approx(recall_score(only(type_, gold), only(type_, predicted), **mode))
            assert row["f1"] == pytest.approx(2 * row["precision"] * row["recall"] / (row["precision"] + row["recall"]))
        assert 0.4 < scores["f1"] < 0.5


@pytest.mark.parametrize("gold, predicted, default, strict", [
    # an I- without B-: an entity in the default (conlleval) mode, none in strict mode
    ([["B-PER", "I-PER", "O", "B-LOC"]], [["I-PER", "I-PER", "O", "B-LOC"]], (1, 1), (1, 0.5)),
    # entities at the end of one sentence and the start of the next are two entities
    # (the I- opening the second is no entity in strict mode)
    ([["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["O", "O"]], (1, 0.5), (1, 1)),
    # a boundary moved at the end of a sequence: no match
    ([["O", "B-ORG", "I-ORG"]], [["O", "B-ORG", "O"]], (0, 0), (0, 0)),
    # I- of another type starts a new entity
    ([["B-PER", "I-PER"]], [["B-PER", "I-LOC"]], (0, 0), (0, 0)),
    ([["O", "O"]], [["O", "O"]], (0, 0), (0, 0)),
])
def test_entity_scores_edge_cases(gold, predicted, default, strict):
    for scores, (precision, recall) in ((entity_scores(gold, predicted), default),
                                        (entity_scores(gold, predicted, strict=True), strict)):
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0
        assert (scores["precision"], scores["recall"]) == (precision, recall)
        assert scores["f1"] == pytest.approx(f1)


def test_entity_scores_per_type():
    scores = entity_scores([["B-PER", "O", "B-LOC", "I-LOC"]], [["B-LOC", "O", "B-LOC", "I-LOC"]])
    assert (scores["precision"], scores["recall"], scores["support"]) == (0.5, 0.5, 2)
    assert scores["per_type"] == {"PER": {"precision": 0, "recall": 0, "f1": 0, "support": 1},
                                  "LOC": {"precision": 0.5, "recall": 1, "f1": pytest.approx(2 / 3), "support": 1}}


def test_word_ids_equal_transformers_and_labels_round_trip_on_wnut16(wnut16, bert):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast(vocab=str(bert_vocab_path()), do_lower_case=True)
    sentences = [words for words, _ in wnut16]
    expected = reference(sentences, is_split_into_words=True)
    split_words = 0
    for i, (words, tags) in enumerate(wnut16):
        ids, word_of = word_ids(bert, words)
        assert (ids, word_of) == (expected["input_ids"][i], expected.word_ids(i))
        assert ids[0] == 101 and ids[-1] == 102

        labels = word_labels_to_subwords(word_of, tags, ignore="-")
        assert sum(label != "-" for label in labels) == len(words)
        # a trained head's output: right on first subwords, anything elsewhere, padded
        predictions = [label if label != "-" else "B-junk" for label in labels] + ["I-junk"] * 3
        assert subword_predictions_to_words(word_of, predictions) == tags
        split_words += sum(word_of.count(w) > 1 for w in range(len(words)))
    assert split_words > 5000  # many words span several subwords


def test_word_ids_tricky_words_equal_transformers(bert):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizerFast(vocab=str(bert_vocab_path()), do_lower_case=True)
    words = ["Héllo", "WÖRLD!", "naïve", "İstanbul", "ﬁne", "日本語", "x\x00y", "\u200b", "😀👍🏽", "don't",
             "e\u0301", "a b", "", "@user", "#tag"]
    expected = reference(words, is_split_into_words=True)
    assert word_ids(bert, words) == (expected["input_ids"], expected.word_ids())
    ids, word_of = word_ids(bert, words, add_special_tokens=False)
    assert (ids, word_of) == (expected["input_ids"][1:-1], expected.word_ids()[1:-1])
    # the zero-width space and the empty word have no token: their prediction is `missing`
    predictions = subword_predictions_to_words(word_of, ids, num_words=len(words), missing=-1)
    assert [i for i, p in enumerate(predictions) if p == -1] == [7, 12]


def test_subword_alignment_by_hand():
    word_of = [None, 0, 0, 1, 2, 2, 2, None]
    assert word_labels_to_subwords(word_of, [5, 6, 7]) == [-100, 5, -100, 6, 7, -100, -100, -100]
    assert subword_predictions_to_words(word_of, [9, 1, 2, 3, 4, 5, 6, 9, 0, 0]) == [1, 3, 4]
    # truncated after the first word's subwords: the rest are `missing`
    assert subword_predictions_to_words([None, 0, 0, None], [9, 1, 2, 9]) == [1]
    assert subword_predictions_to_words([None, 0, 0, None], [9, 1, 2, 9], num_words=3, missing="O") == [1, "O", "O"]


@pytest.mark.parametrize("text, normalized", [
    ("The  Quick, brown FOX!", "quick brown fox"),
    ("an apple a day", "apple day"),
    ("theater and anatomy", "theater and anatomy"),  # articles only as whole words
    ("t-h-e", ""),  # punctuation goes first, then "the"
    ("A.B.", "ab"),
    ("\tU.S.\n  Army ", "us army"),
    ("“curly” — quotes", "“curly” — quotes"),  # string.punctuation is ASCII only
])
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize("prediction, golds, exact, f1", [
    ("the Eiffel Tower.", ["Eiffel tower"], 1, 1),
    ("Eiffel", ["Eiffel Tower"], 0, 2 / 3),  # P 1, R 1/2
    ("the big red dog", ["a red dog barked"], 0, 2 / 3),  # 2 of 3 tokens each way
    ("dog dog dog", ["dog cat"], 0, 0.4),  # overlap counts min(3, 1): P 1/3, R 1/2
    ("New York City", ["York", "New York", "city of New York"], 0, 6 / 7),  # best of 1/2, 4/5, 6/7
    ("New York City", ["nyc", "new york city!"], 1, 1),
    ("", ["Paris"], 0, 0),
    ("", ["The"], 1, 0),  # both normalize to "": equal, but no token in common
    ("Paris", ["London", "Rome"], 0, 0),
])
def test_squad_exact_match_and_f1(prediction, golds, exact, f1):
    assert squad_exact_match(prediction, golds) == exact
    assert squad_f1(prediction, golds) == pytest.approx(f1, rel=1e-12)


def test_squad_scores():
    dataset = [{"id": "q1", "answers": ["Denver Broncos", "the Denver Broncos"]},
               {"id": "q2", "answers": ["dog cat"]},
               {"id": "q3", "answers": ["1066"]}]
    scores = squad_scores({"q1": "Denver Broncos.", "q2": "dog dog dog", "extra": "x"}, dataset)
    # q1 exact, q2 F1 0.4, q3 unanswered
    assert scores == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(140 / 3)}
    with pytest.raises(ValueError):
        squad_scores({}, [])


def test_squad_records_are_scored_by_their_place_not_their_ids():
    """Records that share an id: each once got the last one's answer, so the summary disagreed with the
    predictions file."""
    records = [{"id": "dup", "answers": [{"text": "Denver Broncos"}]}, {"id": "dup", "answers": [{"text": "1066"}]}]
    assert squad_metrics(records, ["Denver Broncos", "1066"]) == {"f1": 100.0, "exact_match": 100.0}


def test_classification_metrics():
    assert accuracy([0, 1, 1, 2], [0, 1, 2, 2]) == 0.75
    # per class: 0: tp 1 of 2 gold, 2 predicted -> 1/2; 1: tp 2, 2 gold, 3 predicted -> 4/5; 2: 0
    assert macro_f1([0, 0, 1, 1, 2], [0, 1, 1, 1, 0]) == pytest.approx(1.3 / 3)
    assert macro_f1(["a", "a"], ["a", "b"]) == pytest.approx(1 / 3)  # a predicted-only class counts, with F1 0
    assert macro_f1(["x", "y"], ["x", "y"]) == 1
    assert majority_baseline(["a", "b", "b"], ["b", "a", "b", "b"]) == 0.75
    assert majority_baseline(["x", "y"], ["y", "y"]) == 0  # a tie goes to the first seen
    with pytest.raises(ValueError):
        accuracy([0, 1], [0])
    with pytest.raises(ValueError):
        macro_f1([], [])


def test_pearson_and_spearman_equal_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (2, 3, 10, 200):
        x = rng.integers(0, 5, n).astype(float)  # many ties
        y = x + rng.normal(0, 2, n)
        y[: n // 3] = np.round(y[: n // 3])
        if np.ptp(x) == 0:
            continue
        assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-12)
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        np.testing.assert_array_equal(average_ranks(x), stats.rankdata(x))
    assert spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == 1
    assert pearson([1, 2, 3], [3, 2, 1]) == -1
    assert np.isnan(pearson([1, 1, 1], [1, 2, 3])) and np.isnan(spearman([1, 2, 3], [5, 5, 5]))
    with pytest.raises(ValueError):
        pearson([1, 2], [1, 2, 3])


SQUAD_RECORD = {"question": "who?", "context": "Ann came.", "answers": [{"text": "Ann", "answer_start": 0}]}
SCORED = [  # (task, settings, predictions, records)
    ("sequence_classification", {}, [{"label": "a"}, {"label": "b"}], [{"label": "a"}, {"label": "a"}]),
    ("sequence_classification", {"regression": True}, [{"score": 0.1}, {"score": 0.5}],
     [{"label": 0.2}, {"label": 0.7}]),
    ("token_classification", {"labels": ("B-PER", "O")}, [{"tags": ["B-PER", "O"]}], [{"tags": ["B-PER", "O"]}]),
    ("token_classification", {"labels": ("NN", "VB")}, [{"tags": ["NN", "VB"]}], [{"tags": ["NN", "NN"]}]),
    ("span_labelling", {"labels": ("B-PER", "O")}, [{"tags": ["B-PER", "O"]}], [{"tags": ["O", "O"]}]),
    ("multiple_choice", {}, [{"choice": 1}], [{"label": 1}]),
    ("question_answering", {}, [{"answer": "Ann"}], [SQUAD_RECORD]),
    ("sentence_embedding", {"loss": "softmax"}, [{"label": "a", "cosine": 0.1}], [{"label": "a"}]),
    ("sentence_embedding", {"loss": "cosine"}, [{"cosine": 0.1}, {"cosine": 0.4}], [{"label": 0.2}, {"label": 0.9}]),
    ("sentence_embedding", {"loss": "ranking"}, [{"rank": 1, "cosine": 0.4}], [{}]),
    ("text_to_text", {}, [{"text": "the cat"}], [{"source": "s", "target": "the cat sat"}]),
    ("text_to_text", {}, [{"text": "Ann"}], [SQUAD_RECORD]),
    ("causal_lm", {}, [{"response": "the cat"}], [{"prompt": "p", "response": "the cat sat"}]),
]


@pytest.mark.parametrize("task_name, settings, predictions, records", SCORED)
def test_each_task_names_the_metrics_it_reports(task_name, settings, predictions, records):
    """`finetune.metric` is checked against metric_names before any compute (it was checked against the step-0
    dev scores, after compiling), so they must be what score reports, the default first."""
    task, config = TASKS[task_name], FinetuneConfig(task=task_name, **settings)
    scores = task.score(types.SimpleNamespace(settings=config, labels=config.labels), predictions, records)
    assert tuple(scores) == task.metric_names(config, records)
    assert task.metric_for(config, records) == tuple(scores)[0]
    assert task.metric_for(dataclasses.replace(config, metric=tuple(scores)[-1]), records) == tuple(scores)[-1]
    with pytest.raises(ConfigError, match=rf"^finetune.metric='bleu': {task_name} reports {', '.join(scores)}$"):
        task.metric_for(dataclasses.replace(config, metric="bleu"), records)


def test_entity_tags_are_told_from_tags_of_their_own_and_a_mix_is_refused():
    """Part-of-speech tags were scored by seqeval as entities ("NN" an entity of type "N"), and that F1 picked the
    best checkpoint; a tag like X-FOO among BIO tags was taken as an entity."""
    assert names_entities(("O", "B-PER", "I-PER", "E-LOC", "S-LOC")) and names_entities(("O",))
    assert not names_entities(("NN", "VB", "DT")) and not names_entities(("O", "NN"))
    for mixed in (("O", "B-PER", "X-FOO"), ("B-PER", "PER"), ("B-PER", "B-")):
        with pytest.raises(ValueError, match="is neither O nor an entity tag .B-, I-, E- or S-TYPE., as others are"):
            names_entities(mixed)
    task, settings = TASKS["token_classification"], FinetuneConfig(task="token_classification")
    with pytest.raises(ValueError, match=r"^finetune.train=t.jsonl \(or finetune.labels\): tag 'X-FOO' is neither"):
        task.check([{"words": ["Ann", "x"], "tags": ["B-PER", "X-FOO"]}], ("B-PER", "X-FOO"), "finetune.train=t.jsonl",
                   settings)
    with pytest.raises(ValueError, match="span_labelling finds entities, and tags NN, VB name none"):
        TASKS["span_labelling"].check([{"words": ["a"], "tags": ["NN"]}], ("NN", "VB"), "finetune.train=t.jsonl",
                                      settings)
