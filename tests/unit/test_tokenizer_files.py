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


@pytest.mark.parametrize("name, pair", [("encoder.json", "encoder.json and vocab.bpe"),
                                        ("vocab.bpe", "encoder.json and vocab.bpe"),
                                        ("vocab.json", "vocab.json and merges.txt"),
                                        ("merges.txt", "vocab.json and merges.txt")])
def test_one_file_of_a_byte_level_bpe_pair_asks_for_its_directory(name, pair, tmp_path, capsys):
    """encoder.json was "not a tokenizers JSON file", vocab.bpe an "unknown tokenizer", and merges.txt a WordPiece
    vocab that "has no [UNK] token"."""
    gpt2 = gpt2_tokenizer_dir()
    path = tmp_path / name
    path.write_bytes((gpt2 / ("encoder.json" if name.endswith(".json") else "vocab.bpe")).read_bytes())
    text = write(tmp_path, "input.txt", b"Hello world\n")
    assert main(["tokenize", "--tokenizer", str(path), "--input", str(text)]) == 2
    assert capsys.readouterr().err == (f"jaxlm tokenize: error: {path} is one file of a byte-level BPE pair; give the "
                                       f"directory that holds both {pair}\n")
    path.unlink()  # a name mistyped, of no file: said as such
    assert main(["tokenize", "--tokenizer", str(path), "--input", str(text)]) == 2
    assert "file not found: " in capsys.readouterr().err


def test_a_vocab_and_merges_of_two_tokenizers_are_refused_in_one_line(tmp_path):
    """A merge of symbols the vocabulary lacks was the tokenizers library's "Error while initializing BPE"."""
    vocab = write(tmp_path, "vocab.json", (gpt2_tokenizer_dir() / "encoder.json").read_bytes())
    merges = write(tmp_path, "merges.txt", "#version: 0.2\n\u0120 t\nzzz qqq\n".encode())
    with pytest.raises(ValueError) as refused:
        load_tokenizer(tmp_path)
    assert str(refused.value) == (f"{merges}: the merge zzz qqq needs 'zzz', which {vocab} lacks: the two files do not "
                                  "belong together; give the vocabulary and merges of one tokenizer")
    merges.write_text("#version: 0.2\n\u0120the \u0120the\n", encoding="utf-8")  # two tokens, merged into none
    with pytest.raises(ValueError, match="the merge \u0120the \u0120the needs '\u0120the\u0120the', which"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("config, error", [
    ("[1, 2]", ' is not a JSON object; give settings such as {"do_lower_case": true}'),  # was an AttributeError
    ('{"do_lower_case": "no"}', ': do_lower_case is "no"; give true or false'),  # these three were TypeErrors
    ('{"strip_accents": 1}', ": strip_accents is 1; give true, false or null (as do_lower_case)"),
])
def test_a_bad_tokenizer_config_next_to_a_vocab_txt_is_refused_in_one_line(config, error, tmp_path):
    write(tmp_path, "vocab.txt", b"[UNK]\nhello\n")
    path = write(tmp_path, "tokenizer_config.json", config.encode())
    with pytest.raises(ValueError) as refused:
        load_tokenizer(tmp_path)
    assert str(refused.value) == f"{path}{error}"


def test_a_tokenizer_config_may_leave_strip_accents_and_do_lower_case_null(tmp_path):
    """As transformers' BertTokenizer: null strips accents where it lower-cases; a null do_lower_case is the
    default (lower-case)."""
    write(tmp_path, "vocab.txt", "[UNK]\ncafe\ncafé\nCafé\n".encode())
    for lowercase, pieces in (("true", ["cafe"]), ("false", ["Café"]), ("null", ["cafe"])):
        write(tmp_path, "tokenizer_config.json", f'{{"do_lower_case": {lowercase}, "strip_accents": null}}'.encode())
        tokenizer = load_tokenizer(tmp_path)
        assert [tokenizer.backend.id_to_token(i) for i in tokenizer.encode("Café")] == pieces


@pytest.mark.parametrize("name, fix", [("myvocab", "myvocab.txt"), ("myvocab.json", "myvocab.txt"),
                                       ("merges.txt", "vocab.txt"), ("vocab.json", "vocab.txt")])
def test_tokenizer_train_refuses_an_output_the_loader_would_not_read_back(name, fix, tmp_path, capsys):
    """It trained and wrote a vocab that `jaxlm tokenize` then called an unknown tokenizer (or not tokenizers JSON)."""
    text = write(tmp_path, "input.txt", b"the cat sat on the mat\n" * 20)
    output = tmp_path / name
    assert main(["tokenizer", "train", "--input", str(text), "--vocab-size", "100", "--output", str(output)]) == 2
    why = ("would be read back as one file of a byte-level BPE pair" if name in ("merges.txt", "vocab.json") else
           "would not be read back as a WordPiece vocab, which is a .txt file")
    error = f"--output {output} {why}; name it {tmp_path / fix}"
    assert capsys.readouterr().err == f"jaxlm tokenizer train: error: {error}\n"
    assert not output.exists()


def test_a_cased_vocabulary_read_lower_cased_is_named(tmp_path, capsys):
    """`tokenizer train --cased` then `tokenize` without --cased split "Emma" as e ##m ##m ##a without a word: the
    vocabulary's capitalised tokens can never come out of lower-cased text."""
    from jaxlm.corpora.registry import fetch_austen
    corpus = write(tmp_path, "austen.txt", fetch_austen().read_bytes()[:400_000])
    vocab = tmp_path / "cased" / "vocab.txt"
    assert main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "2000", "--output", str(vocab),
                 "--cased"]) == 0
    line = write(tmp_path, "line.txt", b"Emma Woodhouse, handsome, clever, and rich.\n")
    capsys.readouterr()
    assert main(["tokenize", "--tokenizer", str(vocab), "--input", str(line), "--pieces"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxlm tokenize: error: WordPiece vocab {vocab} is cased (") and err.endswith(
        "but is read lower-cased, which never produces them: read it cased (data.lowercase=false; --cased)\n"), err
    assert main(["tokenize", "--tokenizer", str(vocab), "--input", str(line), "--pieces", "--cased"]) == 0
    assert capsys.readouterr().out.startswith("Emma ")
