"""The tokenization of a corpus's pieces as an Apache Beam pipeline: each piece read and tokenized by
a worker into the preparation's work directory, the same files byte for byte as in-process
tokenization writes, so the rows built from them are the same whatever the runner and workers."""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from jaxlm.data.pieces import Piece, piece_documents
from jaxlm.data.settings import DataConfig
from jaxlm.data.sources import tfds_dir
from jaxlm.data.tokenized import piece_done, piece_path, tokenize_piece

RUNNER_NAMES = {"direct": "DirectRunner", "dataflow": "DataflowRunner", "flink": "FlinkRunner",
                "spark": "SparkRunner", "prism": "PrismRunner"}
# the exceptions a worker raises for bad input, re-raised here with the worker's message
_INPUT_ERRORS = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError, "OSError": OSError,
                 "UnicodeDecodeError": ValueError}


class TokenizePiece(beam.DoFn):
    """Tokenizes one piece (a Piece as a tuple) into the work directory; yields (piece, documents)."""

    def __init__(self, inputs: Sequence[str], tokenizer, work: str, data: DataConfig):
        self.inputs, self.tokenizer, self.work, self.data = [str(p) for p in inputs], tokenizer, work, data

    def process(self, element):
        piece, work, data = Piece(*element), Path(self.work), self.data
        if piece_done(work, piece):  # a retried bundle: the piece is complete already
            return
        documents = piece_documents(self.inputs[piece.source], piece, data.text_field, tfds_dir(data.tfds_data_dir),
                                    data.undecodable)
        yield tuple(piece), tokenize_piece(documents, self.tokenizer, piece_path(work, piece))


def pipeline_options(runner: str, beam_args: Sequence[str]) -> PipelineOptions:
    """Beam's options for `runner` ("direct" or any Beam runner's name) and the runner's own flags."""
    return PipelineOptions(list(beam_args), runner=RUNNER_NAMES.get(runner.lower(), runner))


def direct_workers(workers: int) -> list[str]:
    """The direct runner's flags for `workers` worker processes."""
    return [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"] if workers > 1 else []


def tokenize_on_beam(pieces: Sequence[Piece], inputs: Sequence, tokenizer, work: Path, data: DataConfig,
                     runner: str, beam_args: Sequence[str] = ()) -> None:
    """Runs the pipeline over the pieces not yet in `work` and waits for it; a worker's input error
    comes back as the same exception with the worker's message."""
    todo = [tuple(p) for p in pieces if not piece_done(work, p)]
    if not todo:
        return
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    try:
        with beam.Pipeline(options=pipeline_options(runner, beam_args)) as pipeline:
            _ = (pipeline | "pieces" >> beam.Create(todo) | "spread" >> beam.Reshuffle()
                 | "tokenize" >> beam.ParDo(TokenizePiece(inputs, tokenizer, str(work), data)))
    except Exception as err:  # noqa: BLE001 - Beam wraps a worker's exception in its own types
        raise _worker_error(err) from None


def _worker_error(err: Exception) -> Exception:
    """The input error a worker raised, found in Beam's wrapped message; otherwise a RuntimeError."""
    if type(err).__name__ in _INPUT_ERRORS and type(err) in _INPUT_ERRORS.values():
        return err
    found = re.findall(rf"^(?:\w+\.)*({'|'.join(_INPUT_ERRORS)}): (.+)$", str(err), re.MULTILINE)
    if found:
        name, message = found[-1]
        return _INPUT_ERRORS[name](re.sub(r" \[while running .*\]$", "", message))
    last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return RuntimeError(f"the Beam pipeline failed: {last}")
