"""Names in a config resolved to real inputs: corpora (`demo:NAME`, text or JSONL files, `tfds:`
datasets; `pieces.py` reads them) and the tokenizer (data.vocab) checked against the model."""
from __future__ import annotations

import pathlib

from jaxlm import families
from jaxlm.config import ConfigError, DataConfig, RunConfig
from jaxlm.corpora.download import cache_dir
from jaxlm.corpora.registry import CORPORA
from jaxlm.data.layouts import framed
from jaxlm.data.tokenizers import load
from jaxlm.data.tokenizers.roles import special_ids


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
        if path.is_dir():
            raise ConfigError(f"corpus file {path} is a directory; list its text (.txt) or JSON Lines files in "
                              "data.corpus")
        if not path.is_file():
            raise ConfigError(f"corpus file {path} does not exist; fix data.corpus")
        if path.stat().st_size == 0:
            raise ConfigError(f"corpus file {path} is empty; fix data.corpus")
        paths.append(path)
    first: dict = {}
    for k, path in enumerate(paths):
        j = first.setdefault(path if isinstance(path, str) else path.resolve(), k)
        if j != k:
            raise ConfigError(f"data.corpus lists {names[j]!r} and {names[k]!r}, one source twice: its documents "
                              "would be in the held-out split and in the train split; list it once")
    return paths


def tfds_dir(setting: str | None) -> str:
    """Where `tfds:` datasets are prepared: data.tfds_data_dir, or the jaxlm cache when it is empty."""
    return setting or str(cache_dir() / "tfds")


def resolve_vocab(config: DataConfig) -> pathlib.Path:
    """The file or directory data.vocab names (a packaged tokenizer's, fetched into the cache)."""
    path = load.tokenizer_path(config.vocab)
    if not path.exists():
        raise ConfigError(f"tokenizer {path} does not exist; set data.vocab to {load.SPEC_FORMS}")
    return path


def model_tokenizer(config: RunConfig):
    """The run's tokenizer (data.vocab, with data.lowercase for WordPiece and data.sentinels for
    SentencePiece; a SentencePiece model framing texts as the family's rows do), after checking that its
    vocabulary (and, where the model numbers positions after it, its pad id) fits the model's."""
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
    return framed(tokenizer, families.get(model.family).layout)
