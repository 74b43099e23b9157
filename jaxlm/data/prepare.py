"""Offline preparation for every objective: corpora -> tokenized documents (cached in chunks, so an
interrupted run continues) -> the objective's rows in ArrayRecord shards + a manifest."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Sequence

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter
from tqdm.auto import tqdm

from jaxlm import families
from jaxlm.data.layouts import Row, build_rows, check_roles, encode_row
from jaxlm.data.settings import PREPARATION_FIELDS, DataConfig, data_settings
from jaxlm.data.sources import read_source
from jaxlm.data.tokenizers.roles import special_ids, word_start_table

FORMAT = "jaxlm.rows.v1"
RECORD = "little-endian int32 [label, len_a, n, *tokens (n), *sentence_starts]"
MANIFEST = "manifest.json"
DOCUMENTS = "documents.json"
WORD_STARTS = "word_starts.npy"
SPLITS = ("train", "valid")
CHUNK_DOCUMENTS = 500
_TOKENIZE_BATCH = 4096


def split_documents(n: int, valid_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded shuffle of range(n) cut into (train, valid); valid has >= 1 document if fraction > 0."""
    order = np.random.default_rng([seed, 0]).permutation(n)
    n_valid = min(n - 1, max(1, round(n * valid_fraction))) if valid_fraction > 0 else 0
    return np.sort(order[n_valid:]), np.sort(order[:n_valid])


@contextlib.contextmanager
def deferred_interrupts():
    """Ctrl-C inside the block raises KeyboardInterrupt at the next call of the yielded check, not
    wherever Python happens to be: raised inside JAX's garbage-collection hook it would be ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield lambda: None
        return
    pressed = []
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))

    def check():
        if pressed:
            raise KeyboardInterrupt

    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)
    check()


def tokenize_chunk(documents: Sequence[Sequence[str]], tokenizer, bar, check=lambda: None) -> dict[str, np.ndarray]:
    """Documents of sentences as flat ids + sentence lengths + sentences per document."""
    sentences = [s for doc in documents for s in doc]
    ids: list[list[int]] = []
    for start in range(0, len(sentences), _TOKENIZE_BATCH):
        batch = sentences[start:start + _TOKENIZE_BATCH]
        ids.extend(tokenizer.encode_batch(batch))
        bar.update(len(batch))
        check()
    flat = np.fromiter((t for s in ids for t in s), np.int32, sum(map(len, ids)))
    return {"ids": flat, "sentence_lengths": np.array([len(s) for s in ids], np.int32),
            "doc_sentences": np.array([len(d) for d in documents], np.int32)}


def chunk_documents(chunk: dict[str, np.ndarray]) -> list[list[list[int]]]:
    sentences = np.split(chunk["ids"], np.cumsum(chunk["sentence_lengths"])[:-1]) if len(chunk["sentence_lengths"]) else []
    bounds = np.r_[0, np.cumsum(chunk["doc_sentences"])]
    return [[s.tolist() for s in sentences[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]


def write_shards(rows: Sequence[Row], directory: Path, split: str, shard_size: int,
                 progress: bool = True) -> list[str]:
    n_shards = max(1, -(-len(rows) // shard_size))
    names = [f"{split}-{i:05d}-of-{n_shards:05d}.array_record" for i in range(n_shards)]
    with tqdm(total=len(rows), desc=f"write {split}", unit="ex", disable=not progress) as bar:
        for i, name in enumerate(names):
            writer = ArrayRecordWriter(str(directory / name), "group_size:1")
            for row in rows[i * shard_size:(i + 1) * shard_size]:
                writer.write(encode_row(row))
            writer.close()
            bar.update(min(shard_size, len(rows) - i * shard_size))
    return names


def _check_arguments(data: DataConfig, output_dir: Path, overwrite: bool) -> None:
    if data.max_seq_length < 5:
        raise ValueError(f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]), got {data.max_seq_length}")
    if not 0.0 <= data.short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {data.short_seq_prob}")
    if data.dupe_factor < 1 or data.shard_size < 1:
        raise ValueError(f"dupe_factor and shard_size must be >= 1, got {data.dupe_factor} and {data.shard_size}")
    if not 0.0 <= data.valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in [0, 1), got {data.valid_fraction}")
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"output_dir {output_dir} exists and is not a directory")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
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


def partial_dir(output_dir: Path) -> Path:
    """Where an unfinished preparation of output_dir keeps its work (tokenized chunks) to continue from."""
    return output_dir.with_name(f".{output_dir.name}.partial")


def _open_work(work: Path, settings: dict, progress: bool) -> None:
    """Keeps the work of an interrupted run with the same settings; starts over otherwise."""
    key = json.dumps(settings, sort_keys=True)
    stamp = work / "settings.json"
    if work.is_dir() and stamp.is_file() and stamp.read_text() == key:
        done = len(list(work.glob("tokens-*.npz")))
        if progress and done:
            print(f"continuing an interrupted preparation: {done} tokenized chunk(s) in {work}")
        shutil.rmtree(work / "out", ignore_errors=True)
        return
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    work.chmod(0o755)
    stamp.write_text(key)


def _tokenized_sources(sources: list[tuple[list[list[str]], dict]], tokenizer, work: Path,
                       progress: bool, check) -> list[list[list[int]]]:
    """Every source's documents tokenized, chunk by chunk; chunks already in `work` are read back."""
    plan = [(s, c, docs[c:c + CHUNK_DOCUMENTS]) for s, (docs, _) in enumerate(sources)
            for c in range(0, len(docs), CHUNK_DOCUMENTS)]
    path = lambda s, c: work / f"tokens-{s:03d}-{c // CHUNK_DOCUMENTS:05d}.npz"
    todo = sum(len(sent) for s, c, docs in plan if not path(s, c).is_file() for sent in docs)
    out: list[list[list[int]]] = []
    with tqdm(total=todo, desc="tokenize", unit="sent", disable=not progress) as bar:
        for s, c, docs in plan:
            target = path(s, c)
            if not target.is_file():
                tmp = target.with_name(target.stem + ".tmp.npz")
                np.savez(tmp, **tokenize_chunk(docs, tokenizer, bar, check))
                os.replace(tmp, target)
            with np.load(target) as chunk:
                out.extend(chunk_documents(dict(chunk)))
    return out


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
            "tokenizer_fingerprint": tokenizer.fingerprint(), "inputs": [_input_name(p) for p in input_files]}


def already_prepared(output_dir, settings: dict) -> bool:
    """True when output_dir holds data prepared with `settings`; False when it holds no manifest;
    ValueError naming each difference when it holds other data."""
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        return False
    manifest = json.loads(path.read_text())
    differing = {k: (manifest.get(k), v) for k, v in settings.items() if manifest.get(k) != v}
    if differing:
        details = "; ".join(f"{k}: prepared {old!r}, config {new!r}" for k, (old, new) in differing.items())
        raise ValueError(f"{output_dir} holds data prepared with other settings ({details}); "
                         "pass --overwrite to rebuild it or choose another data.prepared_dir")
    return True


def prepare(input_files: Sequence[str | os.PathLike], output_dir: str | os.PathLike, tokenizer, *,
            family: str = "bert", data: DataConfig | None = None, progress: bool = True, overwrite: bool = False,
            **settings) -> dict:
    """Writes `family`'s train/valid rows as array_record shards, manifest.json, documents.json and
    word_starts.npy. Inputs: sentence-per-line text files, JSONL files or `tfds:` specs. The
    settings are `data` (default: DataConfig's defaults) with `settings` (DataConfig fields) on top.

    Interrupted (Ctrl-C, a crash), it leaves output_dir as it was and its tokenized chunks in
    `partial_dir(output_dir)`; the same call again continues from them."""
    output_dir = Path(output_dir)
    if not input_files:
        raise ValueError("no input files given")
    missing = [str(p) for p in input_files if not str(p).startswith("tfds:") and not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"input file(s) not found: {', '.join(missing)}")
    data = data_settings(data, **settings)
    registered = families.get(family)
    _check_arguments(data, output_dir, overwrite)
    special = special_ids(tokenizer)
    check_roles(registered.roles, special, family)
    seed = data.seed
    sources = [read_source(p, data.text_field, data.tfds_data_dir or None) for p in input_files]
    n_docs = sum(len(docs) for docs, _ in sources)
    names = ", ".join(map(str, input_files))
    if n_docs == 0:
        raise ValueError(f"empty corpus: no non-empty documents in {names} (expected UTF-8, one sentence "
                         "per line, blank line between documents; or JSONL with a text field)")
    if n_docs < 2:
        raise ValueError(f"the corpus has only {n_docs} document; a train and a held-out split need at least 2 "
                         "(separate documents with a blank line)")
    origin = [(s, d) for s, (docs, _) in enumerate(sources) for d in range(len(docs))]
    split_ids = dict(zip(SPLITS, split_documents(n_docs, data.valid_fraction, seed)))
    recorded_settings = preparation_settings(input_files, tokenizer, family, data)
    manifest = {"format": FORMAT, "record": RECORD, **recorded_settings,
                "sources": [info | {"documents": len(docs)} for docs, info in sources],
                "vocab_size": int(tokenizer.vocab_size), "special_ids": special, "splits": {}}

    work = partial_dir(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    _open_work(work, recorded_settings | {"input_stats": [_input_stat(p) for p in input_files]}, progress)
    with deferred_interrupts() as check:
        tokenized = _tokenized_sources(sources, tokenizer, work, progress, check)
        tmp = work / "out"
        tmp.mkdir()
        tmp.chmod(0o755)
        for k, (split, ids) in enumerate(split_ids.items()):
            if len(ids) == 0:
                continue
            rows = build_rows(registered.layout, [tokenized[i] for i in ids], np.random.default_rng([seed, 1, k]),
                              data, special)
            check()
            order = np.random.default_rng([seed, 2, k]).permutation(len(rows))
            rows = [rows[i] for i in order]
            manifest["splits"][split] = {
                "documents": len(ids), "examples": len(rows), "tokens": int(sum(len(r.tokens) for r in rows)),
                **({"random_next": int(sum(r.label for r in rows))} if registered.layout == "nsp_pairs" else {}),
                "shards": write_shards(rows, tmp, split, data.shard_size, progress),
            }
    np.save(tmp / WORD_STARTS, word_start_table(tokenizer))
    recorded = {split: [list(origin[i]) for i in ids] for split, ids in split_ids.items()}
    (tmp / DOCUMENTS).write_text(json.dumps(recorded))
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    _replace_dir(tmp, output_dir)
    shutil.rmtree(work)
    return manifest

