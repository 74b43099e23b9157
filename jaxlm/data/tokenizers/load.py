"""The one tokenizer resolver: a spec (packaged name, vocab file, model file, tokenizer directory)
to a tokenizer, for `jaxlm prepare`/`train` (data.vocab), `tokenize`, `embed` and `generate`."""
from __future__ import annotations

import json
from pathlib import Path

from jaxlm.corpora.models import PACKAGED_TOKENIZERS
from jaxlm.data.tokenizers.bpe import Gpt2Tokenizer
from jaxlm.data.tokenizers.rust import RustTokenizer
from jaxlm.data.tokenizers.spm import SentencePieceTokenizer
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer
from jaxlm.jsonfile import read_json

BPE_FILES = (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt"))  # GPT-2's names, Hugging Face's
BPE_PAIR_OF = {name: pair for pair in BPE_FILES for name in pair}
SPEC_FORMS = (f"a packaged name ({', '.join(PACKAGED_TOKENIZERS)}), a WordPiece vocab.txt, a SentencePiece "
              ".model, a tokenizer.json, or a directory holding tokenizer.json, vocab.txt (with "
              "tokenizer_config.json's do_lower_case), spiece.model, encoder.json + vocab.bpe or vocab.json + "
              "merges.txt (byte-level BPE), taken in that order")
# a lone tokenizer file's suffix, as `load_tokenizer` reads it -> its name in a tokenizer directory
NAME_IN_A_DIRECTORY = {".txt": "vocab.txt", ".model": "spiece.model", ".json": "tokenizer.json"}


def tokenizer_path(spec) -> Path:
    """The file or directory `spec` names: a packaged tokenizer's, fetched into the cache, or the path."""
    spec = str(spec)
    if spec in PACKAGED_TOKENIZERS:
        return PACKAGED_TOKENIZERS[spec]()
    return Path(spec).expanduser()


def load_tokenizer(spec, lowercase: bool = True, sentinels: int = 0):
    """The tokenizer `spec` names (see SPEC_FORMS). `lowercase` applies to WordPiece (a directory's
    tokenizer_config.json overrides it), `sentinels` (T5's extra ids) to SentencePiece."""
    if not str(spec).strip():  # it was the working directory
        raise ValueError(f"the tokenizer is empty; a tokenizer is {SPEC_FORMS}")
    path = tokenizer_path(spec)
    if path.is_dir():
        return _from_directory(path, lowercase, sentinels)
    if path.name in BPE_PAIR_OF and path.is_file():
        raise ValueError(f"{path} is one file of a byte-level BPE pair; give the directory that holds both "
                         f"{' and '.join(BPE_PAIR_OF[path.name])}")
    if not path.exists() and (path.suffix or "/" in str(spec)):
        raise FileNotFoundError(f"tokenizer file not found: {path}; a tokenizer is {SPEC_FORMS}")
    if path.suffix == ".model":
        return SentencePieceTokenizer(path, sentinels=sentinels)
    if path.suffix == ".json":
        return RustTokenizer.from_file(path)
    if path.suffix == ".txt":
        return WordPieceTokenizer(path, lowercase=lowercase)
    raise ValueError(f"unknown tokenizer {str(spec)!r}; a tokenizer is {SPEC_FORMS}")


def _from_directory(path: Path, lowercase: bool, sentinels: int):
    if (path / "tokenizer.json").is_file():
        return RustTokenizer.from_file(path / "tokenizer.json")
    if (path / "vocab.txt").is_file():
        lowercase, strip_accents = _wordpiece_settings(path / "tokenizer_config.json", lowercase)
        return WordPieceTokenizer(path / "vocab.txt", lowercase=lowercase, strip_accents=strip_accents)
    if (path / "spiece.model").is_file():
        return SentencePieceTokenizer(path / "spiece.model", sentinels=sentinels)
    for encoder, merges in BPE_FILES:
        if (path / encoder).is_file() and (path / merges).is_file():
            return Gpt2Tokenizer.from_files(path / encoder, path / merges)
    if (path / "tokenizer").is_dir():  # a converted checkpoint's (jaxlm.convert.store.TOKENIZER_DIR)
        raise FileNotFoundError(f"tokenizer directory {path} holds no tokenizer files; a jaxlm checkpoint keeps its "
                                f"tokenizer in {path / 'tokenizer'}: give that directory")
    raise FileNotFoundError(f"tokenizer directory {path} holds no tokenizer files; a tokenizer is {SPEC_FORMS}")


def _wordpiece_settings(path: Path, lowercase: bool) -> tuple[bool, bool | None]:
    """(do_lower_case, strip_accents) of a tokenizer_config.json, as transformers' BertTokenizer takes them: a
    boolean (null or absent: `lowercase`), and a boolean or null (null: strip accents where it lower-cases)."""
    if not path.is_file():
        return lowercase, None
    settings = read_json(path)
    if not isinstance(settings, dict):
        raise ValueError(f"{path} is not a JSON object; give settings such as {{\"do_lower_case\": true}}")
    given = settings.get("do_lower_case")
    lowercase, strip_accents = lowercase if given is None else given, settings.get("strip_accents")
    if not isinstance(lowercase, bool):
        raise ValueError(f"{path}: do_lower_case is {json.dumps(lowercase)}; give true or false")
    if not isinstance(strip_accents, bool | None):
        raise ValueError(f"{path}: strip_accents is {json.dumps(strip_accents)}; give true, false or null (as "
                         "do_lower_case)")
    return lowercase, strip_accents
