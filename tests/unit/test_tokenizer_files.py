"""A tokenizer file that is not what its name says (a .model that is no SentencePiece model, a tokenizer.json that
is not one, a vocab.txt that is not UTF-8) is refused where it is loaded, with one line naming it: `jaxlm tokenize`
and `jaxlm prepare` once ended in a library's traceback or its message alone. So is a byte-level BPE pair that is
not one."""
from pathlib import Path

import pytest

from jaxlm.cli import main
from jaxlm.corpora.models import gpt2_tokenizer_dir
from jaxlm.data.tokenizers.load import load_tokenizer

CONFIG = Path(__file__).parents[2] / "configs" / "bert-tiny.yaml"
SPM_FIX = "give a .model file trained by sentencepiece"
JSON_FIX = "give a tokenizer.json saved by the tokenizers library (Tokenizer.save)"
UTF8_FIX = "save the file as UTF-8"
# file name, its contents, and what follows its path in the error
BAD_FILES = {
    "binary .model": ("spiece.model", bytes(range(256)),
                      f" is not a SentencePiece model (could not parse ModelProto); {SPM_FIX}"),
    "text renamed .model": ("spiece.model", b"this is a text file\nnot a model\n",
                            f" is not a SentencePiece model (could not parse ModelProto); {SPM_FIX}"),
    "empty .model": ("spiece.model", b"", f" is not a SentencePiece model (unk is not defined); {SPM_FIX}"),
    "truncated tokenizer.json": ("tokenizer.json", b'{"version": "1.0", "model": {"type": "BPE", "vocab"',
                                 f" is not a tokenizers JSON file: EOF while parsing an object at line 1 column 51; "
                                 f"{JSON_FIX}"),
    "JSON that is no tokenizer": ("tokenizer.json", b'{"do_lower_case": true, "model_max_length": 512}\n',
                                  f' is not a tokenizers JSON file: it is JSON with no "model" section; {JSON_FIX}'),
    "a JSON list": ("tokenizer.json", b"[1, 2]\n", " is not a tokenizers JSON file: invalid type: sequence, expected "
                    f"struct Tokenizer at line 1 column 1; {JSON_FIX}"),
    "tokenizer.json not UTF-8": ("tokenizer.json", b'{"model": 1}\n\xff\n',
                                 f":2: not UTF-8 (byte 0 of the line: invalid start byte); {UTF8_FIX}"),
    "binary vocab.txt": ("vocab.txt", b"[UNK]\nab\xff\xfecd\nword\n",
                         f":2: not UTF-8 (byte 2 of the line: invalid start byte); {UTF8_FIX}"),
}


def write(directory: Path, name: str, contents: bytes) -> Path:
    """`contents` written to `directory`/`name`; the path."""
    path = directory / name
    path.write_bytes(contents)
    return path


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_tokenizer_file_is_refused_where_it_is_loaded(case, tmp_path):
    name, contents, error = BAD_FILES[case]
    path = write(tmp_path, name, contents)
    with pytest.raises(ValueError) as refused:
        load_tokenizer(path)
    assert str(refused.value) == f"{path}{error}"
    with pytest.raises(ValueError) as refused:  # the same file as a tokenizer directory holds it
        load_tokenizer(tmp_path)
    assert str(refused.value) == f"{path}{error}"


@pytest.mark.parametrize("case", ["binary .model", "truncated tokenizer.json", "JSON that is no tokenizer",
                                  "binary vocab.txt"])
def test_jaxlm_tokenize_says_in_one_line_which_tokenizer_file_is_bad(case, tmp_path, capsys):
    name, contents, error = BAD_FILES[case]
    path = write(tmp_path, name, contents)
    text = write(tmp_path, "input.txt", b"Hello world\n")
    assert main(["tokenize", "--tokenizer", str(path), "--input", str(text)]) == 2
    assert capsys.readouterr().err == f"jaxlm tokenize: error: {path}{error}\n"


@pytest.mark.parametrize("case", ["text renamed .model", "a JSON list", "binary vocab.txt"])
def test_jaxlm_prepare_says_in_one_line_which_tokenizer_file_is_bad(case, tmp_path, capsys):
    name, contents, error = BAD_FILES[case]
    path = write(tmp_path, name, contents)
    out = tmp_path / "prepared"
    assert main(["prepare", str(CONFIG), f"data.prepared_dir={out}", f"data.vocab={path}"]) == 2
    assert capsys.readouterr().err == f"jaxlm prepare: error: data.vocab: {path}{error}\n"
    assert not out.exists()


BPE_FIX = "give GPT-2's encoder.json and vocab.bpe, or Hugging Face's vocab.json and merges.txt"


@pytest.mark.parametrize("encoder, merges, bad, error", [
    # a list was an AttributeError's traceback
    (b"[1, 2]\n", b"#version\n", "encoder.json", " is not a byte-level BPE vocabulary (a JSON object of token: id)"),
    # accepted, and every text came out as no tokens at all
    (b"{}\n", b"\n", "encoder.json", " lacks 256 of the 256 byte symbols of a byte-level BPE vocabulary (such as '!')"),
    (None, b"#version\n\xc4\xa0 t\nx y z\n", "vocab.bpe", ":3: a merge is two symbols, got 'x y z'"),
])
def test_a_bad_byte_level_bpe_pair_is_refused_in_one_line(tmp_path, encoder, merges, bad, error):
    gpt2_encoder = (gpt2_tokenizer_dir() / "encoder.json").read_bytes()
    write(tmp_path, "encoder.json", gpt2_encoder if encoder is None else encoder)
    write(tmp_path, "vocab.bpe", merges)
    with pytest.raises(ValueError) as refused:
        load_tokenizer(tmp_path)
    assert str(refused.value) == f"{tmp_path / bad}{error}; {BPE_FIX}"
