"""A WordPiece tokenizer whose process dies (no exception, no cleanup: os._exit) when it meets a given
sentence: a Beam worker that crashes in the middle of a piece. Importable by the workers (tests/ on
PYTHONPATH)."""
import os

from jaxlm.data.tokenizers.load import load_tokenizer


class DyingTokenizer:
    def __init__(self, spec: str, fatal_sentence: str):
        self.inner, self.fatal_sentence = load_tokenizer(spec), fatal_sentence

    def encode_batch(self, sentences, add_special_tokens: bool = False):
        if self.fatal_sentence in sentences:
            os._exit(3)
        return self.inner.encode_batch(sentences, add_special_tokens)

    def __getattr__(self, name):
        return getattr(self.__getattribute__("inner"), name)
