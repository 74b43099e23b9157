"""TensorFlow Datasets corpus sources (no TensorFlow): the jaxlm_demo_corpus builder and `tfds:` specs."""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import re
from typing import Any

import numpy as np

DEMO_NAME = "jaxlm_demo_corpus"
DEMO_VERSION = "1.0.0"
# config name -> name of its fetch function in jaxlm.data.assets (looked up when building, so
# configs whose fetch function does not exist yet are listed but fail with a clear message)
DEMO_CORPORA = {
    "austen": "fetch_austen",
    "wikipedia": "fetch_wikipedia",
    "news": "fetch_news",
    "kernel_docs": "fetch_kernel_docs",
    "python_docs": "fetch_python_docs",
}
_HOMEPAGES = {
    "austen": "https://github.com/juliasilge/janeaustenr",
    "wikipedia": "https://github.com/piskvorky/gensim",
    "news": "https://github.com/piskvorky/gensim",
    "kernel_docs": "https://docs.kernel.org/",
    "python_docs": "https://docs.python.org/3.11/",
}
_CITATIONS = {
    "austen": """@misc{silge_janeaustenr,
  author = {Julia Silge},
  title = {janeaustenr: Jane Austen's Complete Novels},
  note = {R package},
  howpublished = {\\url{https://CRAN.R-project.org/package=janeaustenr}}
}""",
    "wikipedia": """@misc{wikipedia,
  author = {{Wikipedia contributors}},
  title = {Wikipedia, The Free Encyclopedia},
  howpublished = {\\url{https://en.wikipedia.org}}
}""",
    "news": """@inproceedings{lee2005empirical,
  author = {Lee, Michael D. and Pincombe, Brandon and Welsh, Matthew},
  title = {An empirical evaluation of models of text document similarity},
  booktitle = {Proceedings of the 27th Annual Conference of the Cognitive Science Society},
  year = {2005}
}""",
}
_SPEC = re.compile(
    r"tfds:(?P<dataset>[A-Za-z_][A-Za-z0-9_]*)(?:/(?P<config>[^/@:]+))?"
    r"(?:@(?P<version>\d+\.\d+\.\d+))?(?::(?P<split>.*))?",
    re.S,
)
_SPEC_HELP = ("expected tfds:NAME[/CONFIG][@VERSION][:SPLIT], e.g. tfds:jaxlm_demo_corpus/austen "
              "or tfds:my_dataset/config@1.0.0:train[:90%]")


def _tfds():
    """``tensorflow_datasets``, imported on first use only (it costs ~0.5 s; TensorFlow is
    never needed: datasets are written and read as array_record)."""
    import tensorflow_datasets as tfds

    return tfds


def _licence(corpus: str) -> str:
    from jaxlm.data import assets

    licences = getattr(assets, "CORPUS_LICENCES", {})
    return (licences.get(corpus) or licences.get(corpus.replace("_", "-"))
            or "see jaxlm.data.assets.CORPUS_LICENCES")


@functools.cache
def demo_builder_class():
    """The ``JaxlmDemoCorpus`` TFDS builder class (defined, and registered as
    ``jaxlm_demo_corpus``, on the first call)."""
    from jaxlm.data.sources import text_documents

    tfds = _tfds()

    class JaxlmDemoCorpus(tfds.core.GeneratorBasedBuilder):
        """jaxlm's demo corpora: one example per document, ``text`` = its sentences, one a line."""

        name = DEMO_NAME
        VERSION = tfds.core.Version(DEMO_VERSION)
        RELEASE_NOTES = {DEMO_VERSION: "Initial release: austen, wikipedia, news, kernel_docs, "
                                       "python_docs; train split only."}
        BUILDER_CONFIGS = [
            tfds.core.BuilderConfig(name=corpus, description=f"{corpus}: {_licence(corpus)}")
            for corpus in DEMO_CORPORA
        ]
        # TFDS 4.9.10 looks for a checksums file next to a builder's module via
        # importlib_resources, which it does not install on Python >= 3.9; we download nothing.
        code_path = None

        def _info(self):
            corpus = self.builder_config.name
            return tfds.core.DatasetInfo(
                builder=self,
                description=(
                    f"jaxlm demo corpus '{corpus}', fetched and cleaned by "
                    f"jaxlm.data.assets.{DEMO_CORPORA[corpus]}() and stored one example per "
                    "document; `text` holds the document's sentences joined by newlines and `id` "
                    "its position in the corpus file. Only a train split: hold data out with a "
                    f"split slice (train[:90%]) or jaxlm's prepare step. Licence: {_licence(corpus)}"
                ),
                features=tfds.features.FeaturesDict(
                    {"text": tfds.features.Text(), "id": np.int64}),
                disable_shuffling=True,  # keep the corpus file's document order
                homepage=_HOMEPAGES.get(corpus, ""),
                citation=_CITATIONS.get(corpus, ""),
                license=_licence(corpus),
            )

        def _split_generators(self, dl_manager):
            del dl_manager  # nothing is downloaded by TFDS: our fetch function caches the corpus
            return {"train": self._generate_examples(_fetch_demo(self.builder_config.name))}

        def _generate_examples(self, path):
            for index, sentences in enumerate(text_documents(path)):
                yield index, {"text": "\n".join(sentences), "id": index}

    return JaxlmDemoCorpus


def __getattr__(name: str) -> Any:
    if name == "JaxlmDemoCorpus":
        return demo_builder_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fetch_demo(corpus: str):
    from jaxlm.data import assets

    fetch = getattr(assets, DEMO_CORPORA[corpus], None)
    if fetch is None:
        raise ValueError(
            f"{DEMO_NAME}/{corpus} needs jaxlm.data.assets.{DEMO_CORPORA[corpus]}(), which this "
            f"version of jaxlm does not have; choose one of: {', '.join(_available_demos())}.")
    return fetch()


def _available_demos() -> list[str]:
    from jaxlm.data import assets

    return [c for c, fn in DEMO_CORPORA.items() if hasattr(assets, fn)]


def _check_demo_corpus(corpus: str) -> str:
    """The config name of a demo corpus (``kernel-docs`` is accepted for ``kernel_docs``)."""
    config = corpus.replace("-", "_")
    if config not in DEMO_CORPORA:
        raise ValueError(f"unknown {DEMO_NAME} config {corpus!r}; choose one of: "
                         f"{', '.join(_available_demos())}.")
    return config


@contextlib.contextmanager
def _quiet(tfds):
    """Silence what TFDS prints while checking and building: absl warnings about variant folders
    that do not exist yet, its tqdm progress bars and its "Downloading and preparing" lines."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    tqdm_utils = tfds.core.utils.tqdm_utils
    progress = getattr(tqdm_utils, "_active", True)
    absl_logger.setLevel(logging.ERROR)
    tfds.display_progress_bar(False)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        tfds.display_progress_bar(progress)
        absl_logger.setLevel(level)


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


def build_demo(corpus: str, data_dir) -> None:
    """Build ``jaxlm_demo_corpus/<corpus>`` into ``data_dir`` (array_record) unless it is there."""
    corpus = _check_demo_corpus(corpus)
    tfds = _tfds()
    with _quiet(tfds):
        builder = demo_builder_class()(config=corpus, data_dir=data_dir, file_format="array_record")
        if builder.is_prepared():
            _check_format(builder, tfds, f"tfds:{DEMO_NAME}/{corpus}")
            return
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))


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
    tfds = _tfds()
    if dataset == DEMO_NAME:
        corpus = _check_demo_corpus(corpus or next(iter(DEMO_CORPORA)))  # default: the first
        name = f"{DEMO_NAME}/{corpus}" + (f":{version}" if version else "")
        _check_split(spec, f"{DEMO_NAME}/{corpus}", split, ["train"])
        if text_field is not None:
            with _quiet(tfds):
                features = demo_builder_class()(config=corpus, data_dir=data_dir).info.features
            _check_text_field(spec, f"{DEMO_NAME}/{corpus}", features, text_field, tfds)
        build_demo(corpus, data_dir)
    where = data_dir if data_dir is not None else "the default TFDS data_dir (TFDS_DATA_DIR or ~/tensorflow_datasets)"
    with _quiet(tfds):
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except tfds.core.registered.DatasetNotFoundError as err:
            raise FileNotFoundError(
                f"{spec}: TFDS dataset {name!r} is neither registered nor prepared in {where}. Check "
                "the name, point data.data_dir (or TFDS_DATA_DIR) at the directory holding it, or "
                "import the module defining its builder and prepare it with "
                "file_format='array_record'.") from err
        except (ValueError, AssertionError) as err:  # unknown config or version of a known dataset
            raise ValueError(f"{spec}: {err}") from err
        if not builder.is_prepared():
            raise FileNotFoundError(
                f"{spec}: TFDS dataset {builder.info.full_name} is not prepared in {where}. Prepare "
                f"it first with tfds.builder({name!r}, data_dir=..., file_format='array_record')"
                ".download_and_prepare(), or point data.data_dir at where it was prepared.")
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


def _sentences(text) -> list[str]:
    if isinstance(text, np.ndarray):
        text = text.item()
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    lines = [line.strip() for line in str(text).split("\n")]
    lines = [line for line in lines if line]
    if len(lines) == 1:
        from jaxlm.data.assets import split_sentences

        return split_sentences(lines[0])
    return lines


def tfds_documents(spec: str, data_dir, text_field: str = "text") -> list[list[str]]:
    """Documents (lists of sentences) of a TFDS split read with ``tfds.data_source``.

    One example is one document. A text with newlines is split on them (blank lines, e.g.
    between paragraphs, are dropped; all lines stay in one document); a single-line text is split
    into sentences with :func:`jaxlm.data.assets.split_sentences`. Empty texts are skipped.
    A missing ``jaxlm_demo_corpus`` config is built into ``data_dir`` first; ``data_dir=None``
    means TFDS's default (TFDS_DATA_DIR or ~/tensorflow_datasets)."""
    builder, split, _ = _open(spec, data_dir, text_field)
    source = _data_source(builder, split, spec)
    documents = []
    for index in range(len(source)):
        document = _sentences(source[index][text_field])
        if document:
            documents.append(document)
    return documents


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
