"""DataConfig: every data setting, its default and its range, written once; prepare, layouts and transforms
read it."""
from __future__ import annotations

import dataclasses

# The settings that decide the stored rows: a manifest records them and prepared data must match them.
PREPARATION_FIELDS = ("max_seq_length", "short_seq_prob", "dupe_factor", "packed", "noise_density",
                      "mean_span_length", "valid_fraction", "seed", "shard_size", "text_field",
                      "undecodable")
UNDECODABLE = ("fail", "skip")  # data.undecodable: stop at a line that is not UTF-8, naming it, or leave it out
# settings that are shares of something: (name, whether 0 is allowed, whether 1 is)
SHARES = (("mask_prob", False, True), ("short_seq_prob", True, True), ("span_p", False, True),
          ("noise_density", False, False), ("mask_ratio", True, True), ("valid_fraction", False, False))
# settings that count or measure something: their least value and what it counts
MINIMUMS = {
    "max_seq_length": (5, "a row's tokens, [CLS] A [SEP] B [SEP] at the least"),
    "max_predictions": (1, "the masked slots of a row"),
    "max_target_length": (0, "the decoder's tokens; 0: the objective's own length"),
    "sentinels": (0, "the extra ids appended to a SentencePiece vocabulary"),
    "dupe_factor": (1, "the passes over the corpus that BERT and ALBERT pair sentences in, each paired afresh"),
    "shard_size": (1, "the rows of a stored shard"),
    "max_span": (1, "SpanBERT's longest span, in words"),
    "mean_span_length": (1, "T5's mean noise span, in tokens"),
    "seed": (0, "the seed of the split, the shuffles and the masks"),
    "poisson_lambda": (0.01, "BART's mean span length (below it nearly every span drawn is empty, and a row draws "
                             "about mask_ratio x max_seq_length / poisson_lambda of them)"),
}
# settings that must be above zero: what they measure
ABOVE_ZERO = {"piece_mb": "the megabytes of text tokenized as one unit"}


@dataclasses.dataclass(frozen=True)
class DataConfig:
    # demo:NAME, sentence-per-line .txt files, .jsonl files (data.text_field), tfds:NAME[:SPLIT]
    corpus: tuple[str, ...] = ("demo:austen", "demo:wikipedia")
    text_field: str = "text"
    undecodable: str = "fail"  # a corpus line that is not UTF-8: fail (naming file and line) or skip it
    tfds_data_dir: str = ""  # "": the jaxlm cache
    prepared_dir: str = "data/prepared"
    # tokenizer: a WordPiece vocab (bert-base-uncased or a vocab.txt), gpt2 or an encoder.json +
    # vocab.bpe directory, a SentencePiece .model (or botchan-unigram-1000) with `sentinels` extra ids
    vocab: str = "bert-base-uncased"
    lowercase: bool = True
    sentinels: int = 0
    max_seq_length: int = 128
    max_predictions: int = 20
    # encoder-decoders: decoder (target) length; 0: T5's exact length for span corruption, else max_seq_length
    max_target_length: int = 0
    mask_prob: float = 0.15
    whole_word_masking: bool = False
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    packed: bool = True  # causal LM: pack documents into rows (false: one document per row)
    span_p: float = 0.2  # SpanBERT span lengths ~ Geometric(span_p) words, clipped at max_span
    max_span: int = 10
    noise_density: float = 0.15  # T5 span corruption
    mean_span_length: float = 3.0
    mask_ratio: float = 0.3  # BART text infilling, span lengths ~ Poisson(poisson_lambda)
    poisson_lambda: float = 3.0
    permute_sentences: bool = True
    valid_fraction: float = 0.05
    shard_size: int = 20000
    piece_mb: float = 16.0  # text tokenized as one unit (by one Beam worker; kept when a run is interrupted)
    seed: int = 12345
    # the input pipeline (grain): 0 builds batches in a background thread, N in N worker processes (at most
    # the cores the run may use)
    workers: int = 0


def data_settings(data: DataConfig | None = None, **overrides) -> DataConfig:
    """`data` (default: the defaults) with `overrides`, which must name DataConfig fields."""
    data = data or DataConfig()
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(DataConfig)})
    if unknown:
        raise TypeError(f"unknown data setting(s) {', '.join(unknown)}; see jaxlm.data.settings.DataConfig")
    return dataclasses.replace(data, **overrides)


def check_data(data: DataConfig) -> None:
    """ValueError naming the first data setting out of its range or choices, and what it should be."""
    for name, (least, meaning) in MINIMUMS.items():
        if getattr(data, name) < least:
            raise ValueError(f"data.{name}={getattr(data, name):g} must be {least} or more: {meaning}")
    for name, meaning in ABOVE_ZERO.items():
        if not getattr(data, name) > 0:
            raise ValueError(f"data.{name}={getattr(data, name):g} must be above 0: {meaning}")
    for name, zero_allowed, one_allowed in SHARES:
        value = getattr(data, name)
        if not 0 <= value <= 1 or (value == 0 and not zero_allowed) or (value == 1 and not one_allowed):
            interval = f"{'[' if zero_allowed else '('}0, 1{']' if one_allowed else ')'}"
            raise ValueError(f"data.{name}={value:g} must lie in {interval}")
    if data.workers < 0:
        raise ValueError(f"data.workers={data.workers}: use 0 (batches built in a background thread) or a number "
                         "of worker processes")
    if data.undecodable not in UNDECODABLE:
        raise ValueError(f"data.undecodable={data.undecodable!r}; choose fail (stop at a line that is not UTF-8, "
                         "naming it) or skip (leave such lines out)")
    if not data.prepared_dir.strip():  # it was the working directory
        raise ValueError("data.prepared_dir is empty; name the directory of the prepared rows (e.g. data/prepared)")
