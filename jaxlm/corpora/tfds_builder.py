"""The `jaxlm_demo_corpus` TFDS builder (no TensorFlow): one config per registered demo corpus,
one example per document, built as array_record."""
from __future__ import annotations

import contextlib
import functools
import io
import logging
from typing import Any

import numpy as np

from jaxlm.corpora.registry import CORPORA, Corpus, find_corpus
from jaxlm.corpora.text import text_documents

DEMO_NAME = "jaxlm_demo_corpus"
DEMO_VERSION = "1.0.0"


def tfds_module():
    """``tensorflow_datasets``, imported on first use only (it costs ~0.5 s; TensorFlow is
    never needed: datasets are written and read as array_record)."""
    import tensorflow_datasets as tfds  # here: 0.5 s that only tfds: sources and the demo builder need

    return tfds


@contextlib.contextmanager
def quiet(tfds):
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


def _by_config() -> dict[str, Corpus]:
    return {corpus.tfds_config: corpus for corpus in CORPORA.values()}


@functools.cache
def demo_builder_class():
    """The ``JaxlmDemoCorpus`` TFDS builder class (defined, and registered as
    ``jaxlm_demo_corpus``, on the first call)."""
    tfds = tfds_module()
    configs = _by_config()

    class JaxlmDemoCorpus(tfds.core.GeneratorBasedBuilder):
        """jaxlm's demo corpora: one example per document, ``text`` = its sentences, one a line."""

        name = DEMO_NAME
        VERSION = tfds.core.Version(DEMO_VERSION)
        RELEASE_NOTES = {DEMO_VERSION: "Initial release: austen, wikipedia, news, kernel_docs, "
                                       "python_docs; train split only."}
        BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=config, description=f"{config}: {corpus.licence}")
                           for config, corpus in configs.items()]
        # TFDS 4.9.10 looks for a checksums file next to a builder's module via
        # importlib_resources, which it does not install on Python >= 3.9; we download nothing.
        code_path = None

        def _info(self):
            corpus = configs[self.builder_config.name]
            return tfds.core.DatasetInfo(
                builder=self,
                description=(
                    f"jaxlm demo corpus '{corpus.tfds_config}' (demo:{corpus.name}), fetched and cleaned by "
                    f"jaxlm.corpora.registry.{corpus.fetch.__name__}() and stored one example per "
                    "document; `text` holds the document's sentences joined by newlines and `id` "
                    "its position in the corpus file. Only a train split: hold data out with a "
                    f"split slice (train[:90%]) or jaxlm's prepare step. Licence: {corpus.licence}"
                ),
                features=tfds.features.FeaturesDict(
                    {"text": tfds.features.Text(), "id": np.int64}),
                disable_shuffling=True,  # keep the corpus file's document order
                homepage=corpus.homepage,
                citation=corpus.citation,
                license=corpus.licence,
            )

        def _split_generators(self, dl_manager):
            del dl_manager  # nothing is downloaded by TFDS: the corpus's fetcher caches it
            return {"train": self._generate_examples(configs[self.builder_config.name].fetch())}

        def _generate_examples(self, path):
            for index, sentences in enumerate(text_documents(path)):
                yield index, {"text": "\n".join(sentences), "id": index}

    return JaxlmDemoCorpus


def __getattr__(name: str) -> Any:
    if name == "JaxlmDemoCorpus":
        return demo_builder_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def demo_config(corpus: str) -> str:
    """The builder config of a demo corpus named either way (``kernel-docs`` or ``kernel_docs``)."""
    found = find_corpus(corpus)
    if found is None:
        raise ValueError(f"unknown {DEMO_NAME} config {corpus!r}; choose one of: {', '.join(_by_config())}.")
    return found.tfds_config


def default_config() -> str:
    return next(iter(_by_config()))


def build_demo(corpus: str, data_dir) -> None:
    """Build ``jaxlm_demo_corpus/<corpus>`` into ``data_dir`` (array_record) unless it is there."""
    config = demo_config(corpus)
    tfds = tfds_module()
    with quiet(tfds):
        builder = demo_builder_class()(config=config, data_dir=data_dir, file_format="array_record")
        if not builder.is_prepared():
            builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
