"""BERT dynamic masking and NSP labels, measured on examples prepared from the real demo corpus."""
import numpy as np
import pytest

from jaxlm.corpora.models import bert_vocab_path
from jaxlm.corpora.registry import fetch_demo_corpus
from jaxlm.data.masking import mask_example, random_non_special
from jaxlm.data.pipeline import PretrainingData, most_frequent_token_baseline
from jaxlm.data.prepare import prepare
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer

SEQ, PRED = 128, 20


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(bert_vocab_path())


@pytest.fixture(scope="module")
def data(tmp_path_factory, tokenizer):
    austen = [p for p in fetch_demo_corpus() if p.name == "austen.txt"]
    out = tmp_path_factory.mktemp("masking") / "bert"
    prepare(austen, out, tokenizer, max_seq_length=SEQ, short_seq_prob=0.1, dupe_factor=1,
            valid_fraction=0.05, seed=3, shard_size=2000, progress=False)
    return PretrainingData(out, "train", seed=11, max_predictions=PRED,
                           tokenizer_fingerprint=tokenizer.fingerprint(),
                           vocab_size=tokenizer.vocab_size, max_seq_length=SEQ)


def test_mask_rates_on_real_examples(data, tokenizer):
    specials = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id}
    candidates = chosen = masked = randomized = kept = 0
    index = 0
    while candidates < 150_000:
        tokens = data.raw(index).tokens
        ex = data.example(index, 0)
        n = len(tokens)
        candidates += int(sum(t not in specials for t in tokens))
        real = ex["masked_weights"] > 0
        positions = ex["masked_positions"][real]
        assert not specials & set(tokens[positions].tolist())
        chosen += len(positions)
        replaced = ex["input_ids"][positions]
        masked += int(np.sum(replaced == tokenizer.mask_id))
        kept += int(np.sum(replaced == tokens[positions]))
        randomized += int(np.sum((replaced != tokenizer.mask_id) & (replaced != tokens[positions])))
        unmasked = np.setdiff1d(np.arange(n), positions)
        np.testing.assert_array_equal(ex["input_ids"][unmasked], tokens[unmasked])
        assert np.all(ex["input_ids"][n:] == tokenizer.pad_id)
        index += 1
    assert chosen / candidates == pytest.approx(0.15, abs=0.005)
    assert masked / chosen == pytest.approx(0.8, abs=0.015)
    assert randomized / chosen == pytest.approx(0.1, abs=0.015)
    assert kept / chosen == pytest.approx(0.1, abs=0.015)


def test_nsp_labels_balanced_over_whole_split(data):
    labels = np.array([data.raw(i)[2] for i in range(len(data))])
    assert len(labels) > 5000
    assert labels.mean() == pytest.approx(0.5, abs=0.02)
    assert all(int(data.example(i, 0)["nsp_label"]) == labels[i] for i in range(50))


def test_example_is_a_pure_function_of_seed_epoch_index(data):
    a, b = data.example(7, 0), data.example(7, 0)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    again = PretrainingData(data.data_dir, "train", seed=11, max_predictions=PRED).example(7, 0)
    np.testing.assert_array_equal(again["input_ids"], a["input_ids"])
    other_seed = PretrainingData(data.data_dir, "train", seed=12, max_predictions=PRED).example(7, 0)
    assert not np.array_equal(other_seed["masked_positions"], a["masked_positions"])


def test_epochs_remask_the_same_example(data):
    same = sum(np.array_equal(data.example(i, 0)["masked_positions"],
                              data.example(i, 1)["masked_positions"]) for i in range(20))
    assert same == 0
    np.testing.assert_array_equal(data.example(3, 0)["segment_ids"], data.example(3, 1)["segment_ids"])


def test_positions_sorted_unique_labels_are_originals_and_segments(data):
    for i in range(200):
        tokens, len_a = data.raw(i)[:2]
        ex = data.example(i, 0)
        k = int(ex["masked_weights"].sum())
        positions = ex["masked_positions"][:k]
        assert k >= 1 and np.all(np.diff(positions) > 0)
        assert np.all(ex["masked_weights"][k:] == 0) and np.all(ex["masked_positions"][k:] == 0)
        np.testing.assert_array_equal(ex["masked_labels"][:k], tokens[positions])
        n = len(tokens)
        np.testing.assert_array_equal(ex["segment_ids"][:n], (np.arange(n) >= len_a).astype(np.int32))
        assert np.all(ex["segment_ids"][n:] == 0)
        np.testing.assert_array_equal(ex["input_mask"], (np.arange(SEQ) < n).astype(np.int32))


def test_mask_example_caps_predictions_and_rejects_long_input():
    tokens = np.array([1] + list(range(10, 60)) + [2] + list(range(60, 200)) + [2])
    out = mask_example(tokens, 52, np.random.default_rng(0), vocab_size=300, mask_id=3,
                       special_ids=(0, 1, 2, 3), max_seq_length=256, max_predictions=5)
    assert out["masked_weights"].sum() == 5
    with pytest.raises(ValueError, match="max_seq_length"):
        mask_example(tokens, 52, np.random.default_rng(0), vocab_size=300, mask_id=3,
                     special_ids=(0, 1, 2, 3), max_seq_length=100, max_predictions=5)


def test_random_replacements_avoid_special_ids():
    draws = random_non_special(np.random.default_rng(0), 200_000, 12, (0, 5, 11, 3))
    assert set(np.unique(draws).tolist()) == {1, 2, 4, 6, 7, 8, 9, 10}


def test_most_frequent_token_baseline(data):
    labels = np.concatenate([data.example(i, 0)["masked_labels"][data.example(i, 0)["masked_weights"] > 0]
                             for i in range(300)])
    expected = np.bincount(labels).max() / len(labels)
    assert most_frequent_token_baseline(data, limit=300) == pytest.approx(expected)
    assert 0.01 < expected < 0.2
