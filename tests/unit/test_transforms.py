"""Every pretraining objective's data transform, measured on real tokenised text (Jane Austen)."""
import math

import numpy as np
import pytest

from jaxlm import families
from jaxlm.data import denoising, packing, pairs, spans
from jaxlm.corpora.models import bert_vocab_path
from jaxlm.corpora.registry import fetch_austen
from jaxlm.data.layouts import Row
from jaxlm.data.settings import DataConfig, check_data
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer

SEQ, PRED = 512, 80
# chi-square critical values at alpha = 0.001 (scipy.stats.chi2.ppf(0.999, dof)); scipy is not a dependency
CHI2_999 = {7: 24.322, 9: 27.877, 10: 29.588}


@pytest.fixture(scope="module")
def tok():
    return WordPieceTokenizer(bert_vocab_path())


@pytest.fixture(scope="module")
def documents(tok):
    """Austen chapters as lists of tokenised sentences, ~400k tokens."""
    docs, total = [], 0
    for block in fetch_austen().read_text().split("\n\n"):
        sentences = [s for s in tok.encode_batch(block.splitlines()) if s]
        docs.append(sentences)
        total += sum(map(len, sentences))
        if total > 400_000:
            return docs
    return docs


@pytest.fixture(scope="module")
def rows(documents, tok):
    return packing.pack_sentences(documents, SEQ, cls_id=tok.cls_id, sep_id=tok.sep_id)


@pytest.fixture(scope="module")
def is_continuation(tok):
    table = np.zeros(tok.vocab_size, bool)
    for token, i in tok.vocab.items():
        table[i] = token.startswith("##")
    return table


def rng(epoch, index, seed=5):
    return np.random.default_rng([seed, epoch, index])


def mlm_kwargs(tok):
    return dict(vocab_size=tok.vocab_size, mask_id=tok.mask_id, max_seq_length=SEQ, max_predictions=PRED,
                special_ids=(tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id))


def chi_square(observed, expected_probs):
    expected = np.asarray(expected_probs) * np.sum(observed)
    return float(np.sum((np.asarray(observed) - expected) ** 2 / expected))


def actions(original, inputs, mask_id):
    """Per group of positions: 0 = all [MASK], 1 = all replaced by other ids, 2 = all kept."""
    if np.all(inputs == mask_id):
        return 0
    if np.all(inputs == original):
        return 2
    assert np.all(inputs != mask_id)
    return 1


def test_candidates_are_the_tokens_outside_the_special_ids():
    tokens = np.random.default_rng(0).integers(0, 40_000, (3, 64))
    tokens[:, :6] = [0, 100, 101, 102, 103, 104]
    for special_ids in ((0, 100, 101, 102, 103), [102], (), (5, 39_999)):
        assert (spans.candidate_mask(tokens, special_ids, 40_000) == ~np.isin(tokens, special_ids)).all()


def test_whole_word_masking_rates(rows, tok, is_continuation):
    candidates = chosen = 0
    counts = np.zeros(3)
    for epoch in range(2):
        for index, row in enumerate(rows):
            starts = ~is_continuation[row]
            ex = spans.mask_words(row, starts, rng(epoch, index), **mlm_kwargs(tok))
            candidates += int(np.sum(~np.isin(row, (tok.cls_id, tok.sep_id))))
            positions = ex["masked_positions"][ex["masked_weights"] > 0]
            chosen += len(positions)
            masked = np.zeros(len(row), bool)
            masked[positions] = True
            word_id = np.cumsum(starts | np.isin(row, (tok.cls_id, tok.sep_id)))
            for w in np.unique(word_id[masked]):
                group = np.flatnonzero(word_id == w)
                assert masked[group].all(), "a word was masked only in part"
                counts[actions(row[group], ex["input_ids"][group], tok.mask_id)] += 1
    print(f"whole words: chosen {chosen / candidates:.4f}, actions {counts / counts.sum()} over {counts.sum():.0f} words")
    assert abs(chosen / candidates - 0.15) < 0.005
    np.testing.assert_allclose(counts / counts.sum(), [0.8, 0.1, 0.1], atol=0.01)


def test_span_masking_rates_boundaries_and_length_distribution(rows, tok, is_continuation):
    pmf = spans.clipped_geometric(0.2, 10)
    candidates = chosen = 0
    counts = np.zeros(3)
    drawn_hist = np.zeros(10)
    realised = []
    for epoch in range(3):
        for index, row in enumerate(rows):
            starts = ~is_continuation[row]
            ex = spans.span_mask(row, starts, rng(epoch, index), **mlm_kwargs(tok))
            special = np.isin(row, (tok.cls_id, tok.sep_id))
            sampled = spans.sample_spans(starts, ~special, rng(epoch, index), p=0.2, max_span=10,
                                         budget=spans.prediction_budget(int((~special).sum()), 0.15, PRED))
            candidates += int((~special).sum())
            real = ex["masked_weights"] > 0
            positions, pairs, offsets = ex["masked_positions"][real], ex["pair_positions"][real], ex["span_offsets"][real]
            chosen += len(positions)
            span_start = positions - offsets
            np.testing.assert_array_equal(span_start, pairs[:, 0] + 1)
            np.testing.assert_array_equal(ex["masked_labels"][real], row[positions])
            masked = np.zeros(len(row) + 1, bool)
            masked[positions] = True
            assert not masked[pairs].any(), "a span boundary is itself masked"
            word_id = np.cumsum(starts | special)
            assert set(zip(sampled.starts, sampled.ends)) == set(zip(span_start.tolist(), pairs[:, 1].tolist()))
            for k, (s, e) in enumerate(zip(sampled.starts, sampled.ends)):
                assert starts[s] and (e == len(row) or starts[e] or special[e]), "span cuts a word"
                assert not special[s:e].any()
                words = len(np.unique(word_id[s:e]))
                assert words == sampled.drawn[k] or k == len(sampled.drawn) - 1
                realised.append(words)
                counts[actions(row[s:e], ex["input_ids"][s:e], tok.mask_id)] += 1
            drawn_hist += np.bincount(sampled.drawn - 1, minlength=10)
    theory_mean = float(np.sum(np.arange(1, 11) * pmf))
    stat = chi_square(drawn_hist, pmf)
    print(f"spans: chosen {chosen / candidates:.4f}, actions {counts / counts.sum()} over {counts.sum():.0f} spans; "
          f"mean words drawn {np.sum(np.arange(1, 11) * drawn_hist) / drawn_hist.sum():.3f}, "
          f"realised {np.mean(realised):.3f}, theory {theory_mean:.3f}; chi2 {stat:.2f} (9 dof)")
    assert abs(chosen / candidates - 0.15) < 0.005
    np.testing.assert_allclose(counts / counts.sum(), [0.8, 0.1, 0.1], atol=0.01)
    # Wald's identity: with a stopping rule, the pooled draws (the last one included) follow the pmf
    assert stat < CHI2_999[9]
    drawn_mean = np.sum(np.arange(1, 11) * drawn_hist) / drawn_hist.sum()
    assert abs(drawn_mean - theory_mean) < 0.05
    # only each example's last span is ever cut (to the budget), so realised spans run a little short
    assert 0 < theory_mean - np.mean(realised) < 0.25


def test_transforms_are_pure_functions_of_seed_epoch_index(rows, tok, is_continuation):
    row = rows[3]
    starts = ~is_continuation[row]
    sentinels = list(range(tok.vocab_size - 1, tok.vocab_size - 101, -1))
    makers = [
        lambda r: spans.span_mask(row, starts, r, **mlm_kwargs(tok)),
        lambda r: spans.mask_words(row, starts, r, **mlm_kwargs(tok)),
        lambda r: denoising.t5_span_corruption(row, r, sentinel_ids=sentinels, eos_id=tok.sep_id),
        lambda r: denoising.bart_text_infilling(row, r, mask_id=tok.mask_id, max_seq_length=SEQ,
                                                max_target_length=SEQ),
    ]
    for make in makers:
        a, b, c = make(rng(0, 3)), make(rng(0, 3)), make(rng(1, 3))
        assert all(np.array_equal(a[k], b[k]) for k in a)
        assert not np.array_equal(a["input_ids"], c["input_ids"])


def test_full_sentence_rows_hold_every_sentence_once(documents, rows, tok):
    body = np.concatenate([r[1:-1] for r in rows])
    expected = np.concatenate([np.r_[[tok.sep_id] if d else [], *doc] for d, doc in enumerate(documents)])
    # the separator between two documents is dropped where they fall in different rows
    np.testing.assert_array_equal(body[body != tok.sep_id], expected[expected != tok.sep_id])
    assert all(len(r) <= SEQ and r[0] == tok.cls_id and r[-1] == tok.sep_id for r in rows)
    fill = np.mean([len(r) for r in rows]) / SEQ
    print(f"full-sentence rows: {len(rows)}, mean fill {fill:.3f}")
    assert fill > 0.9


def test_sentence_order_labels(documents, tok):
    pairs = [(a, b) for doc in documents for a, b in zip(doc, doc[1:])][:20_000]
    swapped = 0
    for i, (a, b) in enumerate(pairs):
        tokens, len_a, label = packing.sentence_order_pair(a, b, rng(0, i), cls_id=tok.cls_id, sep_id=tok.sep_id)
        first, second = (b, a) if label else (a, b)
        assert tokens[1:len_a - 1].tolist() == list(first) and tokens[len_a:-1].tolist() == list(second)
        swapped += label
    print(f"SOP swapped {swapped / len(pairs):.4f} of {len(pairs)}")
    assert abs(swapped / len(pairs) - 0.5) < 0.015


def _truncated_one_token_at_a_time(len_a: int, len_b: int, max_tokens: int, rng) -> tuple[list, list]:
    """BERT's truncate_seq_pair, as written: the longer side (b on a tie) loses a token from a random end."""
    a, b = list(range(len_a)), list(range(len_a, len_a + len_b))
    for from_front in (rng.random(max(0, len_a + len_b - max_tokens)) < 0.5).tolist():
        longer = a if len(a) > len(b) else b
        del longer[0 if from_front else -1]
    return a, b


def test_pair_truncation_is_berts_token_at_a_time_rule():
    draws = np.random.default_rng(0)
    for case in range(5_000):
        len_a, len_b, max_tokens = (int(x) for x in draws.integers([0, 0, 2], [60, 60, 100]))
        seed = int(draws.integers(2**31))
        a_front, a_back, b_front, b_back = pairs.truncation(len_a, len_b, max_tokens, rng(seed, case))
        cut = list(range(len_a))[a_front:len_a - a_back], list(range(len_a, len_a + len_b))[b_front:len_b - b_back]
        assert cut == _truncated_one_token_at_a_time(len_a, len_b, max_tokens, rng(seed, case)), (len_a, len_b)


@pytest.mark.parametrize("packed", [True, False])
def test_causal_packing_never_crosses_documents(documents, packed, tok):
    eos, length = tok.sep_id, 256
    docs = [[t for s in doc for t in s] for doc in documents]
    out = packing.pack_documents(docs, length, eos, packed=packed)
    stream = np.concatenate([np.r_[d, eos] for d in docs])
    doc_of = np.concatenate([np.full(len(d) + 1, i) for i, d in enumerate(docs)])
    ids, seg, tgt, w = out["input_ids"], out["segment_ids"], out["targets"], out["target_weights"]
    assert ids.shape[1] == length and np.all((seg == 0) == (ids == 0)) and np.all(w[seg == 0] == 0)
    if packed:
        real = ids[seg > 0]
        np.testing.assert_array_equal(real, stream)  # every token once, in order
        where = np.flatnonzero((seg > 0).reshape(-1))
        weighted = w.reshape(-1)[where] > 0
        nxt = np.r_[stream[1:], -1]
        same_doc = np.r_[doc_of[1:] == doc_of[:-1], False]
        np.testing.assert_array_equal(weighted, same_doc)
        np.testing.assert_array_equal(tgt.reshape(-1)[where][weighted], nxt[weighted])
        doc_rows = np.full(ids.shape, -1)
        doc_rows[seg > 0] = doc_of
        for r in range(len(ids)):  # a segment id changes exactly where the document does
            pos = seg[r] > 0
            np.testing.assert_array_equal(np.diff(seg[r][pos]) > 0, np.diff(doc_rows[r][pos]) != 0)
    else:
        assert len(ids) == len(docs)
        for d, row, t, wt in zip(docs, ids, tgt, w):
            sequence = np.r_[d, eos]
            n = min(len(sequence), length)
            np.testing.assert_array_equal(row[:n], sequence[:n])
            np.testing.assert_array_equal(t[wt > 0], sequence[1:n + 1][: int(wt.sum())])
            assert wt.sum() == min(len(sequence) - 1, length)


def test_t5_lengths_match_the_published_numbers():
    assert denoising.t5_input_target_lengths(512, 0.15, 3.0) == (568, 114)
    assert denoising.t5_input_target_lengths(512, 0.5, 3.0)[1] <= 512


@pytest.mark.parametrize(("family", "needed"), [("t5", 29), ("bart", 128)])
def test_a_decoder_shorter_than_the_targets_is_refused_when_the_transform_is_built(family, needed):
    """Once the first batch failed, after compilation, saying only that an example did not fit."""
    manifest = {"max_seq_length": 128,
                "special_ids": {"pad": 0, "eos": 1, "bos": 2, "mask": 3, "sentinels": list(range(4, 104))}}
    transform = families.get(family).transform
    with pytest.raises(ValueError, match=f"data.max_target_length={needed - 1} is shorter than .*, {needed} tokens; "):
        transform(manifest, None, DataConfig(max_target_length=needed - 1))
    transform(manifest, None, DataConfig(max_target_length=needed))


@pytest.mark.parametrize(("noise_density", "mean_span_length"), [(0.15, 3.0), (0.15, 50.0), (0.5, 1.0), (0.9, 1.0)])
def test_t5_rows_fit_their_lengths_and_sentinels_are_counted_when_the_transform_is_built(noise_density,
                                                                                         mean_span_length):
    """A mean span longer than the noise made one token too many (T5's length helper counted no span), and too few
    sentinels failed at the first batch, after compilation: every row length now fits, and the sentinels a row's
    spans need are counted up front."""
    data = DataConfig(noise_density=noise_density, mean_span_length=mean_span_length)
    raw = denoising.t5_lengths(data)[0]
    noise, spans = denoising.t5_noise_counts(raw, noise_density, mean_span_length)
    needed = min(spans, raw - noise)
    special = {"pad": 0, "eos": 1, "bos": 2, "mask": 3}
    transform = families.get("t5").transform
    with pytest.raises(ValueError, match=f"makes {needed} noise spans in a row of {raw} tokens, one sentinel id each, "
                                         f"but the tokenizer has {needed - 1}; set data.sentinels={needed} or more"):
        transform({"max_seq_length": 128, "special_ids": special | {"sentinels": list(range(4, 3 + needed))}},
                  None, data)
    corrupt = transform({"max_seq_length": 128, "special_ids": special | {"sentinels": list(range(4, 4 + needed))}},
                        None, data)
    lengths = [raw, raw - 1, raw // 2, 5, 2, 1]
    batch = corrupt([Row(np.arange(200, 200 + n, dtype=np.int32)) for n in lengths],
                    [rng(0, i) for i in range(len(lengths))])
    assert batch["input_ids"].shape == (len(lengths), 128)
    if noise_density != 0.5:  # at 0.5 T5 takes a token off the row so that the targets fit
        assert batch["input_mask"][0].sum() == 128 - (spans - needed)  # merged spans leave the inputs that short


def test_t5_corruption_of_a_batch_of_mixed_lengths_is_each_rows_alone(documents, tok):
    """`t5_corrupt_rows` corrupts the rows of each length together; every row comes out as it does alone."""
    stream = np.concatenate([t for doc in documents for t in doc])
    lengths = [568, 568, 37, 568, 2, 37, 100]
    rows = [stream[i * 600:i * 600 + n] for i, n in enumerate(lengths)]
    sentinels = np.arange(tok.vocab_size - 1, tok.vocab_size - 101, -1)
    inputs, targets = denoising.t5_corrupt_rows(rows, [rng(3, i) for i in range(len(rows))], sentinel_ids=sentinels,
                                                eos_id=tok.sep_id)
    for i, row in enumerate(rows):
        alone = denoising.t5_corrupt(row, rng(3, i), sentinel_ids=sentinels, eos_id=tok.sep_id)
        np.testing.assert_array_equal(inputs[i], alone[0])
        np.testing.assert_array_equal(targets[i], alone[1])
        assert len(inputs[i]) + len(targets[i]) == len(row) + 2 * denoising.t5_noise_counts(len(row), 0.15, 3.0)[1] + 2


def test_t5_span_corruption_density_spans_and_reconstruction(documents, tok):
    raw_length, target_length = denoising.t5_input_target_lengths(512)
    stream = np.concatenate([t for doc in documents for t in doc])
    sentinels = np.arange(tok.vocab_size - 1, tok.vocab_size - 101, -1)
    eos = tok.sep_id
    noise = total = 0
    span_lengths = []
    for i in range(len(stream) // raw_length):
        tokens = stream[i * raw_length:(i + 1) * raw_length]
        ex = denoising.t5_span_corruption(tokens, rng(0, i), sentinel_ids=sentinels, eos_id=eos)
        inputs, targets = ex["input_ids"], ex["targets"]
        assert len(inputs) == 512 and len(targets) == target_length
        assert inputs[-1] == eos and targets[-1] == eos and ex["target_weights"].all()
        np.testing.assert_array_equal(ex["decoder_input_ids"], np.r_[0, targets[:-1]])
        cut = np.flatnonzero(np.isin(targets, sentinels))
        pieces = {targets[c]: targets[c + 1:e] for c, e in zip(cut, np.r_[cut[1:], len(targets) - 1])}
        rebuilt = np.concatenate([pieces[t] if t in pieces else [t] for t in inputs[:-1]])
        np.testing.assert_array_equal(rebuilt, tokens)
        span_lengths += [len(p) for p in pieces.values()]
        noise += sum(len(p) for p in pieces.values())
        total += len(tokens)
    n, k = denoising.t5_noise_counts(raw_length, 0.15, 3.0)
    # a uniform split of n items into k non-empty parts: P(part = j) = C(n-j-1, k-2) / C(n-1, k-1)
    probs = np.array([math.comb(n - j - 1, k - 2) / math.comb(n - 1, k - 1) for j in range(1, n - k + 2)])
    observed = np.bincount(span_lengths, minlength=n - k + 2)[1:]
    binned_obs, binned_p = np.r_[observed[:7], observed[7:].sum()], np.r_[probs[:7], probs[7:].sum()]
    stat = chi_square(binned_obs, binned_p)
    print(f"T5: density {noise / total:.4f} over {total} tokens, mean span {np.mean(span_lengths):.3f} "
          f"({len(span_lengths)} spans), segmentation chi2 {stat:.2f} (7 dof)")
    assert abs(noise / total - 0.15) < 0.005
    assert abs(np.mean(span_lengths) - 3.0) < 0.1
    assert stat < CHI2_999[7]


@pytest.mark.parametrize("density, mean_span", [(0.15, 3.0), (0.5, 1.0), (0.9, 1.0), (0.8, 2.0)])
def test_t5_noise_masks_hold_their_density_when_spans_outnumber_kept_tokens(density, mean_span):
    """With more noise spans than kept tokens T5's split leaves some kept spans empty and the noise spans beside
    them merge (its segment sum counts two starts at one position); marking starts as seen lost half the noise."""
    noise, spans = denoising.t5_noise_counts(100, density, mean_span)
    masks = denoising.random_spans_noise_masks(100, [rng(1, i) for i in range(200)], density, mean_span)
    assert (masks.sum(1) == noise).all() and not masks[:, 0].any()
    starts = (masks[:, 1:] & ~masks[:, :-1]).sum(1)
    if spans <= 100 - noise:  # every kept span non-empty: exactly `spans` noise spans
        assert (starts == spans).all()
    else:
        assert (starts <= 100 - noise).all() and starts.max() == 100 - noise


def test_bart_text_infilling_rate_spans_and_reconstruction(documents, tok):
    stream = np.concatenate([t for doc in documents for t in doc])
    masked = total = 0
    hist = np.zeros(11)
    mask_id = tok.mask_id
    for i in range(len(stream) // 500):
        tokens = stream[i * 500:(i + 1) * 500]
        ex = denoising.bart_text_infilling(tokens, rng(0, i), mask_id=mask_id, max_seq_length=500,
                                           max_target_length=500)
        infill = denoising.sample_infill_spans(500, rng(0, i))
        np.testing.assert_array_equal(ex["targets"], tokens)
        inputs = ex["input_ids"][ex["input_mask"] > 0]
        assert np.sum(inputs == mask_id) == len(infill.starts)
        rebuilt, at = [], 0
        for t in inputs:  # the k-th mask stands for span k
            if t == mask_id:
                rebuilt.extend(tokens[infill.starts[at]:infill.starts[at] + infill.lengths[at]])
                at += 1
            else:
                rebuilt.append(t)
        np.testing.assert_array_equal(rebuilt, tokens)
        last = np.flatnonzero(infill.lengths != infill.drawn)
        assert len(last) <= 1
        masked += int(infill.lengths.sum())
        total += len(tokens)
        hist += np.bincount(np.minimum(infill.drawn, 10), minlength=11)
    pois = np.array([math.exp(-3) * 3 ** j / math.factorial(j) for j in range(10)])
    stat = chi_square(hist, np.r_[pois, 1 - pois.sum()])
    print(f"BART: masked {masked / total:.4f} over {total} tokens, {hist.sum():.0f} spans "
          f"({hist[0] / hist.sum():.4f} inserts vs {pois[0]:.4f}), mean length "
          f"{np.sum(np.arange(11) * hist) / hist.sum():.3f}, Poisson chi2 {stat:.2f} (10 dof)")
    assert abs(masked / total - 0.3) < 0.01
    assert stat < CHI2_999[10]


@pytest.mark.parametrize("poisson_lambda", [0.1, 0.5, 1.0])
def test_bart_inserted_masks_never_make_the_inputs_longer_than_the_row(poisson_lambda):
    """Empty spans insert masks: a small poisson_lambda drew more of them than the other spans saved, and a full
    row's inputs overflowed max_seq_length at a batch mid-run. The masked share stays round(mask_ratio × length)."""
    tokens = np.arange(10, 136, dtype=np.int32)
    for i in range(300):
        spans = denoising.sample_infill_spans(len(tokens), rng(0, i), poisson_lambda=poisson_lambda)
        assert spans.lengths.sum() == 38 and (spans.lengths == 0).sum() <= (spans.lengths[spans.lengths > 0] - 1).sum()
        inputs = denoising.infill(tokens, rng(0, i), mask_id=3, poisson_lambda=poisson_lambda)
        assert len(inputs) == len(tokens) - 38 + len(spans.lengths) <= len(tokens)


def test_a_poisson_lambda_that_draws_nearly_only_empty_spans_is_refused():
    """BART draws span lengths until they cover the masked tokens: poisson_lambda=1e-9 drew empty spans for ever
    (`jaxlm data show configs/bart-tiny.yaml data.poisson_lambda=1e-9` hung, its memory growing)."""
    with pytest.raises(ValueError, match=r"data\.poisson_lambda=1e-09 must be 0\.01 or more: BART's mean span length"):
        check_data(DataConfig(poisson_lambda=1e-9))
    check_data(DataConfig(poisson_lambda=0.01))
    spans = denoising.sample_infill_spans(128, rng(0, 0), mask_ratio=1.0, poisson_lambda=0.01)
    assert spans.lengths.sum() == 128


def test_bart_sentence_permutation(documents):
    doc = documents[0][:12]
    ex = denoising.bart_sentence_permutation(doc, rng(0, 0), max_seq_length=SEQ * 2, max_target_length=SEQ * 2)
    n = sum(map(len, doc))
    np.testing.assert_array_equal(ex["targets"][:n], np.concatenate(doc))
    np.testing.assert_array_equal(np.sort(ex["input_ids"][:n]), np.sort(np.concatenate(doc)))
    assert not np.array_equal(ex["input_ids"][:n], ex["targets"][:n])
    assert ex["decoder_input_ids"][0] == 2 and ex["target_weights"].sum() == n


def test_span_fit_check_agrees_with_the_exact_set(documents, tok):
    """The rejection sampler's scalar check accepts exactly the (word, length) pairs that the
    exact vectorised set allows, on real rows with random spans already masked."""
    from jaxlm.data.spans import _fits, _most_words, word_bounds

    table = np.array([not p.startswith("##") for p in tok.convert_ids_to_tokens(range(tok.vocab_size))])
    rows = [np.concatenate([[tok.cls_id], *doc[:6], [tok.sep_id]]) for doc in documents[:40] if len(doc) >= 6]
    checked = 0
    for i, row in enumerate(rows):
        candidates = ~np.isin(row, [tok.cls_id, tok.sep_id])
        starts, ends = word_bounds(table[row], candidates)
        masked = np.zeros(len(row) + 1, bool)
        for s in rng(9, i).choice(len(row), size=len(row) // 6, replace=False):
            masked[s:s + 2] = True
        masked[-1] = False
        flags = bytearray(masked.astype(np.uint8).tobytes())
        for left in (3, 20, len(row)):
            most = _most_words(starts, ends, masked, left)
            for w in range(len(starts)):
                for k in range(1, 12):
                    assert _fits(w, k, starts.tolist(), ends.tolist(), flags, left) == (most[w] >= k), (i, w, k, left)
                    checked += 1
    assert checked > 50_000


def test_word_bounds_of_a_batch_are_each_rows(documents, tok):
    """`rows_word_bounds` (every row at once) finds each row's words as `word_bounds` does row by row, on real
    rows of different lengths between [CLS] and [SEP], the longest one column short of the matrix's width."""
    from jaxlm.data.spans import rows_word_bounds, word_bounds

    table = np.array([not p.startswith("##") for p in tok.convert_ids_to_tokens(range(tok.vocab_size))])
    rows = [np.concatenate([[tok.cls_id], *doc[:k], [tok.sep_id]]) for k, doc in enumerate(documents[:60], 1)]
    width = max(len(r) for r in rows) + 1
    tokens = np.zeros((len(rows), width), np.int32)
    candidates = np.zeros((len(rows), width), bool)
    for i, row in enumerate(rows):
        tokens[i, :len(row)] = row
        candidates[i, :len(row)] = ~np.isin(row, [tok.cls_id, tok.sep_id])
    batch = rows_word_bounds(table[tokens], candidates)
    assert len(batch) == len(rows)
    for row, row_candidates, (starts, ends) in zip(rows, candidates, batch):
        expected = word_bounds(table[row], row_candidates[:len(row)])
        np.testing.assert_array_equal(starts, expected[0])
        np.testing.assert_array_equal(ends, expected[1])
