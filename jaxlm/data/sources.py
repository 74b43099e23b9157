"""Names in a config resolved to real files: corpora (`demo:NAME` or paths) and the vocabulary."""
from __future__ import annotations

import pathlib

from jaxlm.config import ConfigError, DataConfig, RunConfig
from jaxlm.data import assets

DEMO_CORPORA = {"austen": assets.fetch_austen, "wikipedia": assets.fetch_wikipedia, "news": assets.fetch_news}
DEMO_VOCABS = {"bert-base-uncased": assets.bert_vocab_path}


def resolve_corpus(names: tuple[str, ...], fetch: bool = True) -> list[pathlib.Path]:
    """Each `demo:NAME` fetched into the cache; each other entry an existing, non-empty text file."""
    paths = []
    for name in names:
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


def resolve_vocab(config: DataConfig) -> pathlib.Path:
    if config.vocab in DEMO_VOCABS:
        return DEMO_VOCABS[config.vocab]()
    path = pathlib.Path(config.vocab).expanduser()
    if not path.is_file():
        raise ConfigError(f"vocabulary {path} does not exist; set data.vocab to a vocab.txt or one of "
                          f"{', '.join(DEMO_VOCABS)}")
    return path


def load_tokenizer(config: DataConfig):
    from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer

    return WordPieceTokenizer(resolve_vocab(config), lowercase=config.lowercase)


def model_tokenizer(config: RunConfig):
    """The run's tokenizer, after checking that its vocabulary fits the model's."""
    tokenizer = load_tokenizer(config.data)
    if tokenizer.vocab_size != config.model.vocab_size:
        raise ConfigError(f"the vocabulary has {tokenizer.vocab_size} tokens but model.vocab_size="
                          f"{config.model.vocab_size}; set model.vocab_size={tokenizer.vocab_size}")
    return tokenizer
