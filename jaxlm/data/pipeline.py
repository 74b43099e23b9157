"""Random-access examples of any objective and per-process batches from a prepared directory, and a
run's train and held-out splits opened from its config."""
from __future__ import annotations

import ctypes
import os
import reprlib
import signal
import threading
import time
from collections import Counter
from functools import lru_cache, partial
from pathlib import Path
from typing import Iterator

import grain
import numpy as np
from absl import flags as absl_flags

from jaxlm import families
from jaxlm.config import ConfigError, RunConfig
from jaxlm.data import transfer
from jaxlm.data.layouts import RECORD_DTYPES, Row, decode_row
from jaxlm.data.prepare import FORMAT, FORMAT_V1, MANIFEST, SPACED, WORD_STARTS
from jaxlm.data.records import PREPARE_AGAIN, ShardedRecords, unreadable
from jaxlm.data.seeds import RowGenerators
from jaxlm.data.settings import PREPARATION_FIELDS, DataConfig, data_settings
from jaxlm.data.sources import model_tokenizer
from jaxlm.data.tokenized import sentence_space
from jaxlm.jsonfile import read_json


def _whole(least: int) -> tuple:
    return (lambda value: type(value) is int and value >= least), f"a whole number of {least} or more"


_TEXT = (lambda value: isinstance(value, str)), "a string"
# what a reader takes from a manifest: each key, a test of its value and what the test asks for
MANIFEST_KEYS = {
    **dict.fromkeys(PREPARATION_FIELDS, ((lambda value: True), "")),  # any value: the run's settings must equal it
    "family": _TEXT, "layout": _TEXT, "tokenizer_fingerprint": _TEXT,
    "vocab_size": _whole(1), "max_seq_length": _whole(1), "shard_size": _whole(1),
    "special_ids": ((lambda value: isinstance(value, dict)), "a JSON object"),
    "record_dtype": ((lambda value: value in RECORD_DTYPES), f"one of {', '.join(RECORD_DTYPES)}"),
    "splits": ((lambda value: isinstance(value, dict) and all(isinstance(s, dict) for s in value.values())),
               "a JSON object of split objects")}
SPLIT_KEYS = {"examples": _whole(0),
              "shards": ((lambda value: isinstance(value, list) and all(isinstance(n, str) for n in value)),
                         "a list of file names")}


def _faults(value: dict, keys: dict, where: str = "") -> list[str]:
    """What `value` (a manifest, or its split `where`) lacks of `keys`, or holds that fails its key's test, in words."""
    return [f"has no {where}{key}" if key not in value else f"has {where}{key}={reprlib.repr(value[key])}, not {needed}"
            for key, (test, needed) in keys.items() if key not in value or not test(value[key])]


def load_manifest(data_dir: str | Path) -> dict:
    """The manifest of the data prepared in `data_dir`; ValueError naming the first thing in it a reader cannot use."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no prepared dataset at {data_dir} ({MANIFEST} missing): "
                                "run `jaxlm prepare CONFIG` first")
    manifest = read_json(path)
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} holds {reprlib.repr(manifest)}, not a JSON object: {PREPARE_AGAIN}")
    if manifest.get("format") not in (FORMAT, FORMAT_V1):
        raise ValueError(f"{path} has format {manifest.get('format')!r}, expected {FORMAT!r}: "
                         "re-run `jaxlm prepare CONFIG`")
    if manifest["format"] == FORMAT_V1:
        manifest = {"record_dtype": "<i4"} | manifest
    faults = _faults(manifest, MANIFEST_KEYS) or [
        fault for name, split in manifest["splits"].items() for fault in _faults(split, SPLIT_KEYS, f"splits.{name}.")]
    if faults:
        raise ValueError(f"{path} {faults[0]}: {PREPARE_AGAIN}")
    return manifest


def _word_starts(data_dir: Path, vocab_size: int) -> np.ndarray:
    """The word-start table prepared with the data, bool[vocab_size]; ValueError saying what to fix where it cannot
    be read or is not one."""
    path = data_dir / WORD_STARTS
    try:
        table = np.load(path, allow_pickle=False)
    except OSError as err:
        raise unreadable(path, err.strerror or str(err)) from None
    except (ValueError, EOFError):  # not a .npy file, or cut short
        raise unreadable(path, "not a NumPy array file") from None
    if not isinstance(table, np.ndarray) or table.dtype != bool or table.shape != (vocab_size,):
        raise unreadable(path, f"not the table of {vocab_size} booleans")
    return table


ID_FIELDS = ("input_ids", "masked_labels", "targets", "decoder_input_ids")
LAST_STEP = 2**62  # iterate() runs until its consumer stops
TRAINER_WATCH_S = 1.0  # how often a worker checks that its trainer is alive
PICKLE_EVERY_ARRAY = 2**62  # grain's min_shm_size: no array gets a shared memory block of grain's own
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_MMAP_THRESHOLD = 32 << 20  # glibc's largest: a batch's arrays come from the heap, not mappings of their own
HEAP_TRIM_THRESHOLD = 1 << 30  # the free heap a worker keeps for its next batches rather than handing back


def _start_worker(worker_index: int, worker_count: int, trainer_pid: int) -> None:
    """In a grain worker: Ctrl-C and SIGTERM reach the whole process group, but only the trainer acts on
    them (it saves, then closes the workers); a worker that died of them would end the run first. The
    worker's index picks its row of the trainer's slots. `trainer_pid` comes from the trainer, not from
    `os.getppid()` here: a trainer killed while this worker was still starting is already gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    transfer.set_worker_index(worker_index)
    _reuse_freed_memory()
    threading.Thread(target=_exit_with_the_trainer, args=(trainer_pid,), name="jaxlm-trainer-watch",
                     daemon=True).start()


def _reuse_freed_memory() -> None:
    """In a grain worker on glibc: the memory a batch freed serves the next batch. By default glibc hands
    the heap's freed top back to the OS after each batch and the next one faults it in again, page by page:
    150-730 page faults per GPT-2 batch at 512. With them, 2 workers built 1.6x the batches of one; without, 1.86x."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:  # glibc or musl (which ignores it); not macOS
        mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD)


def _exit_with_the_trainer(trainer_pid: int) -> None:
    """In a grain worker: ends the process once the trainer's is gone (killed, say), where grain's worker
    would go on waiting to hand over its next batch."""
    while os.getppid() == trainer_pid:
        time.sleep(TRAINER_WATCH_S)
    os._exit(1)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system keeps one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_workers(workers: int, setting: str, processes: str = "loader processes",
                  zero: str = " (0: one background thread)") -> None:
    """Refuse more worker processes than cores: each works flat out (a loader's also opens the split).
    `setting` names it as typed: "data.workers=" or "--workers "; `zero` says what 0 means, if anything."""
    cores = usable_cores()
    if workers > cores:
        raise ConfigError(f"{setting}{workers} asks for more {processes} than the {cores} cores this process "
                          f"may use: give at most {cores}{zero}")


def _in_worker_processes(stream: grain.IterDataset, workers: int, prefetch: int,
                         ring: transfer.SlotRing | None) -> grain.IterDataset:
    """`stream`'s elements built by `workers` grain processes that take them in turn, `prefetch` ahead each,
    and sent back through `ring`'s slots (pickled through grain's pipe where there is no ring)."""
    if not absl_flags.FLAGS.is_parsed():  # grain 0.2.18 reads its absl flags (google/grain#1355)
        absl_flags.FLAGS.mark_as_parsed()
    if ring is not None:
        stream = stream.map(ring.send)
    # what is not in a slot is pickled, not put in shared memory blocks of grain's (which 0.2.18 leaks)
    stream = grain.experimental.WithOptionsIterDataset(
        stream, grain.experimental.DatasetOptions(min_shm_size=PICKLE_EVERY_ARRAY))
    stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers,
                                                             per_worker_buffer_size=max(1, prefetch)),
                                worker_init_fn=partial(_start_worker, trainer_pid=os.getpid()))
    return stream if ring is None else stream.map(ring.receive)


def _check_processes(global_batch: int, process_index: int, process_count: int) -> None:
    if global_batch % process_count:
        raise ValueError(f"global_batch {global_batch} is not divisible by process_count {process_count}")
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")


def _check(manifest: dict, key: str, expected, data_dir) -> None:
    if expected is not None and manifest[key] != expected:
        raise ValueError(f"{key} mismatch: the data in {data_dir} was prepared with {manifest[key]!r}, "
                         f"but this run uses {expected!r}; re-run `jaxlm prepare CONFIG` "
                         "(with --overwrite) for this tokenizer and sequence length")


def _check_preparation(manifest: dict, family, data: DataConfig, data_dir) -> None:
    """A run's settings that made the stored rows (those its objective reads, and the corpus's split) must be the
    manifest's: the transform and the model's shapes are built from the run's."""
    read = [name for name in PREPARATION_FIELDS
            if name in family.data_settings or name not in families.OBJECTIVE_SETTINGS]
    differing = [f"data.{name}: prepared {manifest[name]!r}, this run {getattr(data, name)!r}"
                 for name in read if manifest[name] != getattr(data, name)]
    if differing:
        raise ValueError(f"the data in {data_dir} was prepared with other settings ({'; '.join(differing)}); "
                         "re-run `jaxlm prepare CONFIG --overwrite`, or give this run the prepared values")


class PretrainingData:
    """One split of a prepared dataset; every example is a pure function of (seed, epoch, index).

    `family` picks the transform (default: the family the data was prepared for; any family
    sharing its layout may read it); the transform's settings are `data` (default: DataConfig's
    defaults) with `settings` (DataConfig fields, e.g. max_predictions) on top."""

    def __init__(self, data_dir: str | Path, split: str, *, seed: int, family: str | None = None,
                 tokenizer_fingerprint: str | None = None, vocab_size: int | None = None,
                 max_seq_length: int | None = None, data: DataConfig | None = None, **settings):
        self._opened_with = ((data_dir, split), dict(
            seed=seed, family=family, tokenizer_fingerprint=tokenizer_fingerprint, vocab_size=vocab_size,
            max_seq_length=max_seq_length, data=data, **settings))
        self.data_dir = Path(data_dir)
        self.manifest = load_manifest(self.data_dir)
        _check(self.manifest, "tokenizer_fingerprint", tokenizer_fingerprint, data_dir)
        _check(self.manifest, "vocab_size", vocab_size, data_dir)
        _check(self.manifest, "max_seq_length", max_seq_length, data_dir)
        self.family = families.get(family or self.manifest["family"])
        if self.family.layout != self.manifest["layout"]:
            raise ValueError(f"{data_dir} was prepared for model.family={self.manifest['family']} "
                             f"({self.manifest['layout']} rows), but this run is model.family={self.family.name}; "
                             "re-run `jaxlm prepare CONFIG` with a data.prepared_dir of its own")
        if data is not None:
            _check_preparation(self.manifest, self.family, data, data_dir)
        splits = self.manifest["splits"]
        if split not in splits:
            raise ValueError(f"split {split!r} not in {data_dir}; available: {sorted(splits)}")
        if splits[split]["examples"] == 0:
            raise ValueError(f"split {split!r} of {data_dir} has no examples")
        self.split, self.seed = split, seed
        self.max_seq_length = self.manifest["max_seq_length"]
        # the settings that made the stored rows are the manifest's
        self.settings = data_settings(data, **settings | {k: self.manifest[k] for k in PREPARATION_FIELDS})
        table = _word_starts(self.data_dir, self.manifest["vocab_size"])
        self._transform = self.family.transform(self.manifest, table, self.settings)
        self._records = ShardedRecords([self.data_dir / name for name in splits[split]["shards"]],
                                       self.manifest["shard_size"], splits[split]["examples"])
        self._len = len(self._records)
        self.permutation = lru_cache(maxsize=2)(self._permutation)

    def __len__(self) -> int:
        return self._len

    def check_shards(self) -> None:
        """ValueError naming the first of the split's shards that cannot be read (cut short, missing)."""
        self._records.check()

    def __reduce__(self):
        """Pickled as how it was opened: a grain worker process opens its own copy of the split."""
        args, kwargs = self._opened_with
        return partial(PretrainingData, **kwargs), args

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self._len)

    def _make(self, records: list[bytes], indices, epoch: int) -> dict[str, np.ndarray]:
        """The examples of `records` (stacked); each one's randomness comes from (seed, epoch, its index) alone."""
        return self._transform(self._rows(records), RowGenerators(self.seed, epoch, indices))

    def _rows(self, records: list[bytes]) -> list[Row]:
        dtype = self.manifest["record_dtype"]
        return [decode_row(r, dtype) for r in records]

    def raw(self, index: int) -> Row:
        """The stored row of example `index`, before this epoch's masking or corruption."""
        return self._rows([self._records[int(index)]])[0]

    def example(self, index: int, epoch: int) -> dict[str, np.ndarray]:
        """Example `index` as transformed in `epoch` (for BERT, nsp_label 1 means B is a random sentence)."""
        return {k: v[0] for k, v in self._make([self._records[int(index)]], [index], epoch).items()}

    def steps_per_epoch(self, global_batch: int) -> int:
        if global_batch > self._len:
            raise ValueError(f"global_batch {global_batch} is larger than the {self.split} split "
                             f"({self._len} examples); lower the batch size or prepare more data")
        return self._len // global_batch

    def batch_indices(self, step: int, global_batch: int) -> tuple[int, np.ndarray]:
        """(epoch, example indices) of global batch `step`; each epoch's tail remainder is dropped."""
        per_epoch = self.steps_per_epoch(global_batch)
        epoch, within = divmod(step, per_epoch)
        return epoch, self.permutation(epoch)[within * global_batch:(within + 1) * global_batch].copy()

    def local_batch(self, step: int, global_batch: int, process_index: int = 0,
                    process_count: int = 1) -> dict[str, np.ndarray]:
        """This process's contiguous slice of global batch `step`, stacked."""
        _check_processes(global_batch, process_index, process_count)
        epoch, indices = self.batch_indices(step, global_batch)
        per = global_batch // process_count
        indices = indices[process_index * per:(process_index + 1) * per]
        records = self._records.read(indices)
        return self._make(records, indices, epoch)

    def iterate(self, start_step: int, global_batch: int, process_index: int = 0, process_count: int = 1,
                prefetch: int = 2, workers: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """This process's batches of steps start_step, start_step + 1, ... through grain: a MapDataset
        of steps whose element is `local_batch(step)`, built `prefetch` ahead by a thread, or by
        `workers` processes (each opens its own copy of this split) that take the steps in turn and hand
        each batch over in shared memory (`transfer.SlotRing`).

        An element is a whole batch, not an example, because the transforms are vectorised over the batch
        (each row still drawn from its own (seed, epoch, index) generator); the batches are the same
        for any number of workers, and the step is the whole position to resume from."""
        self.steps_per_epoch(global_batch)
        _check_processes(global_batch, process_index, process_count)
        build = partial(self.local_batch, global_batch=global_batch, process_index=process_index,
                        process_count=process_count)
        steps = grain.MapDataset.range(start_step, start_step + LAST_STEP).map(build)
        stream = steps.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=max(1, prefetch)))
        ring = transfer.SlotRing.for_batches(workers, self.slot_bytes(global_batch // process_count)) \
            if workers else None
        try:
            iterator = iter(_in_worker_processes(stream, workers, prefetch, ring) if workers else stream)
            try:
                for batch in iterator:  # not `yield from`, which would close the iterator before the ring
                    yield batch
            finally:
                if ring is not None:
                    ring.close()  # a worker waiting for a slot stops waiting
                iterator.close()
        finally:
            if ring is not None:
                ring.unlink()

    def slot_bytes(self, rows: int) -> int:
        """The bytes a batch of `rows` examples takes in a slot (`transfer.layout`), from one example's fields."""
        example = self.example(0, 0)
        return transfer.layout({k: np.broadcast_to(v, (rows, *v.shape)) for k, v in example.items()})[1]

    def show(self, n: int, tokenizer) -> list[dict]:
        """The first n examples of epoch 0 in visiting order, JSON-friendly, as the model sees them;
        every id field also as tokens."""
        rows = []
        for index in self.permutation(0)[:n]:
            ex = self.example(int(index), 0)
            row = {"index": int(index)}
            for key, value in ex.items():
                row[key] = value.tolist()
                if key in ID_FIELDS:
                    row[key.removesuffix("_ids").removesuffix("s") + "_tokens"] = (
                        tokenizer.convert_ids_to_tokens(value.tolist()))
            rows.append(row)
        return rows


def open_splits(config: RunConfig) -> tuple[object, PretrainingData, PretrainingData]:
    """(tokenizer, train split, held-out split) of the prepared data, validated against the tokenizer and the
    model before any compute."""
    tokenizer = model_tokenizer(config)
    splits = [PretrainingData(config.data.prepared_dir, split, seed=config.data.seed, family=config.model.family,
                              tokenizer_fingerprint=tokenizer.fingerprint(), vocab_size=tokenizer.vocab_size,
                              max_seq_length=config.data.max_seq_length, data=config.data)
              for split in ("train", "valid")]
    if sentence_space(tokenizer) and not splits[0].manifest.get(SPACED):
        raise ConfigError(f"the data in {config.data.prepared_dir} was prepared before byte-level BPE kept the space "
                          "between a document's sentences (GPT-2 read \"end.The\"); re-run `jaxlm prepare CONFIG "
                          "--overwrite`")
    return tokenizer, *splits


def open_data(config: RunConfig) -> tuple[object, PretrainingData, PretrainingData]:
    """`open_splits`, each split checked to hold the batches that training reads from it."""
    tokenizer, *splits = open_splits(config)
    if len(splits[0]) < config.train.global_batch:
        raise ConfigError(f"the train split has {len(splits[0])} examples, fewer than train.global_batch="
                          f"{config.train.global_batch}; use more text or a smaller batch")
    if config.train.eval_batches and len(splits[1]) < config.train.global_batch:
        raise ConfigError(f"the valid split has {len(splits[1])} examples, fewer than one held-out batch of "
                          f"train.global_batch={config.train.global_batch}; raise data.valid_fraction, use more "
                          "text, or set train.eval_batches=0 for no held-out evaluation")
    return tokenizer, *splits


def most_frequent_token_baseline(data: PretrainingData, epoch: int = 0, limit: int | None = None) -> float:
    """Accuracy of always predicting the split's most frequent masked label."""
    counts: Counter = Counter()
    for index in range(len(data) if limit is None else min(limit, len(data))):
        ex = data.example(index, epoch)
        counts.update(ex["masked_labels"][ex["masked_weights"] > 0].tolist())
    total = sum(counts.values())
    return counts.most_common(1)[0][1] / total if total else 0.0
