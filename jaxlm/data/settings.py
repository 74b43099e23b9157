"""DataConfig: every data setting and its default, written once; prepare, layouts and transforms read it."""
from __future__ import annotations

import dataclasses

# The settings that decide the stored rows: a manifest records them and prepared data must match them.
PREPARATION_FIELDS = ("max_seq_length", "short_seq_prob", "dupe_factor", "packed", "noise_density",
                      "mean_span_length", "valid_fraction", "seed", "shard_size", "text_field",
                      "undecodable")


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
    # the input pipeline (grain): 0 builds batches in a background thread, N in N worker processes
    workers: int = 0


def data_settings(data: DataConfig | None = None, **overrides) -> DataConfig:
    """`data` (default: the defaults) with `overrides`, which must name DataConfig fields."""
    data = data or DataConfig()
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(DataConfig)})
    if unknown:
        raise TypeError(f"unknown data setting(s) {', '.join(unknown)}; see jaxlm.data.settings.DataConfig")
    return dataclasses.replace(data, **overrides)
