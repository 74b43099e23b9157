"""Fine-tuning rows as transformers' tokenizers make them (pairs, truncation, NER's first subwords), and
the weight-0 rows that fill an epoch's last batch counting for nothing."""
import functools

import jax
import numpy as np
import pytest

from jaxlm.config import FinetuneConfig
from jaxlm.corpora.labelled import dataset_path
from jaxlm.corpora.models import minilm_dir
from jaxlm.data.tokenizers.load import load_tokenizer
from jaxlm.finetune.features import PairEncoder, batch_rows, truncate_longest_first
from jaxlm.finetune.tasks import TASKS, Context
from jaxlm.models.presets import model_config

transformers = pytest.importorskip("transformers")

PAIRS = [("The film is a delight from start to finish.", "A slow and tedious affair that never lifts off."),
         ("Westlife sold more than 23 million records in the UK, according to the British Phonographic Industry.",
          "Westlife made under 23.5 million sales in the UK.")]


@functools.cache
def tokenizers():
    return load_tokenizer(minilm_dir()), transformers.BertTokenizerFast.from_pretrained(minilm_dir())


@pytest.mark.parametrize("length", [12, 20, 64])
def test_pairs_equal_transformers_longest_first(length):
    ours, theirs = tokenizers()
    encoder = PairEncoder(ours, length, segments=True)
    for a, b in PAIRS:
        row = encoder.encode(encoder.ids(a), encoder.ids(b))
        expected = theirs(a, b, truncation="longest_first", max_length=length, padding="max_length")
        assert row["input_ids"].tolist() == expected["input_ids"]
        assert row["segment_ids"].tolist() == expected["token_type_ids"]
        assert row["input_mask"].tolist() == expected["attention_mask"]
        single = encoder.encode(encoder.ids(a))
        assert single["input_ids"].tolist() == theirs(a, truncation=True, max_length=length,
                                                      padding="max_length")["input_ids"]


@pytest.mark.parametrize("first, second, budget", [(7, 5, 7), (5, 7, 7), (6, 6, 6), (6, 6, 7), (2, 9, 6), (9, 1, 4)])
def test_truncation_keeps_what_transformers_keeps(first, second, budget):
    _, theirs = tokenizers()
    a, b = " ".join(["a"] * first), " ".join(["b"] * second)  # one token each
    expected = theirs(a, b, truncation="longest_first", max_length=budget + 3)["token_type_ids"]
    kept = truncate_longest_first(list(range(first)), list(range(second)), budget)
    assert (len(kept[0]), len(kept[1])) == (expected.count(0) - 2, expected.count(1) - 1)


def test_tag_rows_label_the_first_subword_of_each_real_wnut_word():
    import json
    ours, theirs = tokenizers()
    records = [json.loads(line) for line in dataset_path("wnut16", "train").read_text().splitlines()[:50]]
    labels = tuple(sorted({t for r in records for t in r["tags"]}))
    ctx = Context(model_config("bert-tiny"), FinetuneConfig(task="token_classification", max_length=128), labels, ours)
    rows = TASKS["token_classification"].rows(ctx, records, labelled=True)
    for index, record in enumerate(records):
        expected = theirs(record["words"], is_split_into_words=True, truncation=True, max_length=128)
        words = expected.word_ids()
        first = [w is not None and (i == 0 or words[i - 1] != w) for i, w in enumerate(words)]
        n = len(expected["input_ids"])
        assert rows.arrays["input_ids"][index, :n].tolist() == expected["input_ids"]
        assert rows.arrays["label_weights"][index, :n].astype(bool).tolist() == first
        tags = [labels[t] for t, on in zip(rows.arrays["labels"][index, :n], first) if on]
        assert tags == record["tags"][:len(tags)]


def test_padding_rows_change_no_loss():
    ours, _ = tokenizers()
    config = model_config("bert-tiny", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                          max_position_embeddings=32, dtype="float32")
    records = [{"text": a, "label": label} for (a, _), label in zip(PAIRS, ("positive", "negative"))]
    settings = FinetuneConfig(task="sequence_classification", max_length=32)
    ctx = Context(config, settings, ("negative", "positive"), ours)
    task = TASKS["sequence_classification"]
    rows, objective = task.rows(ctx, records, labelled=True), task.objective(ctx)
    params = objective.init(jax.random.key(0))
    loss = lambda batch: float(objective.summarize(objective.stats(params, batch, None, deterministic=True))["loss"])
    exact = batch_rows(rows, np.arange(2), 2)
    padded = batch_rows(rows, np.arange(2), 5)
    assert padded["example_weight"].tolist() == [1, 1, 0, 0, 0]
    assert loss(padded) == pytest.approx(loss(exact), rel=1e-6)


@pytest.mark.parametrize("labelled", [True, False])
def test_a_long_prompt_leaves_generation_room_for_the_whole_response(labelled):
    """causal_lm generates from a prompt cut to max_length - max_target_length tokens, so that the response's
    max_target_length new tokens fit (it once cut to the row's room, and generation overran the positions)."""
    gpt2 = load_tokenizer("gpt2")
    settings = FinetuneConfig(task="causal_lm", max_length=32, max_target_length=8)
    ctx = Context(model_config("gpt2-small", max_position_embeddings=32), settings, (), gpt2)
    records = [{"prompt": "word " * 100, "response": " fine"}, {"prompt": "Q: what?", "response": " It is."}]
    rows = TASKS["causal_lm"].rows(ctx, records, labelled=labelled)
    long, short = rows.meta
    assert len(long) == 32 - 8 and long == gpt2.encode(records[0]["prompt"])[-24:]  # its last tokens kept
    assert short == gpt2.encode(records[1]["prompt"])
