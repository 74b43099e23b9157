"""Each objective's transform: stored rows, each with its own generator seeded by (seed, epoch,
index) -> the batch fields its objective declares (dynamic masks, swaps and corruptions)."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from jaxlm.data.denoising import infill, permute_sentences, seq2seq_arrays, t5_span_corruption
from jaxlm.data.layouts import LAYOUTS, Row
from jaxlm.data.masking import TokenMasker
from jaxlm.data.packing import causal_example, sentence_order_pair
from jaxlm.data.spans import mask_words, span_mask

# rows and one generator per row -> the batch fields, stacked; row i depends on rows[i] and rngs[i] only
Transform = Callable[[list[Row], list[np.random.Generator]], dict]


def stack(examples: list[dict]) -> dict[str, np.ndarray]:
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def per_row(fn: Callable[[Row, np.random.Generator], dict]) -> Transform:
    """A transform of one row, applied row by row."""
    return lambda rows, rngs: stack([fn(row, rng) for row, rng in zip(rows, rngs)])


@dataclasses.dataclass(frozen=True)
class TransformOptions:
    """The data.* settings the transforms read (see configs and DataConfig)."""
    max_predictions: int = 20
    mask_prob: float = 0.15
    whole_word_masking: bool = False
    span_p: float = 0.2  # SpanBERT: geometric span lengths (in words), clipped at max_span
    max_span: int = 10
    target_length: int = 0  # encoder-decoders: decoder length; 0: max_seq_length
    noise_density: float = 0.15  # T5
    mean_span_length: float = 3.0
    mask_ratio: float = 0.3  # BART: share of tokens infilled, span lengths ~ Poisson(poisson_lambda)
    poisson_lambda: float = 3.0
    permute_sentences: bool = True


def options_from_config(data, model) -> dict:
    """`TransformOptions` fields from a DataConfig (and the model, for the decoder length)."""
    from jaxlm.objectives import target_length

    names = [f.name for f in dataclasses.fields(TransformOptions) if f.name != "target_length"]
    return {n: getattr(data, n) for n in names} | {"target_length": target_length(model, data)}


def word_starts(row: Row, table: np.ndarray) -> np.ndarray:
    """True where a token begins a word: by its piece, or because a stored sentence starts there."""
    starts = table[row.tokens]
    starts[row.sentence_starts[row.sentence_starts < len(starts)]] = True
    return starts


def make_transform(family: str, manifest: dict, word_start_table: np.ndarray | None,
                   options: TransformOptions = TransformOptions()) -> Transform:
    """The transform of `family` over rows prepared as `manifest` describes."""
    o, seq, special = options, manifest["max_seq_length"], manifest["special_ids"]
    layout = LAYOUTS[family]
    vocab_size = manifest["vocab_size"]
    # BERT never masks or draws its [PAD] [CLS] [SEP] [MASK] (and does draw [UNK])
    specials = tuple(sorted({special[k] for k in ("pad", "cls", "sep", "mask") if special[k] is not None}))
    mlm = dict(vocab_size=vocab_size, mask_id=special["mask"], special_ids=specials, max_seq_length=seq,
               max_predictions=o.max_predictions, mask_prob=o.mask_prob, pad_id=special["pad"])

    masker = TokenMasker(**mlm) if special["mask"] is not None else None

    def masked(tokens: list, len_a: list, rows: list[Row], rngs) -> dict:
        """Whole-word masking per row, or BERT's token masking vectorised over the batch."""
        if not o.whole_word_masking:
            return masker.batch(tokens, len_a, rngs)
        return stack([mask_words(t, word_starts(r._replace(tokens=t), word_start_table), rng, len_a=a, **mlm)
                      for t, a, r, rng in zip(tokens, len_a, rows, rngs)])

    if layout == "nsp_pairs":
        def transform(rows, rngs):
            out = masked([r.tokens for r in rows], [r.len_a for r in rows], rows, rngs)
            return out | {"nsp_label": np.array([r.label for r in rows], np.int32)}
    elif layout == "sop_pairs":
        def transform(rows, rngs):
            pairs = [sentence_order_pair(r.tokens[1:r.len_a - 1], r.tokens[r.len_a:-1], rng, cls_id=special["cls"],
                                         sep_id=special["sep"]) for r, rng in zip(rows, rngs)]
            out = masked([p[0] for p in pairs], [p[1] for p in pairs], rows, rngs)
            return out | {"nsp_label": np.array([p[2] for p in pairs], np.int32)}
    elif family == "spanbert":
        @per_row
        def transform(row, rng):
            return span_mask(row.tokens, word_starts(row, word_start_table), rng, p=o.span_p,
                             max_span=o.max_span, **mlm)
    elif layout == "sentence_rows":
        def transform(rows, rngs):
            out = masked([r.tokens for r in rows], [len(r.tokens) for r in rows], rows, rngs)
            del out["segment_ids"]  # one segment: RoBERTa and DistilBERT take no token types
            return out
    elif layout == "causal":
        @per_row
        def transform(row, rng):
            return causal_example(row.tokens, seq, special["eos"])
    elif layout == "t5_chunks":
        pad = special["pad"] if special["pad"] is not None else 0
        target = o.target_length or seq

        @per_row
        def transform(row, rng):
            return t5_span_corruption(row.tokens, rng, sentinel_ids=special["sentinels"], eos_id=special["eos"],
                                      noise_density=o.noise_density, mean_span_length=o.mean_span_length,
                                      max_seq_length=seq, max_target_length=target, pad_id=pad,
                                      decoder_start_id=pad)
    elif layout == "bart_rows":
        pad = special["pad"] if special["pad"] is not None else 0
        target = o.target_length or seq

        @per_row
        def transform(row, rng):
            inner = row.tokens[1:-1]
            if o.permute_sentences:
                bounds = np.append(row.sentence_starts - 1, len(inner))
                inner = permute_sentences([inner[s:e] for s, e in zip(bounds[:-1], bounds[1:])], rng)
            inputs = infill(inner, rng, mask_id=special["mask"], mask_ratio=o.mask_ratio,
                            poisson_lambda=o.poisson_lambda)
            return seq2seq_arrays(np.concatenate([row.tokens[:1], inputs, row.tokens[-1:]]), row.tokens, max_seq_length=seq,
                                  max_target_length=target, pad_id=pad, decoder_start_id=special["eos"])
    else:
        raise ValueError(f"no transform for model.family={family!r}")
    return transform
