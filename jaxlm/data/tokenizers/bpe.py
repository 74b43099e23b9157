"""GPT-2's byte-level BPE from encoder.json + vocab.bpe (or HF's vocab.json + merges.txt), run by the
Rust `tokenizers` library.

"<|endoftext|>" in the input is ordinary text; its id is `eos_id`. Where the vocabulary has <s> and
</s> (RoBERTa's, BART's), `add_special_tokens=True` frames a text with them. tests/oracles/bpe.py is
an independent pure-Python encoder the tests hold it to.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from jaxlm.corpora.text import utf8_text
from jaxlm.data.tokenizers.rust import RustTokenizer
from jaxlm.jsonfile import read_json

EOS = "<|endoftext|>"


FILES_FIX = "give GPT-2's encoder.json and vocab.bpe, or Hugging Face's vocab.json and merges.txt"


def load_merges(path: str | Path) -> list[tuple[str, str]]:
    """The merges of a vocab.bpe (merges.txt), each two symbols; a ValueError names a line that is not."""
    merges = []
    for number, line in enumerate(utf8_text(path).splitlines(), 1):
        if line and not line.startswith("#version"):
            pair = tuple(line.split())
            if len(pair) != 2:
                raise ValueError(f"{path}:{number}: a merge is two symbols, got {line[:60]!r}; {FILES_FIX}")
            merges.append(pair)
    return merges


def load_encoder(path: Path) -> dict[str, int]:
    """An encoder.json (vocab.json): token -> id, holding the 256 byte symbols every text is spelt in (without
    one, the bytes it stands for would be dropped from the text)."""
    encoder = read_json(path)
    if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
        raise ValueError(f"{path} is not a byte-level BPE vocabulary (a JSON object of token: id); {FILES_FIX}")
    missing = sorted(set(pre_tokenizers.ByteLevel.alphabet()) - set(encoder))
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} of the 256 byte symbols of a byte-level BPE vocabulary "
                         f"(such as {missing[0]!r}); {FILES_FIX}")
    return encoder


class Gpt2Tokenizer(RustTokenizer):
    word_marker = "Ġ"

    def __init__(self, encoder: dict[str, int], merges: list[tuple[str, str]], files: tuple[Path, ...] = ()):
        self.encoder = encoder
        self.merges = merges
        self.eos_id = encoder.get(EOS)
        self.files = files
        backend = Tokenizer(BPE(vocab=encoder, merges=merges))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False)
        backend.decoder = decoders.ByteLevel()
        if "<s>" in encoder and "</s>" in encoder:
            backend.post_processor = processors.TemplateProcessing(
                single="<s> $A </s>", special_tokens=[("<s>", encoder["<s>"]), ("</s>", encoder["</s>"])])
        super().__init__(backend)
        self.mark_special_tokens()

    @classmethod
    def from_files(cls, encoder_json, vocab_bpe) -> "Gpt2Tokenizer":
        paths = (Path(encoder_json), Path(vocab_bpe))
        for path in paths:
            if not path.is_file():
                raise FileNotFoundError(f"GPT-2 tokenizer file not found: {path}")
        encoder, merges = load_encoder(paths[0]), load_merges(paths[1])
        for left, right in merges:
            missing = next((token for token in (left, right, left + right) if token not in encoder), None)
            if missing is not None:
                raise ValueError(f"{paths[1]}: the merge {left} {right} needs {missing!r}, which {paths[0]} lacks: "
                                 "the two files do not belong together; give the vocabulary and merges of one "
                                 "tokenizer")
        return cls(encoder, merges, paths)

    def fingerprint(self) -> str:
        h = hashlib.sha256(json.dumps(self.encoder, sort_keys=True).encode())
        h.update("\n".join(" ".join(m) for m in self.merges).encode())
        h.update(b"\0gpt2 byte-level bpe")
        return h.hexdigest()
