"""Fine-tuning's record readers: JSONL, CSV and TSV files with renamed and nested fields, `[:N]` slices,
the named real datasets, and a one-line error naming file, line and field for each kind of bad input."""
import json
import re

import pytest

from jaxlm.finetune.data import check_answers, check_choices, check_tag_lengths, label_list, read_records

ROLES = {"text": "sentence", "label": "gold"}


def test_jsonl_csv_and_tsv_give_the_same_records(tmp_path):
    rows = [{"sentence": "a fine film", "gold": "positive"}, {"sentence": "dull, and long", "gold": "negative"}]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (tmp_path / "x.csv").write_text('sentence,gold\na fine film,positive\n"dull, and long",negative\n')
    (tmp_path / "x.tsv").write_text("gold\tsentence\npositive\ta fine film\nnegative\tdull, and long\n")
    expected = [{"text": "a fine film", "label": "positive"}, {"text": "dull, and long", "label": "negative"}]
    for suffix in ("jsonl", "csv", "tsv"):
        assert read_records(str(tmp_path / f"x.{suffix}"), ROLES, ("text", "label")) == expected
    assert read_records(str(tmp_path / "x.csv") + "[:1]", ROLES, ("text", "label")) == expected[:1]
    assert label_list(expected) == ("negative", "positive")


def test_nested_fields_and_lists_in_csv_cells(tmp_path):
    (tmp_path / "q.jsonl").write_text(json.dumps({"q": {"text": "who?"}, "c": "Ann met Bob.",
                                                  "a": [{"text": "Ann", "answer_start": 0}]}) + "\n")
    records = read_records(str(tmp_path / "q.jsonl"), {"question": "q.text", "context": "c", "answers": "a"},
                           ("question", "context", "answers"))
    check_answers(records, "q")
    (tmp_path / "t.csv").write_text('words,tags\n"[""Ann"", ""met""]","[""B-person"", ""O""]"\n')
    records = read_records(str(tmp_path / "t.csv"), {"words": "words", "tags": "tags"}, ("words", "tags"))
    assert records == [{"words": ["Ann", "met"], "tags": ["B-person", "O"]}]
    check_tag_lengths(records, "t")


@pytest.mark.parametrize("start", [None, "x", 1.5, "²"])  # "²" was int()'s "invalid literal", naming no question
def test_an_answer_start_that_is_not_a_whole_number_is_named(start):
    """null was a TypeError's traceback, "x" Python's int() message naming no question."""
    records = [{"id": "q7", "context": "Bob went home.", "answers": [{"text": "Bob", "answer_start": start}]}]
    with pytest.raises(ValueError, match=re.escape(f"qa: question q7: an answer's answer_start must be a whole number "
                                                   f"and its text a string, got {start!r} and 'Bob'")):
        check_answers(records, "qa")
    check_answers([dict(records[0], answers=[{"text": "Bob", "answer_start": "0"}])], "qa")


def test_named_datasets_hold_their_splits():
    squad = read_records("squad:dev[:50]", {r: r for r in ("id", "question", "context", "answers")}, ("id",))
    check_answers(squad, "squad")
    wnut = read_records("wnut16:test", {"words": "words", "tags": "tags"}, ("words", "tags"))
    assert len(wnut) == 240 and len({t.split("-", 1)[-1] for r in wnut for t in r["tags"]} - {"O"}) >= 8


@pytest.mark.parametrize("content, suffix, expected", [
    ('{"sentence": "ok", "gold": "positive"}\n{not json}\n', "jsonl", ["x.jsonl:2: not JSON"]),
    ('[1, 2]\n', "jsonl", ["x.jsonl:1: a JSON list, not an object"]),
    ('{"text": "ok", "gold": "positive"}\n', "jsonl", ["x.jsonl:1: no field 'sentence' (fields: text, gold)",
                                                      "finetune.fields.text"]),
    ('sentence,gold\nok,positive,extra\n', "csv", ["x.csv:2: 2 columns in the header (sentence, gold)"]),
    ('{"sentence": ["not", "text"], "gold": "positive"}\n', "jsonl", ["field 'sentence' holds list", "not text"]),
    ('{"sentence": "ok", "gold": null}\n', "jsonl", ["x.jsonl:1: field 'gold' holds None, not a label"]),
    ('{"sentence": "ok", "gold": ["x"]}\n', "jsonl", ["field 'gold' holds ['x'], not a label"]),
    ('', "jsonl", ["holds no records"]),
    ('a b', "txt", ["unknown format '.txt'"]),
])
def test_bad_files_name_file_line_and_field(tmp_path, content, suffix, expected):
    path = tmp_path / f"x.{suffix}"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        read_records(str(path), ROLES, ("text", "label"), "finetune.train")
    message = str(error.value)
    assert message.startswith("finetune.train: ") and "\n" not in message
    for text in expected:
        assert text in message, message


def test_a_slice_that_keeps_nothing_is_named():
    """finetune.train=polarity:train[:0] was reported as the dev split's labels not being scores; predict said
    "no examples to encode"."""
    with pytest.raises(ValueError, match=re.escape("finetune.train: polarity:train[:0] keeps no records; give [:N] "
                                                   "with N of 1 or more")):
        read_records("polarity:train[:0]", ROLES, ("text", "label"), "finetune.train")


@pytest.mark.parametrize("spec, taken", [("polarity:test[5:2]", "5:2"), ("polarity:train[:-3]", ":-3"),
                                         ("polarity:dev[2:]", "2:")])
def test_a_slice_other_than_the_first_n_is_named(spec, taken, tmp_path):
    """It was "the polarity dataset has splits train, dev, test; write polarity:train", whatever the split; a file
    whose name ends in brackets is read as it is."""
    with pytest.raises(ValueError, match=re.escape(f"finetune.test: {spec}: the slice [{taken}] is not one this "
                                                   f"reads; [:N] keeps the first N records (e.g. {spec.split('[')[0]}"
                                                   "[:100])")):
        read_records(spec, ROLES, ("text", "label"), "finetune.test")
    bracketed = tmp_path / "rows[1]"
    bracketed.write_text('{"text": "a fine film", "label": "pos"}\n')
    with pytest.raises(ValueError, match=r"rows\[1\]: unknown format ''"):  # the file, not a slice of it
        read_records(str(bracketed), ROLES, ("text", "label"))


def test_words_and_choices_are_texts_and_a_label_list_needs_its_field(tmp_path):
    """A null label once became the class "None", a list the class "['x']"; words of numbers a traceback in the
    tagger's alignment; records without labels a KeyError while the label list was read."""
    path = tmp_path / "x.jsonl"
    for role, value in (("words", [1, 2]), ("choices", ["a", 2])):
        path.write_text(json.dumps({role: value}) + "\n")
        with pytest.raises(ValueError, match=rf"x.jsonl:1: field '{role}' holds int .*, not the text each of the {role}"):
            read_records(str(path), {role: role}, (role,))
    with pytest.raises(ValueError, match=r"finetune.train: record 2 has no label \(fields: text\); name it with "
                                         r"finetune.fields.label"):
        label_list([{"text": "a", "label": "x"}, {"text": "b"}])


def test_missing_file_and_bad_choices(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^file .*none.jsonl does not exist; give a JSONL, CSV or TSV"):
        read_records(str(tmp_path / "none.jsonl"), ROLES, ("text",))
    with pytest.raises(IsADirectoryError, match=rf"^finetune.train: file {tmp_path} is a directory; give a JSONL"):
        read_records(str(tmp_path), ROLES, ("text",), "finetune.train")
    with pytest.raises(ValueError, match="has 3 choices, the training data 2"):
        check_choices([{"choices": ["a", "b", "c"], "label": 0}], 2, "dev")
    with pytest.raises(ValueError, match="label 2; give the index"):
        check_choices([{"choices": ["a", "b"], "label": 2}], 2, "dev")
    with pytest.raises(ValueError, match="label '¹'; give the index"):  # a digit int() cannot read: its message
        check_choices([{"choices": ["a", "b"], "label": "¹"}], 2, "dev")
    with pytest.raises(ValueError, match=r"^train: the training data's first record has 0 choice\(s\); a multiple-"):
        check_choices([{"choices": [], "label": 0}], 0, "train")  # once "give the index (0 to -1)"


@pytest.mark.parametrize("content, suffix, expected", [
    # DictReader kept the last "label" column: the first one's labels were dropped without a word
    ("sentence,gold,gold\nok,positive,negative\n", "csv", "x.csv:1: the header names 'gold' twice; give each column"),
    # half a surrogate pair: the tokenizer's TypeError traceback ("TextInputSequence must be str") at encoding
    ('{"sentence": "caf\\ud83d", "gold": "positive"}\n', "jsonl",
     "x.jsonl:1: field 'sentence' holds 'caf\\ud83d', with half a surrogate pair"),
])
def test_files_that_parse_but_hold_what_no_reader_means_are_named(tmp_path, content, suffix, expected):
    path = tmp_path / f"x.{suffix}"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        read_records(str(path), ROLES, ("text", "label"), "finetune.train")
    assert str(error.value).startswith("finetune.train: ") and expected in str(error.value), str(error.value)
    words = tmp_path / "w.jsonl"
    words.write_text('{"words": ["ok", "\\udc00"]}\n')
    with pytest.raises(ValueError, match=r"w.jsonl:1: field 'words' holds '\\udc00', with half a surrogate pair"):
        read_records(str(words), {"words": "words"}, ("words",))


@pytest.mark.parametrize("train, given, expected", [
    # each trained without a word: one class (loss 0 from the first step), a class "" of the rows whose label cell
    # was empty, a class "nan", and a head with a class no record could be
    ([{"label": "pos"}, {"label": "pos"}], (), "finetune.train: every record has the label 'pos'; a classifier "
                                               "needs examples of two or more"),
    ([{"label": "pos"}, {"label": ""}], (), "finetune.train: record 2 has label '', which names no class"),
    ([{"label": float("nan")}, {"label": 1}], (), "finetune.train: record 1 has label nan, which names no class"),
    ([{"label": "pos"}], ("pos", "neg", "pos"), "finetune.labels names 'pos' twice; name each label once"),
    ([{"label": "pos"}], ("pos,neg",), "finetune.labels=['pos,neg'] names one label; give two or more, as a list"),
])
def test_labels_that_leave_nothing_to_learn_are_named(train, given, expected):
    with pytest.raises(ValueError) as error:
        label_list(train, given)
    assert str(error.value).startswith(expected), str(error.value)
    with pytest.raises(ValueError, match=r"^finetune.train: every word has the tag 'O'"):
        label_list([{"tags": ["O", "O"]}], field="tags")


def test_a_whole_number_label_names_one_class_however_json_wrote_it():
    """1 and 1.0 (as JSON writers mix them) were two classes: a head of three, one class empty."""
    from jaxlm.finetune.data import check_labels
    train = [{"label": 1}, {"label": 0}, {"label": 1.0}, {"label": "0"}]
    labels = label_list(train)
    assert labels == ("0", "1") and label_list(train, given=[0.0, 1.0]) == labels
    check_labels(train, labels, "finetune.train")
    assert [r["label"] for r in train] == ["1", "0", "1", "0"]
    assert label_list([{"label": 0.5}, {"label": 1.0}]) == ("0.5", "1")


def test_a_score_that_is_not_finite_is_named():
    """1e400 (inf) or NaN trained a regression whose loss was NaN from the first step."""
    from jaxlm.finetune.data import check_scores
    for value in (float("inf"), "nan"):
        with pytest.raises(ValueError, match=r"^dev: record 2 has label (inf|nan); a score is a finite number$"):
            check_scores([{"label": 1}, {"label": value}], "dev")
