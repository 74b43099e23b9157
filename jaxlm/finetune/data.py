"""Fine-tuning's labelled records: read from JSONL, CSV or TSV files, TFDS datasets or the named real
datasets (jaxlm.corpora.labelled), fields renamed to the task's roles, and the checks of labels, tags,
answers and choices that run before any compute. Every error names the file, the line and the field."""
from __future__ import annotations

import csv
import io
import json
import math
import numbers
import pathlib
import re

from jaxlm.corpora import labelled
from jaxlm.corpora.text import check_characters, check_file, utf8_text
from jaxlm.data.sources import tfds_dir

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}
FIRST_N = re.compile(r"(.+)\[:(\d+)\]")  # a spec's `[:N]` suffix: its first N records
SLICE = re.compile(r"(.+)\[([^\[\]]*)\]")  # any other slice, which only TFDS's specs take


def spec_file(spec: str) -> pathlib.Path | None:
    """The user's file that `spec` names; None for a `tfds:` spec or a named dataset (nothing is fetched)."""
    match = FIRST_N.fullmatch(spec)
    spec = match.group(1) if match else spec
    if spec.startswith("tfds:") or spec.partition(":")[0] in labelled.DATASETS:
        return None
    return pathlib.Path(spec)


def read_records(spec: str, roles: dict[str, str], required: tuple[str, ...], where: str = "",
                 tfds_data_dir=None) -> list[dict]:
    """Records with role names as keys (`roles`: role -> the data's field; the roles not in `required`
    are optional) from a file, a `tfds:` spec (prepared in `tfds_data_dir`, the data.tfds_data_dir
    setting: empty is the jaxlm cache) or a named dataset `NAME:SPLIT`; a `[:N]` suffix keeps the first
    N (e.g. squad:train[:500])."""
    where = f"{where}: " if where else ""
    match = FIRST_N.fullmatch(spec)
    if match and not spec.startswith("tfds:"):  # TFDS slices its splits itself
        first = int(match.group(2))
        if first == 0:
            raise ValueError(f"{where}{spec} keeps no records; give [:N] with N of 1 or more")
        return read_records(match.group(1), roles, required, where.removesuffix(": "), tfds_data_dir)[:first]
    other_slice = SLICE.fullmatch(spec)
    if other_slice and not spec.startswith("tfds:") and not pathlib.Path(spec).exists():
        raise ValueError(f"{where}{spec}: the slice [{other_slice.group(2)}] is not one this reads; [:N] keeps the "
                         f"first N records (e.g. {other_slice.group(1)}[:100])")
    if spec.startswith("tfds:"):
        records = [_roles(raw, roles, required, f"{where}{spec} example {i + 1}")
                   for i, raw in enumerate(_tfds_records(spec, where, tfds_data_dir))]
        if not records:
            raise ValueError(f"{where}{spec} holds no records")
        return records
    path = labelled.resolve(spec)
    check_file(path, f"{where}file", "give a JSONL, CSV or TSV file, tfds:NAME[:SPLIT] or a named dataset "
               f"({', '.join(labelled.NAMES)}) as NAME:SPLIT")
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{where}{path}: unknown format {path.suffix!r}; name a .jsonl, .csv or .tsv file")
    raws = _jsonl(path, where) if kind == "jsonl" else _table(path, "\t" if kind == "tsv" else ",", where)
    records = [_roles(raw, roles, required, f"{where}{path}:{line}") for line, raw in raws]
    if not records:
        raise ValueError(f"{where}{path} holds no records")
    return records


def _text(path: pathlib.Path, where: str) -> str:
    try:
        return utf8_text(path)
    except ValueError as err:
        raise ValueError(f"{where}{err}") from None


def _jsonl(path: pathlib.Path, where: str):
    for number, line in enumerate(_text(path, where).splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}{path}:{number}: not JSON ({err.msg}); give one JSON object per line") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{where}{path}:{number}: a JSON {type(raw).__name__}, not an object with named fields")
        yield number, raw


def _table(path: pathlib.Path, delimiter: str, where: str):
    reader = csv.DictReader(io.StringIO(_text(path, where), newline=""), delimiter=delimiter)
    header = reader.fieldnames or []
    twice = first_repeated(header)
    if twice is not None:  # DictReader keeps the last column of a name: the others' values were dropped, silently
        raise ValueError(f"{where}{path}:1: the header names {twice!r} twice; give each column a name of its own")
    for raw in reader:
        if None in raw or any(value is None for value in raw.values()):
            raise ValueError(f"{where}{path}:{reader.line_num}: {len(header)} columns in the header "
                             f"({', '.join(header)}) but not in this row")
        yield reader.line_num, raw


def _tfds_records(spec: str, where: str, data_dir):
    # TFDS (and its imports) load only for a tfds: spec
    from jaxlm.data.tfds_source import tfds_examples

    try:
        source = tfds_examples(spec, tfds_dir(data_dir))
    except (ValueError, FileNotFoundError) as err:
        raise type(err)(f"{where}{err}") from None
    names = _class_names(source.dataset_info.features)
    for index in range(len(source)):
        record = {}
        for key, value in source[index].items():
            try:
                record[key] = _decoded(value, names.get(key))
            except UnicodeDecodeError as err:
                raise ValueError(f"{where}{spec} example {index + 1}: not UTF-8 (byte {err.start} of its {key!r}: "
                                 f"{err.reason}); fix the dataset") from None
        yield record


def _class_names(features) -> dict[str, list[str]]:
    """The label names of each ClassLabel feature, alone or in a Sequence (labels and tags are names)."""
    names = {}
    for key, feature in features.items():
        feature = getattr(feature, "feature", feature)
        if hasattr(feature, "int2str") and getattr(feature, "names", None):
            names[key] = list(feature.names)
    return names


def _decoded(value, class_names=None):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "tolist"):
        return _decoded(value.tolist(), class_names)
    if isinstance(value, list):
        return [_decoded(v, class_names) for v in value]
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    if class_names is not None and isinstance(value, int):
        return class_names[value]
    return value


def _field(raw: dict, name: str):
    """`name` of `raw`, following dots into nested objects ("answers.text")."""
    value = raw
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(name)
        value = value[part]
    return value


def _roles(raw: dict, roles: dict[str, str], required: tuple[str, ...], where: str) -> dict:
    record = {}
    for role, field in roles.items():
        try:
            value = _field(raw, field)
        except KeyError:
            if role in required:
                raise ValueError(f"{where}: no field {field!r} (fields: {', '.join(raw)}); set finetune.fields."
                                 f"{role} to the one that holds the {role}") from None
            continue
        record[role] = _typed(role, value, where, field)
    return record


LIST_ROLES = ("words", "tags", "choices", "answers")


def _typed(role: str, value, where: str, field: str):
    """The value in the form its role takes: lists stay lists (a JSON-encoded list in a CSV cell is
    decoded), texts are strings."""
    if role in LIST_ROLES:
        if isinstance(value, str) and value.startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        if not isinstance(value, list):
            raise ValueError(f"{where}: field {field!r} holds {type(value).__name__} {str(value)[:40]!r}, "
                             f"not the list the {role} role needs")
        odd = next((v for v in value if not isinstance(v, str)), None) if role in ("words", "choices") else None
        if odd is not None:
            raise ValueError(f"{where}: field {field!r} holds {type(odd).__name__} {str(odd)[:40]!r}, not the text "
                             f"each of the {role} is")
        if role in ("words", "choices"):
            for text in value:
                check_characters(text, f"{where}: field {field!r}")
        return value
    if role in ("text", "text_pair", "question", "context", "prompt", "response", "source", "target"):
        if not isinstance(value, str):
            raise ValueError(f"{where}: field {field!r} holds {type(value).__name__} {str(value)[:40]!r}, not text")
        check_characters(value, f"{where}: field {field!r}")
    if role == "label" and (value is None or isinstance(value, (list, dict))):
        raise ValueError(f"{where}: field {field!r} holds {str(value)[:40]}, not a label (a name or a number)")
    return value


# ---------------------------------------------------------------- checks

def first_repeated(names):
    """The first of `names` that came before; None where each is named once."""
    seen = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def label_name(value) -> str:
    """The class a label value names: 1, 1.0 and "1" name one class (JSON writes whole numbers either way)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def label_list(train: list[dict], given=(), field: str = "label") -> tuple[str, ...]:
    """The given labels, else those of the training records (sorted; tags: every tag of every record); two or
    more, each named once."""
    what = "tag" if field == "tags" else field
    if given:
        labels = tuple(label_name(label) for label in given)
        twice = first_repeated(labels)
        if twice is not None:  # a head of one class more, which no record could ever be
            raise ValueError(f"finetune.labels names {twice!r} twice; name each {what} once")
        if len(labels) < 2:
            raise ValueError(f"finetune.labels={list(labels)} names one {what}; give two or more, as a list "
                             "([negative, positive])")
        return labels
    unlabelled = next((i for i, r in enumerate(train) if field not in r), None)
    if unlabelled is not None:
        raise ValueError(f"finetune.train: record {unlabelled + 1} has no {field} (fields: "
                         f"{', '.join(train[unlabelled])}); name it with finetune.fields.{field}")
    values = set()
    for index, record in enumerate(train):
        for value in record[field] if field == "tags" else [record[field]]:
            if (isinstance(value, float) and not math.isfinite(value)) or not str(value).strip():
                raise ValueError(f"finetune.train: record {index + 1} has {what} {value!r}, which names no class; "
                                 f"give every record its {what}")
            values.add(label_name(value))
    labels = tuple(sorted(values))
    if len(labels) < 2:  # its loss is 0 from the first step: nothing to learn
        raise ValueError(f"finetune.train: every {'word' if field == 'tags' else 'record'} has the {what} "
                         f"{labels[0]!r}; a classifier needs examples of two or more")
    return labels


def check_labels(records: list[dict], labels: tuple[str, ...], where: str, field: str = "label") -> None:
    """Every label (or tag) is one of `labels`, and becomes its `label_name`."""
    known = set(labels)
    for index, record in enumerate(records):
        values = record[field] if field == "tags" else [record[field]]
        for value in values:
            if label_name(value) not in known:
                raise ValueError(f"{where}: record {index + 1} has {field[:-1] if field == 'tags' else 'label'} "
                                 f"{value!r}, which the training data (or finetune.labels) does not have; known: "
                                 f"{', '.join(sorted(known))}")
        if field != "tags":
            record[field] = label_name(record[field])
        else:
            record[field] = [label_name(t) for t in record[field]]


def check_scores(records: list[dict], where: str) -> None:
    """Every label is a number (regression and similarity scores)."""
    for index, record in enumerate(records):
        if "label" not in record:
            raise ValueError(f"{where}: record {index + 1} has no label, the score it is trained on "
                             "(finetune.fields.label names the field)")
        try:
            record["label"] = float(record["label"])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: record {index + 1} has label {record['label']!r}, not the number a score "
                             "is") from None
        if not math.isfinite(record["label"]):  # its loss would be NaN from the first step
            raise ValueError(f"{where}: record {index + 1} has label {record['label']!r}; a score is a finite number")


def check_tag_lengths(records: list[dict], where: str) -> None:
    for index, record in enumerate(records):
        if not record["words"]:
            raise ValueError(f"{where}: record {index + 1} has no words")
        if "tags" in record and len(record["tags"]) != len(record["words"]):
            raise ValueError(f"{where}: record {index + 1} has {len(record['words'])} words but {len(record['tags'])} "
                             "tags; give one tag per word")


def check_answers(records: list[dict], where: str) -> None:
    """Each answer ({"text", "answer_start"}) is the context's text at its start offset."""
    for index, record in enumerate(records):
        answers = record.get("answers")
        if not answers:
            raise ValueError(f"{where}: question {record.get('id', index + 1)} has no answer")
        for answer in answers:
            if not isinstance(answer, dict) or "text" not in answer or "answer_start" not in answer:
                raise ValueError(f"{where}: question {record.get('id', index + 1)}: an answer is "
                                 f"{str(answer)[:60]!r}, not {{\"text\": ..., \"answer_start\": ...}}")
            start, text = answer["answer_start"], answer["text"]
            # isdecimal, not isdigit: "²" is a digit int() cannot read
            whole = (isinstance(start, numbers.Integral) and not isinstance(start, bool)) or str(start).isdecimal()
            if not whole or not isinstance(text, str):
                raise ValueError(f"{where}: question {record.get('id', index + 1)}: an answer's answer_start must be "
                                 f"a whole number and its text a string, got {start!r} and {text!r}")
            start = int(start)
            found = record["context"][start:start + len(text)]
            if found != text:
                raise ValueError(f"{where}: question {record.get('id', index + 1)}: answer {text!r} at {start} is not "
                                 f"in its context (context[{start}:{start + len(text)}] is {found!r})")


def check_choices(records: list[dict], choices: int, where: str) -> None:
    """Every record has `choices` choices (two or more) and a label that indexes one of them."""
    if choices < 2:
        raise ValueError(f"{where}: the training data's first record has {choices} choice(s); a multiple-choice "
                         "record needs two or more")
    for index, record in enumerate(records):
        if len(record["choices"]) != choices:
            raise ValueError(f"{where}: record {index + 1} has {len(record['choices'])} choices, the training data "
                             f"{choices}; every record needs the same number")
        if "label" in record:
            label = record["label"]
            if isinstance(label, bool) or not isinstance(label, int) and not str(label).isdecimal() \
                    or not 0 <= int(label) < choices:
                raise ValueError(f"{where}: record {index + 1} has label {label!r}; give the index (0 to "
                                 f"{choices - 1}) of the right choice")
            record["label"] = int(label)


