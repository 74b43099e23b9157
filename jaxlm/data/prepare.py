"""Offline BERT MLM+NSP preparation: sentence-per-line text -> tokenized pair shards + manifest."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxlm.data.pairs import Instance, create_instances

FORMAT = "jaxlm.bert_pairs.v1"
MANIFEST = "manifest.json"
DOCUMENTS = "documents.json"
SPLITS = ("train", "valid")
_TOKENIZE_CHUNK = 4096


def encode_record(instance: Instance) -> bytes:
    header = np.array([instance.is_random_next, instance.len_a], dtype="<i4")
    return header.tobytes() + np.asarray(instance.tokens, dtype="<i4").tobytes()


def decode_record(record: bytes) -> tuple[np.ndarray, int, int]:
    """-> (tokens, len_a, is_random_next)."""
    values = np.frombuffer(record, dtype="<i4")
    return values[2:].astype(np.int32), int(values[1]), int(values[0])


def read_documents(path: Path) -> list[list[str]]:
    """Documents of a sentence-per-line file; blank lines separate documents; empty ones dropped."""
    documents: list[list[str]] = [[]]
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                documents[-1].append(line)
            elif documents[-1]:
                documents.append([])
    return [d for d in documents if d]


def split_documents(n: int, valid_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded shuffle of range(n) cut into (train, valid); valid has >= 1 document if fraction > 0."""
    order = np.random.default_rng([seed, 0]).permutation(n)
    n_valid = min(n - 1, max(1, round(n * valid_fraction))) if valid_fraction > 0 else 0
    return np.sort(order[n_valid:]), np.sort(order[:n_valid])


def tokenize_documents(documents: Sequence[Sequence[str]], tokenizer, progress: bool = True
                       ) -> list[list[list[int]]]:
    sentences = [s for doc in documents for s in doc]
    ids: list[list[int]] = []
    with tqdm(total=len(sentences), desc="tokenize", unit="sent", disable=not progress) as bar:
        for start in range(0, len(sentences), _TOKENIZE_CHUNK):
            chunk = sentences[start:start + _TOKENIZE_CHUNK]
            ids.extend(tokenizer.encode_batch(chunk))
            bar.update(len(chunk))
    out, pos = [], 0
    for doc in documents:
        out.append(ids[pos:pos + len(doc)])
        pos += len(doc)
    return out


def write_shards(instances: Sequence[Instance], directory: Path, split: str, shard_size: int,
                 progress: bool = True) -> list[str]:
    from array_record.python.array_record_module import ArrayRecordWriter

    n_shards = max(1, -(-len(instances) // shard_size))
    names = [f"{split}-{i:05d}-of-{n_shards:05d}.array_record" for i in range(n_shards)]
    with tqdm(total=len(instances), desc=f"write {split}", unit="ex", disable=not progress) as bar:
        for i, name in enumerate(names):
            writer = ArrayRecordWriter(str(directory / name), "group_size:1")
            for instance in instances[i * shard_size:(i + 1) * shard_size]:
                writer.write(encode_record(instance))
            writer.close()
            bar.update(min(shard_size, len(instances) - i * shard_size))
    return names


def _check_arguments(paths: list[Path], output_dir: Path, max_seq_length: int, short_seq_prob: float,
                     dupe_factor: int, valid_fraction: float, shard_size: int, overwrite: bool) -> None:
    if not paths:
        raise ValueError("no input files given")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"input file(s) not found: {', '.join(missing)}")
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP]), got {max_seq_length}")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    if dupe_factor < 1 or shard_size < 1:
        raise ValueError(f"dupe_factor and shard_size must be >= 1, got {dupe_factor} and {shard_size}")
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"output_dir {output_dir} exists and is not a directory")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"output_dir {output_dir} already exists and is not empty; pass overwrite=True "
            "(CLI: --overwrite) to replace it, or choose another output_dir")


def _read_corpus(paths: list[Path]) -> tuple[list[list[str]], list[tuple[int, int]], list[dict]]:
    documents, origin, sources = [], [], []
    for s, path in enumerate(paths):
        docs = read_documents(path)
        documents.extend(docs)
        origin.extend((s, d) for d in range(len(docs)))
        sources.append({"path": str(path.resolve()), "bytes": path.stat().st_size,
                        "documents": len(docs)})
    if not documents:
        raise ValueError(f"empty corpus: no non-empty documents in {', '.join(map(str, paths))} "
                         "(expected UTF-8, one sentence per line, blank line between documents)")
    if len(documents) < 2:
        raise ValueError(f"the corpus has only {len(documents)} document; next-sentence pairs need "
                         "at least 2 (separate documents with a blank line)")
    return documents, origin, sources


def _replace_dir(tmp: Path, output_dir: Path) -> None:
    old = None
    if output_dir.exists():
        old = output_dir.with_name(f".{output_dir.name}.old-{os.getpid()}")
        os.replace(output_dir, old)
    os.replace(tmp, output_dir)
    if old is not None:
        shutil.rmtree(old)


def prepare(input_files: Sequence[str | os.PathLike], output_dir: str | os.PathLike, tokenizer,
            max_seq_length: int = 128, short_seq_prob: float = 0.1, dupe_factor: int = 1,
            valid_fraction: float = 0.05, seed: int = 0, shard_size: int = 100_000,
            progress: bool = True, overwrite: bool = False) -> dict:
    """Writes train/valid array_record shards of BERT pairs, manifest.json and documents.json."""
    paths = [Path(p) for p in input_files]
    output_dir = Path(output_dir)
    _check_arguments(paths, output_dir, max_seq_length, short_seq_prob, dupe_factor,
                     valid_fraction, shard_size, overwrite)
    documents, origin, sources = _read_corpus(paths)
    split_ids = dict(zip(SPLITS, split_documents(len(documents), valid_fraction, seed)))
    special = {k: int(getattr(tokenizer, k)) for k in ("pad_id", "cls_id", "sep_id", "mask_id", "unk_id")}
    manifest = {
        "format": FORMAT, "record": "little-endian int32 [is_random_next, len_a, *tokens]",
        "sources": sources, "tokenizer_fingerprint": tokenizer.fingerprint(),
        "vocab_size": int(tokenizer.vocab_size), "special_ids": special,
        "max_seq_length": max_seq_length, "short_seq_prob": short_seq_prob,
        "dupe_factor": dupe_factor, "valid_fraction": valid_fraction, "seed": seed,
        "shard_size": shard_size, "splits": {},
    }
    tokenized = tokenize_documents(documents, tokenizer, progress)

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    tmp.chmod(0o755)
    try:
        for k, (split, ids) in enumerate(split_ids.items()):
            if len(ids) == 0:
                continue
            instances = create_instances([tokenized[i] for i in ids], max_seq_length,
                                         np.random.default_rng([seed, 1, k]),
                                         cls_id=special["cls_id"], sep_id=special["sep_id"],
                                         short_seq_prob=short_seq_prob, dupe_factor=dupe_factor)
            order = np.random.default_rng([seed, 2, k]).permutation(len(instances))
            instances = [instances[i] for i in order]
            manifest["splits"][split] = {
                "documents": len(ids), "examples": len(instances),
                "tokens": int(sum(len(x.tokens) for x in instances)),
                "random_next": int(sum(x.is_random_next for x in instances)),
                "shards": write_shards(instances, tmp, split, shard_size, progress),
            }
        recorded = {split: [list(origin[i]) for i in ids] for split, ids in split_ids.items()}
        (tmp / DOCUMENTS).write_text(json.dumps(recorded))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        _replace_dir(tmp, output_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
