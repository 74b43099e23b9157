"""Offline preparation for every objective, streaming: corpora cut into pieces -> tokenized pieces on
disk (in this process, or by Apache Beam workers; finished pieces kept, so an interrupted run
continues) -> the objective's rows, spilled in creation order, shuffled into ArrayRecord shards +
a manifest. Memory is bounded by a piece and per-document offsets, not by the corpus."""
from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxlm import families, file_lock, interrupts
from jaxlm.data.layouts import build_rows, check_roles, record_dtype
from jaxlm.data.pieces import Piece, is_tfds, piece_documents, plan_pieces, source_documents, source_info
from jaxlm.data.records import PREPARE_AGAIN, write_shards
from jaxlm.data.settings import PREPARATION_FIELDS, DataConfig, check_data, data_settings
from jaxlm.data.sources import tfds_dir
from jaxlm.data.tokenized import (Documents, RowSpill, TokenizedCorpus, piece_done, piece_path, sentence_space,
                                  tokenize_piece)
from jaxlm.data.tokenizers.roles import special_ids, word_start_table
from jaxlm.jsonfile import read_json

# in a manifest of byte-level BPE rows: its sentences kept the space before them (`sentence_space`); data prepared
# before that has none, and is refused
SPACED = "sentences_spaced"
FORMAT = "jaxlm.rows.v2"
FORMAT_V1 = "jaxlm.rows.v1"  # the same record always in int32, no record_dtype; still read
RECORD = "little-endian record_dtype [label, len_a, n, *tokens (n), *sentence_starts]"
MANIFEST = "manifest.json"
DOCUMENTS = "documents.json"
WORD_STARTS = "word_starts.npy"
SPLITS = ("train", "valid")


def split_documents(n: int, valid_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded shuffle of range(n) cut into (train, valid); valid has >= 1 document if fraction > 0."""
    order = np.random.default_rng([seed, 0]).permutation(n)
    n_valid = min(n - 1, max(1, round(n * valid_fraction))) if valid_fraction > 0 else 0
    return np.sort(order[n_valid:]), np.sort(order[:n_valid])


class _Shuffled(Sequence):
    """A spill's records in the order of `order`."""

    def __init__(self, spill: RowSpill, order: np.ndarray):
        self._spill, self._order = spill, order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, k: int) -> bytes:
        return self._spill.record(int(self._order[k]))


def _check_arguments(data: DataConfig, input_files: list, output_dir: Path, overwrite: bool) -> None:
    """Refuses an output_dir that replacing would lose anything in: files that are not a prepared dataset (which
    `overwrite` does not delete either), or the inputs themselves."""
    check_data(data)
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"output_dir {output_dir} is a file, not a directory; choose another output_dir "
                              "(data.prepared_dir)")
    inside = [str(p) for p in input_files if not is_tfds(p) and Path(p).resolve().is_relative_to(output_dir.resolve())]
    if inside:
        raise FileExistsError(f"output_dir {output_dir} holds the input {inside[0]}, which preparing would delete; "
                              "choose another output_dir (data.prepared_dir)")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        if not (output_dir / "manifest.json").is_file():
            raise FileExistsError(f"output_dir {output_dir} holds files and is not a prepared dataset (no "
                                  "manifest.json), so they are not replaced; choose an empty or a new output_dir "
                                  "(data.prepared_dir)")
        if not overwrite:
            raise FileExistsError(
                f"output_dir {output_dir} already exists and is not empty; pass overwrite=True "
                "(CLI: --overwrite) to replace it, or choose another output_dir")


def _replace_dir(tmp: Path, output_dir: Path) -> None:
    old = None
    if output_dir.exists():
        old = output_dir.with_name(f".{output_dir.name}.old-{os.getpid()}")
        os.replace(output_dir, old)
    os.replace(tmp, output_dir)
    if old is not None:
        shutil.rmtree(old)


@contextlib.contextmanager
def _preparing(output_dir: Path):
    """Holds the lock of output_dir's preparation (`.NAME.lock` beside it, deleted as it ends) for the block; a
    ValueError where another process holds it: two preparations of one folder would write each other's pieces and
    rows."""
    lock = lock_path(output_dir)
    fd, holder = file_lock.take(lock)
    if fd is None:
        raise ValueError(f"{output_dir} is being prepared by {holder} (its lock {lock}); wait for it to end, or "
                         "give another data.prepared_dir")
    try:
        yield
    finally:
        file_lock.release(lock, fd)


def lock_path(output_dir: Path) -> Path:
    """The lock file a preparation of output_dir holds."""
    return output_dir.with_name(f".{output_dir.name}.lock")


def partial_dir(output_dir: Path) -> Path:
    """Where an unfinished preparation of output_dir keeps its work (tokenized pieces) to continue from."""
    return output_dir.with_name(f".{output_dir.name}.partial")


def _open_work(work: Path, settings: dict, progress: bool) -> None:
    """Keeps the work of an interrupted run with the same settings; starts over otherwise."""
    key = json.dumps(settings, sort_keys=True)
    stamp = work / "settings.json"
    if work.is_dir() and stamp.is_file() and stamp.read_text() == key:
        done = len(list(work.glob("piece-*.documents")))
        if progress and done:
            print(f"continuing an interrupted preparation: {done} tokenized piece(s) in {work}")
        shutil.rmtree(work / "out", ignore_errors=True)
        return
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    work.chmod(0o755)
    stamp.write_text(key)


def tokenize_pieces(pieces: Sequence[Piece], inputs: Sequence, tokenizer, work: Path, data: DataConfig,
                    progress: bool = True, check=lambda: None) -> None:
    """Tokenizes each piece not yet in `work`, one after the other in this process."""
    tfds_root = tfds_dir(data.tfds_data_dir)
    todo = [p for p in pieces if not piece_done(work, p)]
    with tqdm(total=len(todo), desc="tokenize", unit="piece", disable=not progress or not todo) as bar:
        for piece in todo:
            documents = piece_documents(inputs[piece.source], piece, data.text_field, tfds_root, data.undecodable)
            tokenize_piece(documents, tokenizer, piece_path(work, piece), check)
            bar.update()


def _check_documents(inputs: Sequence, data: DataConfig) -> None:
    """ValueError unless the corpus has two documents (read until it does: no tokenization yet)."""
    tfds_root = tfds_dir(data.tfds_data_dir)
    # a line left out here is told when its piece is tokenized
    found = itertools.islice((d for p in inputs for d in source_documents(p, data.text_field, tfds_root,
                                                                         data.undecodable, lambda _: None)), 2)
    n_docs = sum(1 for _ in found)
    names = ", ".join(map(str, inputs))
    if n_docs == 0:
        raise ValueError(f"empty corpus: no non-empty documents in {names} (expected UTF-8, one sentence "
                         "per line, blank line between documents; or JSONL with a text field)")
    if n_docs < 2:
        raise ValueError(f"the corpus has only {n_docs} document; a train and a held-out split need at least 2 "
                         "(separate documents with a blank line)")


def _empty_split(split: str, documents: int, corpus_documents: int, valid_fraction: float) -> str:
    """What to say of a split whose documents made no rows."""
    fix = ("give data.corpus more text, or a larger data.valid_fraction (now "
           f"{valid_fraction:g})") if split == "valid" else "give data.corpus more text"
    return (f"the {split} split came out empty: its {documents} document(s) of the corpus's {corpus_documents} "
            f"made 0 rows; {fix}")


def _write_documents_json(path: Path, splits: dict, source_of: np.ndarray, index_in_source: np.ndarray) -> None:
    """documents.json ({split: [[source, document], ...]}) written a block at a time."""
    with open(path, "w") as f:
        f.write("{")
        for n, (split, ids) in enumerate(splits.items()):
            f.write(f"{', ' if n else ''}{json.dumps(split)}: [")
            for start in range(0, len(ids), 65536):
                block = ids[start:start + 65536]
                pairs = ", ".join(f"[{s}, {d}]" for s, d in zip(source_of[block].tolist(), index_in_source[block].tolist()))
                f.write((", " if start else "") + pairs)
            f.write("]")
        f.write("}")


def _input_name(source) -> str:
    return source if isinstance(source, str) else str(Path(source).resolve())


def _input_stat(source) -> str:
    if isinstance(source, str):
        return source
    stat = Path(source).stat()
    return f"{_input_name(source)}:{stat.st_size}:{stat.st_mtime_ns}"


def preparation_settings(input_files, tokenizer, family: str, data: DataConfig) -> dict:
    """What a manifest records of how its data was made; equal settings give equal data."""
    return {"family": family, "layout": families.get(family).layout,
            **{name: getattr(data, name) for name in PREPARATION_FIELDS},
            "tokenizer_fingerprint": tokenizer.fingerprint(), "inputs": [_input_name(p) for p in input_files],
            **({SPACED: True} if sentence_space(tokenizer) else {})}


def already_prepared(output_dir, settings: dict) -> bool:
    """True when output_dir holds data prepared with `settings`; False when it holds no manifest;
    ValueError naming each difference when it holds other data."""
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        return False
    manifest = read_json(path)
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} is not a JSON object: the prepared data is damaged; {PREPARE_AGAIN}")
    differing = {k: (manifest.get(k), v) for k, v in settings.items() if manifest.get(k) != v}
    if differing:
        details = "; ".join(f"{k}: prepared {old!r}, config {new!r}" for k, (old, new) in differing.items())
        raise ValueError(f"{output_dir} holds data prepared with other settings ({details}); "
                         "pass --overwrite to rebuild it or choose another data.prepared_dir")
    for source in manifest.get("sources", []):
        path = Path(source.get("path", ""))
        if "bytes" not in source or not path.is_file():
            continue
        stat = path.stat()
        if stat.st_size != source["bytes"]:
            change = f"{source['bytes']} bytes, now {stat.st_size}"
        elif source.get("mtime_ns", stat.st_mtime_ns) != stat.st_mtime_ns:  # no mtime_ns: a manifest from before
            change = f"modified {_time(source['mtime_ns'])}, now {_time(stat.st_mtime_ns)}"
        else:
            continue
        raise ValueError(f"{path} has changed since {output_dir} was prepared from it ({change}); pass --overwrite "
                         "to rebuild it")
    return True


def _time(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).isoformat(sep=" ", timespec="milliseconds")


def prepare(input_files: Sequence[str | os.PathLike], output_dir: str | os.PathLike, tokenizer, *,
            family: str = "bert", data: DataConfig | None = None, progress: bool = True, overwrite: bool = False,
            runner: str | None = None, beam_args: Sequence[str] = (), **settings) -> dict:
    """Writes `family`'s train/valid rows as array_record shards, manifest.json, documents.json and
    word_starts.npy. Inputs: sentence-per-line text files, JSONL files or `tfds:` specs. The
    settings are `data` (default: DataConfig's defaults) with `settings` (DataConfig fields) on top.
    With a Beam `runner` (e.g. "direct", with `beam_args` such as ["--direct_num_workers=2"]) the
    pieces are tokenized by an Apache Beam pipeline; the output is the same whoever tokenizes.

    Interrupted (Ctrl-C, a crash), it leaves output_dir as it was and its tokenized pieces in
    `partial_dir(output_dir)`; the same call again continues from them."""
    output_dir = Path(output_dir)
    if not input_files:
        raise ValueError("no input files given")
    missing = [str(p) for p in input_files if not is_tfds(p) and not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"input file(s) not found: {', '.join(missing)}")
    data = data_settings(data, **settings)
    registered = families.get(family)
    _check_arguments(data, input_files, output_dir, overwrite)
    if runner:
        # Beam takes seconds to import and only a Beam preparation needs it
        from jaxlm.data.beam import check_beam_args, tokenize_on_beam
        check_beam_args(runner, beam_args)
    special = special_ids(tokenizer)
    check_roles(registered.roles, special, family, data)
    _check_documents(input_files, data)
    seed = data.seed
    sources = [source_info(p, tfds_dir(data.tfds_data_dir)) for p in input_files]  # as they are before reading
    recorded_settings = preparation_settings(input_files, tokenizer, family, data)
    with _preparing(output_dir):
        work = partial_dir(output_dir)
        _open_work(work, recorded_settings | {"input_stats": [_input_stat(p) for p in input_files],
                                              "piece_mb": data.piece_mb}, progress)
        pieces = [piece for s, source in enumerate(input_files)
                  for piece in plan_pieces(s, source, tfds_dir(data.tfds_data_dir), piece_mb=data.piece_mb)]
        with interrupts.deferred() as check:
            if runner:
                tokenize_on_beam(pieces, input_files, tokenizer, work, data, runner, beam_args, check)
            else:
                tokenize_pieces(pieces, input_files, tokenizer, work, data, progress, check)
            corpus = TokenizedCorpus(work, pieces)
            source_of = np.repeat([p.source for p in pieces], corpus.piece_documents).astype(np.int32)
            per_source = np.bincount(source_of, minlength=len(input_files))
            index_in_source = np.arange(len(corpus)) - np.r_[0, np.cumsum(per_source)][source_of]
            split_ids = dict(zip(SPLITS, split_documents(len(corpus), data.valid_fraction, seed)))
            dtype = record_dtype(tokenizer.vocab_size, data.max_seq_length)
            manifest = {"format": FORMAT, "record": RECORD, **recorded_settings,
                        "sources": [source | {"documents": int(n)} for source, n in zip(sources, per_source)],
                        "vocab_size": int(tokenizer.vocab_size), "special_ids": special, "record_dtype": dtype,
                        "splits": {}}
            tmp = work / "out"
            tmp.mkdir()
            tmp.chmod(0o755)
            for k, (split, ids) in enumerate(split_ids.items()):
                if len(ids) == 0:
                    continue
                with RowSpill(work / f"rows-{split}.bin", dtype) as spill, \
                        tqdm(desc=f"rows {split}", unit="row", disable=not progress) as bar:
                    rng = np.random.default_rng([seed, 1, k])
                    for row in build_rows(registered.layout, Documents(corpus, ids), rng, data, special):
                        spill.append(row)
                        bar.update()
                        check()
                    spill.seal()
                    if len(spill) == 0:
                        raise ValueError(_empty_split(split, len(ids), len(corpus), data.valid_fraction))
                    order = np.random.default_rng([seed, 2, k]).permutation(len(spill))
                    manifest["splits"][split] = {
                        "documents": len(ids), "examples": len(spill), "tokens": spill.tokens,
                        **({"random_next": spill.labels} if registered.layout == "nsp_pairs" else {}),
                        "shards": write_shards(_Shuffled(spill, order), tmp, split, data.shard_size, progress),
                    }
                os.remove(work / f"rows-{split}.bin")
            corpus.close()
        np.save(tmp / WORD_STARTS, word_start_table(tokenizer))
        _write_documents_json(tmp / DOCUMENTS, split_ids, source_of, index_in_source)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _replace_dir(tmp, output_dir)
        shutil.rmtree(work)
        return manifest
