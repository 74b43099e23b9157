"""Names in a config resolved to real inputs: corpora (`demo:NAME`, text or JSONL files, `tfds:`
datasets) read as documents of sentences, and the tokenizer."""
from __future__ import annotations

import json
import pathlib

from jaxlm.config import ConfigError, DataConfig, RunConfig
from jaxlm.data import assets

DEMO_CORPORA = {"austen": assets.fetch_austen, "wikipedia": assets.fetch_wikipedia, "news": assets.fetch_news,
                "kernel-docs": assets.fetch_kernel_docs, "python-docs": assets.fetch_python_docs}
DEMO_VOCABS = {"bert-base-uncased": assets.bert_vocab_path}
DEMO_SENTENCEPIECE = {"botchan-unigram-1000": "botchan_en_unigram_1000.model",
                      "botchan-bpe-1000": "botchan_en_bpe_1000.model"}
JSONL_SUFFIXES = (".jsonl", ".ndjson")


def resolve_corpus(names: tuple[str, ...], fetch: bool = True) -> list[pathlib.Path | str]:
    """Each `demo:NAME` fetched into the cache; each `tfds:` spec kept as it is; each other entry an
    existing, non-empty text or JSONL file."""
    paths: list[pathlib.Path | str] = []
    for name in names:
        if name.startswith("tfds:"):
            paths.append(name)
            continue
        if name.startswith("demo:"):
            key = name.removeprefix("demo:")
            if key not in DEMO_CORPORA:
                raise ConfigError(f"unknown demo corpus {name!r}; choose from "
                                  f"{', '.join('demo:' + k for k in DEMO_CORPORA)}")
            paths.append(DEMO_CORPORA[key]() if fetch else pathlib.Path(name))
            continue
        path = pathlib.Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"corpus file {path} does not exist; fix data.corpus")
        if path.stat().st_size == 0:
            raise ConfigError(f"corpus file {path} is empty; fix data.corpus")
        paths.append(path)
    return paths


def text_documents(path: pathlib.Path) -> list[list[str]]:
    """Documents of a sentence-per-line file; blank lines separate documents; empty ones dropped."""
    documents: list[list[str]] = [[]]
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                documents[-1].append(line)
            elif documents[-1]:
                documents.append([])
    return [d for d in documents if d]


def text_to_sentences(text: str) -> list[str]:
    """A document's text as sentences: each non-blank line split with `assets.split_sentences`."""
    return [s for line in text.splitlines() for s in assets.split_sentences(line)]


def jsonl_documents(path: pathlib.Path, text_field: str = "text") -> list[list[str]]:
    """One document per line of a JSON Lines file: the object's `text_field`, split into sentences."""
    documents = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not valid JSON ({err.msg}); JSONL needs one object per line") from None
            if not isinstance(record, dict) or text_field not in record:
                keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{path}:{number} has no {text_field!r} field (it has: {keys}); "
                                 "set data.text_field to the field holding the text")
            sentences = text_to_sentences(str(record[text_field]))
            if sentences:
                documents.append(sentences)
    return documents


def read_source(source: pathlib.Path | str, text_field: str = "text",
                tfds_data_dir: str | None = None) -> tuple[list[list[str]], dict]:
    """(documents, what a manifest records about the source) of one resolved corpus entry."""
    if isinstance(source, str) and source.startswith("tfds:"):
        from jaxlm.data.tfds_corpus import tfds_documents, tfds_fingerprint

        data_dir = tfds_data_dir or str(assets.cache_dir() / "tfds")
        return tfds_documents(source, data_dir, text_field), tfds_fingerprint(source, data_dir)
    path = pathlib.Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"input file(s) not found: {path}")
    documents = jsonl_documents(path, text_field) if path.suffix in JSONL_SUFFIXES else text_documents(path)
    return documents, {"path": str(path.resolve()), "bytes": path.stat().st_size}


def resolve_vocab(config: DataConfig) -> pathlib.Path:
    if config.vocab in DEMO_VOCABS:
        return DEMO_VOCABS[config.vocab]()
    path = pathlib.Path(config.vocab).expanduser()
    if not path.is_file():
        raise ConfigError(f"vocabulary {path} does not exist; set data.vocab to a vocab.txt or one of "
                          f"{', '.join(DEMO_VOCABS)}")
    return path


def load_tokenizer(config: DataConfig):
    """data.vocab as a tokenizer: a WordPiece vocab (packaged name or vocab.txt, with data.lowercase),
    `gpt2` or a directory of encoder.json + vocab.bpe, or a SentencePiece model (packaged name or
    .model path, with data.sentinels sentinel ids after its own)."""
    from jaxlm.data.tokenizers import tokenize_cli

    try:
        return tokenize_cli.load_tokenizer(config.vocab, lowercase=config.lowercase, sentinels=config.sentinels)
    except (OSError, ValueError) as err:
        raise ConfigError(f"data.vocab: {err}") from None


def model_tokenizer(config: RunConfig):
    """The run's tokenizer, after checking that its vocabulary (and, where the model numbers
    positions after it, its pad id) fits the model's."""
    from jaxlm.data.tokenizers.roles import special_ids

    tokenizer = load_tokenizer(config.data)
    model = config.model
    if tokenizer.vocab_size != model.vocab_size:
        raise ConfigError(f"the vocabulary has {tokenizer.vocab_size} tokens but model.vocab_size="
                          f"{model.vocab_size}; set model.vocab_size={tokenizer.vocab_size}")
    pad = special_ids(tokenizer)["pad"]
    if model.family == "roberta" and pad is not None and model.pad_token_id != pad:
        raise ConfigError(f"model.pad_token_id={model.pad_token_id} but the tokenizer's pad id is {pad}; RoBERTa "
                          f"numbers positions after the pad id: set model.pad_token_id={pad} and "
                          f"model.position_offset={pad + 1}")
    return tokenizer
