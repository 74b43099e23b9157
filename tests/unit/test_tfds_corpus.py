"""TFDS corpora: the demo builder (jaxlm.corpora.tfds_builder) and `tfds:` sources (jaxlm.data.tfds_source):
foreign datasets, bad specs; labelled TFDS datasets read as fine-tuning records (jaxlm.finetune.data)."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxlm.corpora import tfds_builder
from jaxlm.corpora.registry import CORPORA, fetch_austen
from jaxlm.data import tfds_source
from jaxlm.finetune.data import read_records

tfds = pytest.importorskip("tensorflow_datasets")

PARAGRAPHS = [
    "First paragraph. It has two sentences.\n\nSecond paragraph, one line.",
    "A single line. Split into sentences! By split_sentences? Yes.",
    "",  # empty texts are skipped
    "Caf\u00e9 na\u00efvet\u00e9 \u2014 unicode survives.\n\n\nAfter two blank lines.\n",
]
PARAGRAPH_DOCUMENTS = [
    ["First paragraph. It has two sentences.", "Second paragraph, one line."],
    ["A single line.", "Split into sentences!", "By split_sentences?", "Yes."],
    ["Caf\u00e9 na\u00efvet\u00e9 \u2014 unicode survives.", "After two blank lines."],
]


class JaxlmTestParagraphs(tfds.core.GeneratorBasedBuilder):
    """A foreign dataset: one `text` of paragraphs per example."""

    VERSION = tfds.core.Version("1.0.0")
    code_path = None  # TFDS 4.9.10 needs importlib_resources for it under a package (not installed)

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "label": np.int64}), disable_shuffling=True)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(PARAGRAPHS), "test": self._generate_examples(PARAGRAPHS[:1])}

    def _generate_examples(self, texts):
        for index, text in enumerate(texts):
            yield index, {"text": text, "label": index}


class JaxlmTestContent(JaxlmTestParagraphs):
    """Its text is in `content`."""

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"content": tfds.features.Text(), "label": np.int64}), disable_shuffling=True)

    def _generate_examples(self, texts):
        for index, text in enumerate(texts):
            yield index, {"content": text, "label": index}


class JaxlmTestLabelled(tfds.core.GeneratorBasedBuilder):
    """Labelled data as TFDS datasets hold it: class labels as ClassLabel ids, alone and per word."""

    VERSION = tfds.core.Version("1.0.0")
    code_path = None

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "sentence": tfds.features.Text(), "label": tfds.features.ClassLabel(names=["negative", "positive"]),
            "meta": {"score": np.float32},
            "tokens": tfds.features.Sequence(tfds.features.Text()),
            "ner": tfds.features.Sequence(tfds.features.ClassLabel(names=["O", "B-person", "I-person"]))}),
            disable_shuffling=True)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(LABELLED), "test": self._generate_examples(LABELLED[:1])}

    def _generate_examples(self, records):
        for index, (sentence, label, tokens, tags) in enumerate(records):
            yield index, {"sentence": sentence, "label": label, "meta": {"score": index / 2},
                          "tokens": tokens, "ner": tags}


LABELLED = [("Ann Lee liked it.", "positive", ["Ann", "Lee", "liked", "it."], ["B-person", "I-person", "O", "O"]),
            ("Dull.", "negative", ["Dull."], ["O"]),
            ("Bob did not.", "negative", ["Bob", "did", "not."], ["B-person", "O", "O"])]


class JaxlmTestNotUtf8(JaxlmTestParagraphs):
    """Its second record's text is not UTF-8 (Latin-1)."""

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(["A good record. It reads.", "Caf\u00e9 in Latin-1.".encode("latin-1"),
                                                  "Another good one."])}


class JaxlmTestUnprepared(JaxlmTestParagraphs):
    """Registered, never prepared."""


def read_documents(path: pathlib.Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8")
    return [block.split("\n") for block in text.strip("\n").split("\n\n")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("tfds")
    tfds_builder.build_demo("austen", directory)
    for cls in (JaxlmTestParagraphs, JaxlmTestContent, JaxlmTestLabelled, JaxlmTestNotUtf8):
        cls(data_dir=directory, file_format="array_record").download_and_prepare()
    return directory


def test_import_does_not_load_tfds():
    code = ("import sys, jaxlm.data.tfds_source as ts; ts.parse_tfds_spec('tfds:a/b'); "
            "assert 'tensorflow_datasets' not in sys.modules, 'tfds imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("spec, expected", [
    ("tfds:jaxlm_demo_corpus/austen", ("jaxlm_demo_corpus/austen", "train")),
    ("tfds:mnist", ("mnist", "train")),
    ("tfds:my_dataset/config@1.0.0:train", ("my_dataset/config:1.0.0", "train")),
    ("tfds:my_dataset@2.1.0:validation", ("my_dataset:2.1.0", "validation")),
    ("tfds:wiki/en:train[:90%]", ("wiki/en", "train[:90%]")),
    ("tfds:wiki:train[10:20]+test", ("wiki", "train[10:20]+test")),
])
def test_parse_tfds_spec(spec, expected):
    assert tfds_source.parse_tfds_spec(spec) == expected


@pytest.mark.parametrize("spec, message", [
    ("demo:austen", "expected tfds:NAME"),
    ("tfds:", "expected tfds:NAME"),
    ("tfds:a/b/c", "expected tfds:NAME"),
    ("tfds:wiki:", "empty split"),
    ("tfds:wiki/en:1.0.0", "write the version with @"),
])
def test_parse_tfds_spec_rejects(spec, message):
    with pytest.raises(ValueError, match=message):
        tfds_source.parse_tfds_spec(spec)


def test_demo_corpus_round_trip(data_dir):
    expected = read_documents(fetch_austen())
    assert tfds_source.tfds_documents("tfds:jaxlm_demo_corpus/austen", data_dir) == expected
    source = tfds.data_source("jaxlm_demo_corpus/austen", split="train", data_dir=data_dir, download=False)
    assert [int(source[i]["id"]) for i in (0, len(source) - 1)] == [0, len(expected) - 1]
    assert "tensorflow" not in sys.modules
    info = json.loads((data_dir / "jaxlm_demo_corpus/austen/1.0.0/dataset_info.json").read_text())
    assert info["fileFormat"] == "array_record"
    assert info["redistributionInfo"]["license"] == CORPORA["austen"].licence
    assert tfds_source.tfds_fingerprint("tfds:jaxlm_demo_corpus/austen:train[:100]", data_dir) == {
        "source": "tfds", "spec": "tfds:jaxlm_demo_corpus/austen:train[:100]",
        "name": "jaxlm_demo_corpus", "config": "austen", "version": "1.0.0",
        "full_name": "jaxlm_demo_corpus/austen/1.0.0", "split": "train[:100]",
        "num_examples": 100, "file_format": "array_record",
        "data_dir": str(data_dir / "jaxlm_demo_corpus/austen/1.0.0"),
    }
    shard = next((data_dir / "jaxlm_demo_corpus/austen/1.0.0").glob("*.array_record-*"))
    before = shard.stat().st_mtime_ns
    tfds_builder.build_demo("austen", data_dir)  # already built: untouched
    assert shard.stat().st_mtime_ns == before


def test_foreign_dataset(data_dir):
    assert tfds_source.tfds_documents("tfds:jaxlm_test_paragraphs", data_dir) == PARAGRAPH_DOCUMENTS
    assert tfds_source.tfds_documents("tfds:jaxlm_test_paragraphs@1.0.0:train[:2]", data_dir) == PARAGRAPH_DOCUMENTS[:2]
    assert tfds_source.tfds_documents("tfds:jaxlm_test_paragraphs:test", data_dir) == PARAGRAPH_DOCUMENTS[:1]
    assert tfds_source.tfds_documents("tfds:jaxlm_test_content", data_dir, text_field="content") == PARAGRAPH_DOCUMENTS
    assert tfds_source.tfds_fingerprint("tfds:jaxlm_test_content:train+test", data_dir)["num_examples"] == 5


def test_foreign_dataset_read_from_files_alone(data_dir):
    """A fresh process that never imports the builder reads the prepared files."""
    code = ("import sys, jaxlm.data.tfds_source as ts; "
            f"print(len(ts.tfds_documents('tfds:jaxlm_test_paragraphs', {str(data_dir)!r})))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == str(len(PARAGRAPH_DOCUMENTS))


def test_text_field_errors(data_dir):
    with pytest.raises(ValueError, match=r"no feature 'text'; its features are: content, label\. Set data\.text_field"):
        tfds_source.tfds_documents("tfds:jaxlm_test_content", data_dir)
    with pytest.raises(ValueError, match=r"'label' .* not a single text"):
        tfds_source.tfds_documents("tfds:jaxlm_test_content", data_dir, text_field="label")


def test_missing_datasets_and_splits(data_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="neither registered nor prepared.* point data.tfds_data_dir at the "):
        tfds_source.tfds_documents("tfds:jaxlm_no_such_dataset", data_dir)
    with pytest.raises(FileNotFoundError, match=r"not prepared in .*file_format='array_record'.*, or point "
                                                r"data\.tfds_data_dir at where it was prepared\.$"):
        tfds_source.tfds_documents("tfds:jaxlm_test_unprepared", data_dir)
    with pytest.raises(ValueError, match=r"no split 'validation'; its splits are: test, train"):
        tfds_source.tfds_documents("tfds:jaxlm_test_paragraphs:validation", data_dir)
    with pytest.raises(ValueError, match="bad split"):
        tfds_source.tfds_documents("tfds:jaxlm_test_paragraphs:train[:x]", data_dir)
    # our demo corpus: bad config, split or field fail before anything is built
    with pytest.raises(ValueError, match="unknown jaxlm_demo_corpus config 'poems'; choose one of: austen"):
        tfds_source.tfds_documents("tfds:jaxlm_demo_corpus/poems", tmp_path)
    with pytest.raises(ValueError, match="no split 'validation'; its splits are: train"):
        tfds_source.tfds_documents("tfds:jaxlm_demo_corpus/austen:validation", tmp_path)
    with pytest.raises(ValueError, match="jaxlm_demo_corpus/kernel_docs has no split 'test'"):
        tfds_source.tfds_documents("tfds:jaxlm_demo_corpus/kernel-docs:test", tmp_path)
    with pytest.raises(ValueError, match="its features are: text, id"):
        tfds_source.tfds_documents("tfds:jaxlm_demo_corpus/austen", tmp_path, text_field="body")
    assert not (tmp_path / "jaxlm_demo_corpus").exists()


def test_demo_configs_are_the_registry(tmp_path):
    configs = [c.name for c in tfds_builder.demo_builder_class().BUILDER_CONFIGS]
    assert configs == [c.tfds_config for c in CORPORA.values()]
    assert all(tfds_builder.demo_config(c.name) == tfds_builder.demo_config(c.tfds_config) == c.tfds_config
               for c in CORPORA.values())
    with pytest.raises(ValueError, match="unknown jaxlm_demo_corpus config 'poems'; choose one of: austen, "):
        tfds_builder.build_demo("poems", tmp_path)


def test_tfrecord_dataset_is_refused(data_dir, tmp_path):
    """TFDS cannot write tfrecord without TensorFlow: relabel a prepared copy as tfrecord."""
    import shutil

    shutil.copytree(data_dir / "jaxlm_test_paragraphs", tmp_path / "jaxlm_test_paragraphs")
    info_path = tmp_path / "jaxlm_test_paragraphs/1.0.0/dataset_info.json"
    info = json.loads(info_path.read_text())
    info["fileFormat"] = "tfrecord"
    info_path.write_text(json.dumps(info))
    with pytest.raises(ValueError, match=r"prepared in the tfrecord file format.*file_format='array_record'"):
        tfds_source.tfds_documents("tfds:jaxlm_test_paragraphs", tmp_path)


def test_labelled_dataset_gives_fine_tuning_records_with_label_names(data_dir):
    roles = {"text": "sentence", "label": "label", "words": "tokens", "tags": "ner", "score": "meta.score"}
    records = read_records("tfds:jaxlm_test_labelled", roles, ("text", "label"), tfds_data_dir=data_dir)
    assert records == [{"text": s, "label": label, "words": words, "tags": tags, "score": i / 2}
                       for i, (s, label, words, tags) in enumerate(LABELLED)]
    assert read_records("tfds:jaxlm_test_labelled:train[1:]", roles, ("text",), tfds_data_dir=data_dir) == records[1:]
    with pytest.raises(ValueError, match=r"^finetune.dev: tfds:jaxlm_test_labelled:validation: .* has no split "
                                         r"'validation'; its splits are: test, train"):
        read_records("tfds:jaxlm_test_labelled:validation", roles, ("text",), "finetune.dev", data_dir)
    with pytest.raises(ValueError, match=r"^--input: tfds:jaxlm_test_labelled example 1: no field 'text' .*"
                                         r"set finetune.fields.text"):
        read_records("tfds:jaxlm_test_labelled", {"text": "text"}, ("text",), "--input", data_dir)


def test_a_record_that_is_not_utf8_is_named_and_fatal_or_skipped(data_dir, tmp_path, capsys):
    """A TFDS text that is not UTF-8 was a UnicodeDecodeError naming no record, data.undecodable=skip or not."""
    from jaxlm.data.prepare import prepare
    from jaxlm.data.tokenizers.load import load_tokenizer

    spec = "tfds:jaxlm_test_not_utf8"
    where = (f"{spec}: record 1 of jaxlm_test_not_utf8/1.0.0, split train: not UTF-8 (byte 3 of its 'text': invalid "
             "continuation byte)")
    with pytest.raises(ValueError) as refused:
        tfds_source.tfds_documents(spec, data_dir)
    assert str(refused.value) == f"{where}; fix the dataset, or set data.undecodable=skip to leave such records out"
    told = []
    assert list(tfds_source.tfds_range_documents(spec, data_dir, undecodable="skip", warn=told.append)) == [
        ["A good record.", "It reads."], ["Another good one."]]
    assert told == [f"warning: {where}; record left out (data.undecodable=skip)"]
    manifest = prepare([spec], tmp_path / "out", load_tokenizer("bert-base-uncased"), tfds_data_dir=str(data_dir),
                       undecodable="skip", valid_fraction=0.3, progress=False)
    assert sum(split["documents"] for split in manifest["splits"].values()) == 2
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")] == told
    with pytest.raises(ValueError) as refused:  # as fine-tuning records: a UnicodeDecodeError naming no example
        read_records(spec, {"text": "text"}, ("text",), "finetune.train", data_dir)
    assert str(refused.value) == (f"finetune.train: {spec} example 2: not UTF-8 (byte 3 of its 'text': invalid "
                                  "continuation byte); fix the dataset")
