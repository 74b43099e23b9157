"""`tfds:NAME[/CONFIG][@VERSION][:SPLIT]` corpus specs read as documents through `tfds.data_source`
(no TensorFlow), with a clear error for each thing that can be wrong with one."""
from __future__ import annotations

import re
from typing import Callable, Iterator

import numpy as np

from jaxlm.corpora.text import split_sentences, warn_on_stderr
from jaxlm.corpora.tfds_builder import (DEMO_NAME, build_demo, default_config, demo_builder_class, demo_config,
                                        quiet, tfds_module)

_SPEC = re.compile(
    r"tfds:(?P<dataset>[A-Za-z_][A-Za-z0-9_]*)(?:/(?P<config>[^/@:]+))?"
    r"(?:@(?P<version>\d+\.\d+\.\d+))?(?::(?P<split>.*))?",
    re.S,
)
_SPEC_HELP = ("expected tfds:NAME[/CONFIG][@VERSION][:SPLIT], e.g. tfds:jaxlm_demo_corpus/austen "
              "or tfds:my_dataset/config@1.0.0:train[:90%]")


def parse_tfds_spec(spec: str) -> tuple[str, str]:
    """``tfds:NAME[/CONFIG][@VERSION][:SPLIT]`` -> (TFDS name ``NAME[/CONFIG][:VERSION]``, split).

    ``NAME`` is a TFDS dataset name (registered, or prepared under the data_dir), ``CONFIG`` a
    builder config, ``VERSION`` ``X.Y.Z`` (TFDS writes it ``NAME/CONFIG:X.Y.Z``; ``@`` keeps
    ``:`` free for the split). ``SPLIT`` defaults to ``train`` and is returned unchanged for TFDS,
    so slices and unions work: ``train[:90%]``, ``train[10:20]``, ``train+validation``.
    Examples: ``tfds:jaxlm_demo_corpus/austen``, ``tfds:my_dataset/config@1.0.0:train[:90%]``."""
    match = _SPEC.fullmatch(spec.strip()) if isinstance(spec, str) else None
    if not match:
        raise ValueError(f"bad TFDS corpus spec {spec!r}: {_SPEC_HELP}.")
    split = match["split"]
    if split is not None:
        split = split.strip()
        if re.fullmatch(r"\d+\.\d+\.\d+", split):
            raise ValueError(f"bad TFDS corpus spec {spec!r}: write the version with @, as in "
                             f"tfds:NAME[/CONFIG]@{split}[:SPLIT].")
        if not split:
            raise ValueError(f"bad TFDS corpus spec {spec!r}: empty split after ':'; {_SPEC_HELP}.")
    name = match["dataset"]
    if match["config"]:
        name += "/" + match["config"]
    if match["version"]:
        name += ":" + match["version"]
    return name, split or "train"


def _check_format(builder, tfds, spec: str) -> None:
    formats = set(builder.info.available_file_formats())
    if not formats & set(tfds.core.file_adapters.FileFormat.with_random_access()):
        found = ", ".join(sorted(f.value for f in formats)) or "unknown"
        raise ValueError(
            f"{spec}: the dataset at {builder.data_dir} was prepared in the {found} file format, "
            "which tfds.data_source cannot read randomly. Prepare it again with "
            "file_format='array_record' into another data_dir (or delete that directory), e.g. "
            f"tfds.builder({builder.info.full_name.rsplit('/', 1)[0]!r}, data_dir=..., "
            "file_format='array_record').download_and_prepare().")


def _split_names(split: str) -> list[str]:
    return [part.split("[", 1)[0].strip() for part in split.split("+")]


def _check_split(spec: str, full_name: str, split: str, splits) -> None:
    missing = [s for s in _split_names(split) if s not in splits]
    if missing:
        raise ValueError(f"{spec}: {full_name} has no split {', '.join(map(repr, missing))}; its "
                         f"splits are: {', '.join(sorted(splits))}. Fix the :SPLIT part of the spec.")


def _check_text_field(spec: str, full_name: str, features, text_field: str, tfds) -> None:
    names = list(features.keys())
    if text_field not in names:
        raise ValueError(
            f"{spec}: {full_name} has no feature {text_field!r}; its features are: "
            f"{', '.join(names) or '(none)'}. Set data.text_field to the one holding the text.")
    feature = features[text_field]
    is_text = isinstance(feature, tfds.features.Text) or (
        getattr(feature, "shape", None) == () and getattr(feature, "np_dtype", None) in (object, np.str_, np.bytes_))
    if not is_text:
        raise ValueError(
            f"{spec}: feature {text_field!r} of {full_name} is a {type(feature).__name__} "
            f"(shape {getattr(feature, 'shape', '?')}, dtype {getattr(feature, 'np_dtype', '?')}), not a "
            f"single text; its features are: {', '.join(names)}. Set data.text_field to a text feature.")


def _open(spec: str, data_dir, text_field: str | None = None):
    """Validate ``spec`` against what is prepared in ``data_dir`` (building a missing
    ``jaxlm_demo_corpus`` config after checking the split and field) -> (builder, split, tfds)."""
    name, split = parse_tfds_spec(spec)
    base, _, version = name.partition(":")
    dataset, _, corpus = base.partition("/")
    tfds = tfds_module()
    if dataset == DEMO_NAME:
        config = demo_config(corpus or default_config())
        name = f"{DEMO_NAME}/{config}" + (f":{version}" if version else "")
        _check_split(spec, f"{DEMO_NAME}/{config}", split, ["train"])
        if text_field is not None:
            with quiet(tfds):
                features = demo_builder_class()(config=config, data_dir=data_dir).info.features
            _check_text_field(spec, f"{DEMO_NAME}/{config}", features, text_field, tfds)
        build_demo(config, data_dir)
    where = data_dir if data_dir is not None else "the default TFDS data_dir (TFDS_DATA_DIR or ~/tensorflow_datasets)"
    with quiet(tfds):
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except tfds.core.registered.DatasetNotFoundError as err:
            raise FileNotFoundError(
                f"{spec}: TFDS dataset {name!r} is neither registered nor prepared in {where}. Check "
                "the name, point data.tfds_data_dir at the directory holding it, or "
                "import the module defining its builder and prepare it with "
                "file_format='array_record'.") from err
        except (ValueError, AssertionError) as err:  # unknown config or version of a known dataset
            raise ValueError(f"{spec}: {err}") from err
        if not builder.is_prepared():
            raise FileNotFoundError(
                f"{spec}: TFDS dataset {builder.info.full_name} is not prepared in {where}. Prepare "
                f"it first with tfds.builder({name!r}, data_dir=..., file_format='array_record')"
                ".download_and_prepare(), or point data.tfds_data_dir at where it was prepared.")
    _check_format(builder, tfds, spec)
    _check_split(spec, builder.info.full_name, split, list(builder.info.splits))
    if text_field is not None:
        _check_text_field(spec, builder.info.full_name, builder.info.features, text_field, tfds)
    return builder, split, tfds


def _data_source(builder, split: str, spec: str):
    try:
        return builder.as_data_source(split=split)
    except (ValueError, AssertionError) as err:  # e.g. a malformed slice
        raise ValueError(f"{spec}: bad split {split!r}: {err}") from err


def _sentences(text: str) -> list[str]:
    lines = [line.strip() for line in str(text).split("\n")]
    lines = [line for line in lines if line]
    return split_sentences(lines[0]) if len(lines) == 1 else lines


def tfds_examples(spec: str, data_dir):
    """The examples of a TFDS split (a random-access ``tfds.data_source``), after every check of the spec
    and of what is prepared in ``data_dir`` (None: TFDS's default)."""
    builder, split, _ = _open(spec, data_dir)
    return _data_source(builder, split, spec)


def tfds_documents(spec: str, data_dir, text_field: str = "text") -> list[list[str]]:
    """Documents (lists of sentences) of a TFDS split read with ``tfds.data_source``.

    One example is one document. A text with newlines is split on them (blank lines, e.g.
    between paragraphs, are dropped; all lines stay in one document); a single-line text is split
    into sentences with :func:`jaxlm.corpora.text.split_sentences`. Empty texts are skipped.
    A missing ``jaxlm_demo_corpus`` config is built into ``data_dir`` first; ``data_dir=None``
    means TFDS's default (TFDS_DATA_DIR or ~/tensorflow_datasets)."""
    return list(tfds_range_documents(spec, data_dir, text_field))


def tfds_range_documents(spec: str, data_dir, text_field: str = "text", start: int = 0, stop: int | None = None,
                         undecodable: str = "fail",
                         warn: Callable[[str], None] = warn_on_stderr) -> Iterator[list[str]]:
    """The documents of examples start..stop of a TFDS split (as `tfds_documents`), read lazily; a text that is not
    UTF-8 fails naming its record, or (undecodable="skip") is left out, told to `warn`."""
    builder, split, _ = _open(spec, data_dir, text_field)
    source = _data_source(builder, split, spec)
    for index in range(start, len(source) if stop is None else stop):
        text = source[index][text_field]
        text = text.item() if isinstance(text, np.ndarray) else text
        try:
            text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        except UnicodeDecodeError as err:
            where = (f"{spec}: record {index} of {builder.info.full_name}, split {split}: not UTF-8 (byte {err.start} "
                     f"of its {text_field!r}: {err.reason})")
            if undecodable == "fail":
                raise ValueError(f"{where}; fix the dataset, or set data.undecodable=skip to leave such records "
                                 "out") from None
            warn(f"warning: {where}; record left out (data.undecodable=skip)")
            continue
        document = _sentences(text)
        if document:
            yield document


def tfds_length(spec: str, data_dir) -> int:
    """The number of examples of a TFDS split."""
    builder, split, _ = _open(spec, data_dir)
    return len(_data_source(builder, split, spec))


def tfds_fingerprint(spec: str, data_dir) -> dict:
    """What a manifest records about a TFDS source: name, config, version, split, file format,
    number of examples in the (possibly sliced) split, and the prepared directory."""
    builder, split, _ = _open(spec, data_dir)
    source = _data_source(builder, split, spec)
    return {
        "source": "tfds",
        "spec": spec,
        "name": builder.name,
        "config": builder.builder_config.name if builder.builder_config else None,
        "version": str(builder.version),
        "full_name": builder.info.full_name,
        "split": split,
        "num_examples": len(source),
        "file_format": builder.info.file_format.value if builder.info.file_format else None,
        "data_dir": str(builder.data_dir),
    }
