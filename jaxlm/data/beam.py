"""The tokenization of a corpus's pieces as an Apache Beam pipeline: each piece read and tokenized by
a worker into the preparation's work directory, the same files byte for byte as in-process
tokenization writes, so the rows built from them are the same whatever the runner and workers."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import psutil

# Beam's import warns on the root logger that Google Cloud's optional clients are absent
logging.getLogger().addFilter(lambda record: not record.getMessage().startswith("apitools not found"))
import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from jaxlm.data.pieces import Piece, piece_documents
from jaxlm.data.settings import DataConfig
from jaxlm.data.sources import tfds_dir
from jaxlm.data.tokenized import TokenizationFailed, piece_done, piece_path, tokenize_piece

RUNNER_NAMES = {"direct": "DirectRunner", "dataflow": "DataflowRunner", "flink": "FlinkRunner",
                "spark": "SparkRunner", "prism": "PrismRunner"}
WARNINGS = ".warnings"  # what a worker would have said of a piece on stderr (lines left out), told here after
WORKER_GRACE_S = 10
STOP_WAIT_S = 5
# the exceptions a worker raises for bad input, re-raised here with the worker's message
_INPUT_ERRORS = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError, "OSError": OSError}


class TokenizePiece(beam.DoFn):
    """Tokenizes one piece (a Piece as a tuple) into the work directory, its warnings beside it; yields (piece,
    documents)."""

    def __init__(self, inputs: Sequence[str], tokenizer, work: str, data: DataConfig):
        self.inputs, self.tokenizer, self.work, self.data = [str(p) for p in inputs], tokenizer, work, data

    def process(self, element):
        piece, work, data = Piece(*element), Path(self.work), self.data
        if piece_done(work, piece):  # a retried bundle: the piece is complete already
            return
        warnings: list[str] = []
        documents = piece_documents(self.inputs[piece.source], piece, data.text_field, tfds_dir(data.tfds_data_dir),
                                    data.undecodable, warnings.append)
        n_documents = tokenize_piece(documents, self.tokenizer, piece_path(work, piece))
        if warnings:
            piece_path(work, piece).with_suffix(WARNINGS).write_text("".join(w + "\n" for w in warnings))
        yield tuple(piece), n_documents


def pipeline_options(runner: str, beam_args: Sequence[str]) -> PipelineOptions:
    """Beam's options for `runner` ("direct" or any Beam runner's name) and the runner's own flags."""
    return PipelineOptions(list(beam_args), runner=RUNNER_NAMES.get(runner.lower(), runner))


def check_beam_args(runner: str, beam_args: Sequence[str]) -> None:
    """ValueError naming what in `beam_args` Beam's option parser refuses (a malformed value, --help: Beam would exit
    inside the pipeline's thread) or does not know (Beam would drop it with a warning in its log)."""
    said, beams_warnings = io.StringIO(), logging.getLogger("apache_beam.options.pipeline_options")
    discarded = []

    def discarding(record):  # "Discarding unparseable args: [...]": kept, and said below in one line
        if str(record.msg).startswith("Discarding unparseable args"):
            discarded.extend(record.args[0])
            return False
        return True

    beams_warnings.addFilter(discarding)
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            options = pipeline_options(runner, beam_args)
            known = options.get_all_options()
            given = options.get_all_options(retain_unknown_options=True)
    except SystemExit:
        lines = said.getvalue().strip().splitlines()
        message = lines[-1].partition("error: ")[2] if lines else f"{' '.join(beam_args)} stops Beam's option parser"
        raise ValueError(f"Beam's options: {message}; fix --beam-args") from None
    finally:
        beams_warnings.removeFilter(discarding)
    unknown = [f"--{name}" for name in given if name not in known]
    if unknown:
        raise ValueError(f"Beam's options: no Beam runner knows {', '.join(unknown)}; fix --beam-args (the runner's "
                         "own flags, e.g. --beam-args \"--project=P --region=R\" for dataflow)")
    if discarded:  # with every flag known, what Beam discards are words that no flag takes
        raise ValueError(f"Beam's options: {' '.join(map(str, discarded))} follows no option that takes a value; fix "
                         "--beam-args (give a value as --name=value)")


def direct_workers(workers: int) -> list[str]:
    """The direct runner's flags for `workers` worker processes."""
    return [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"] if workers > 1 else []


def tokenize_on_beam(pieces: Sequence[Piece], inputs: Sequence, tokenizer, work: Path, data: DataConfig,
                     runner: str, beam_args: Sequence[str] = (), check: Callable[[], None] = lambda: None) -> None:
    """Runs the pipeline over the pieces not yet in `work` and waits for it; a worker's input error
    comes back as the same exception with the worker's message, a worker's death as TokenizationFailed."""
    todo = [tuple(p) for p in pieces if not piece_done(work, p)]
    if not todo:
        return
    logging.getLogger("apache_beam").setLevel(logging.WARNING)

    def run():
        with beam.Pipeline(options=pipeline_options(runner, beam_args)) as pipeline:
            _ = (pipeline | "pieces" >> beam.Create(todo) | "spread" >> beam.Reshuffle()
                 | "tokenize" >> beam.ParDo(TokenizePiece(inputs, tokenizer, str(work), data)))

    log = work / "beam.log"
    try:
        with _stderr_to(log):
            _run_watching_workers(run, check)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - Beam wraps a worker's exception in its own types
        raise _worker_error(err, log) from None
    for piece in todo:
        told = piece_path(work, Piece(*piece)).with_suffix(WARNINGS)
        if told.is_file():
            sys.stderr.write(told.read_text())


@contextlib.contextmanager
def _stderr_to(path: Path):
    """This process's stderr, and so that of the workers it starts, appended to `path` in the block:
    Beam's and its workers' logs (and their tracebacks when Ctrl-C reaches them) stay off the terminal."""
    saved, target = os.dup(2), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(target, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def _run_watching_workers(run: Callable[[], None], check: Callable[[], None], poll_s: float = 0.2) -> None:
    """`run()` in a thread, watched: Beam's direct runner waits forever on a worker process that died, so
    a dead worker (or Ctrl-C, via `check`) stops the remaining workers and raises here."""
    failure: list[BaseException] = []

    def target():
        try:
            run()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            failure.append(err)

    thread = threading.Thread(target=target, name="beam-pipeline", daemon=True)
    thread.start()
    me, workers, first_death = psutil.Process(), {}, {}
    try:
        while thread.is_alive():
            thread.join(poll_s)
            check()
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.pid not in workers and "sdk_worker_main" in " ".join(child.cmdline()):
                        workers[child.pid] = child
            for pid, worker in workers.items():
                try:
                    alive = worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
                except psutil.Error:
                    alive = False
                if not alive:
                    first_death.setdefault(pid, time.monotonic())
            # workers also exit when the pipeline ends: a death counts once the pipeline outlives it
            dead = [pid for pid, when in first_death.items() if time.monotonic() - when > WORKER_GRACE_S]
            if dead and thread.is_alive():
                raise TokenizationFailed(f"the Beam pipeline failed: worker process {dead[0]} died (killed, or out of "
                                   "memory?); tokenized pieces that finished are kept, run the same command again")
    except BaseException:
        for worker in workers.values():
            with contextlib.suppress(psutil.Error):
                worker.kill()
        thread.join(STOP_WAIT_S)  # Beam's threads report the killed workers into the log, not the terminal
        raise
    if failure:
        raise failure[0]


def _worker_error(err: Exception, log: Path) -> Exception:
    """The input error a worker raised, found in Beam's wrapped message; otherwise a RuntimeError
    pointing at the pipeline's log."""
    if type(err) in _INPUT_ERRORS.values():
        return err
    found = re.findall(rf"^(?:\w+\.)*({'|'.join(_INPUT_ERRORS)}): (.+)$", str(err), re.MULTILINE)
    if found:
        name, message = found[-1]
        return _INPUT_ERRORS[name](re.sub(r" \[while running .*\]$", "", message))
    if str(err).startswith("the Beam pipeline failed"):
        return TokenizationFailed(f"{err} (Beam's log: {log})")
    last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return TokenizationFailed(f"the Beam pipeline failed: {last} (Beam's log: {log})")
