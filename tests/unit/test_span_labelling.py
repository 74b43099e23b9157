"""Span labelling: candidate spans and their gold classes from real WNUT-16 tags (seqeval's entities),
greedy non-overlapping decoding back to BIO, and the span representation's attention pooling."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.corpora.labelled import dataset_path
from jaxlm.finetune import spans
from jaxlm.models.encoder import BertEncoder
from jaxlm.models.presets import model_config
from jaxlm.models.task_heads import SpanLabeller


def wnut():
    return [json.loads(line) for line in dataset_path("wnut16", "train").read_text().splitlines()]


def test_gold_spans_decode_back_to_the_tags_of_every_well_formed_sentence():
    records = wnut()
    types = spans.entity_types([t for r in records for t in r["tags"]])
    assert len(types) == 10
    checked = 0
    for record in records:
        words = list(range(len(record["words"])))
        bounds = {w: (w, w) for w in words}
        candidates = spans.candidates(bounds, 8)
        gold = spans.gold_spans(record["tags"], types)
        assert set(gold) <= set(candidates) or max(e - s for s, e in gold) >= 8
        logits = np.full((len(candidates), len(types) + 1), -5.0)
        logits[:, 0] = 0
        for index, span in enumerate(candidates):
            if span in gold:
                logits[index, gold[span]] = 5
        well_formed = all(not t.startswith("I-") or (i and record["tags"][i - 1][2:] == t[2:])
                          for i, t in enumerate(record["tags"]))
        if well_formed and set(gold) <= set(candidates):
            assert spans.decode(logits, candidates, types, len(words)) == record["tags"]
            checked += 1
    assert checked >= len(records) - 10  # a few WNUT-16 sentences have an I- tag starting an entity


def test_decoding_takes_the_most_probable_span_and_skips_overlaps():
    candidates = [(0, 0), (0, 1), (1, 1), (2, 3)]
    logits = np.array([[3, 0, 0], [0, 0, 4], [0, 5, 0], [2, 1, 0]], float)  # none, PER, ORG
    assert spans.decode(logits, candidates, ["PER", "ORG"], 4) == ["O", "B-PER", "O", "O"]
    logits[2] = [6, 0, 0]  # (1, 1) is no entity: (0, 1) is the best left
    assert spans.decode(logits, candidates, ["PER", "ORG"], 4) == ["B-ORG", "I-ORG", "O", "O"]


def test_a_span_is_its_boundaries_and_its_attention_pooled_tokens():
    config = model_config("bert-tiny", hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                          max_position_embeddings=16, vocab_size=50, dtype="float32")
    model = SpanLabeller(config, num_labels=3)
    ids = jnp.array([[2, 7, 9, 11, 13, 3, 0, 0]])
    starts, ends = jnp.array([[1, 2, 1]]), jnp.array([[1, 4, 3]])
    params = nn.unbox(model.init(jax.random.key(0), ids, None, ids > 0, starts, ends)["params"])
    logits = model.apply({"params": params}, ids, None, ids > 0, starts, ends)
    assert logits.shape == (1, 3, 4)
    encoder = params["encoder"]
    states = np.asarray(BertEncoder(config).apply({"params": encoder}, ids, None, ids > 0, True,
                                                   method=BertEncoder.hidden_states))[0]
    score = states @ np.asarray(params["attention"]["kernel"])[:, 0] + np.asarray(params["attention"]["bias"])[0]
    start, end = 2, 4
    weights = np.exp(score[start:end + 1] - score[start:end + 1].max())
    summary = (weights / weights.sum()) @ states[start:end + 1]
    represented = np.concatenate([states[start], states[end], summary])
    dense = jax.nn.gelu(represented @ np.asarray(params["span_dense"]["kernel"]) + np.asarray(params["span_dense"]["bias"]))
    expected = np.asarray(dense) @ np.asarray(params["classifier"]["kernel"]) + np.asarray(params["classifier"]["bias"])
    np.testing.assert_allclose(np.asarray(logits[0, 1]), expected, atol=1e-5)
