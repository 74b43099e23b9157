"""A split's ArrayRecord shards: its records written in order, `shard_size` to a shard, and read back as one
sequence (each shard's reader opened on first use, and kept open while the limit on open files allows)."""
import errno
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter
from tqdm.auto import tqdm

# how `jaxlm prepare` writes rows: one record per chunk for random access; uncompressed, since decompressing a
# row cost as much CPU as the rest of its reading (zstd: 2.6 ms of CPU for 256 GPT-2 rows at 512, 1.1 uncompressed)
WRITER_OPTIONS = "group_size:1,uncompressed"
READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"  # random access: read one chunk, in this thread
READ_BUFFER_BYTES = 1 << 13  # a row or two; larger buffers read (and cost) more per random record
SPARE_FILES = 256  # open files left for everything else in the process (half the room, where it is small)
PREPARE_AGAIN = "re-run `jaxlm prepare CONFIG --overwrite`"
# the fix for a prepared file that the operating system will not open, by its errno (any other: its reason alone)
OPEN_FIXES = {errno.ENOENT: PREPARE_AGAIN, errno.EISDIR: PREPARE_AGAIN,
              errno.EACCES: "give the user running jaxlm read access to it",
              errno.EMFILE: "raise the limit on open files (ulimit -n)"}


def write_shards(records: Sequence[bytes], directory: Path, split: str, shard_size: int,
                 progress: bool = True) -> list[str]:
    """`records` in order into ArrayRecord shards of `shard_size`; their names."""
    n_shards = _shard_count(len(records), shard_size)
    names = [f"{split}-{i:05d}-of-{n_shards:05d}.array_record" for i in range(n_shards)]
    with tqdm(total=len(records), desc=f"write {split}", unit="ex", disable=not progress) as bar:
        for i, name in enumerate(names):
            writer = ArrayRecordWriter(str(directory / name), WRITER_OPTIONS)
            span = _shard_span(len(records), shard_size, i)
            for k in span:
                writer.write(records[k])
            writer.close()
            bar.update(len(span))
    return names


def _shard_count(records: int, shard_size: int) -> int:
    """How many shards hold `records` (one, empty, for none)."""
    return max(1, -(-records // shard_size))


def _shard_span(records: int, shard_size: int, shard: int) -> range:
    """The indices of the records that shard `shard` holds."""
    return range(shard * shard_size, min((shard + 1) * shard_size, records))


class ShardedRecords(Sequence):
    """Records 0 .. `count` - 1 of `paths`, every shard holding `shard_size` of them but the last (as
    `write_shards` writes them); a shard that holds another number raises ValueError when first read.

    A batch's records are read one by one in the calling thread (seek, read), with the options ArrayRecord
    documents for random access. Not grain's `ArrayRecordDataSource`, whose `__getitems__` starts a Python thread
    per shard it touches and hands each shard's records to the reader's C++ thread pool: 256 GPT-2 rows at 512
    from one shard cost 1.73 ms of CPU there (1.29 ms of wall time) and 0.47 ms here (the same in wall time).

    Every shard read stays open, as many as the limit on open files lets this process hold; past that, the least
    recently read is closed."""

    def __init__(self, paths: Sequence[str | Path], shard_size: int, count: int):
        expected = _shard_count(count, shard_size)
        if len(paths) != expected:
            raise ValueError(f"{count} records in shards of {shard_size} take {expected} shards, but {len(paths)} "
                             f"are listed; the prepared data is damaged: {PREPARE_AGAIN}")
        self._paths, self._shard_size, self._count = [str(p) for p in paths], shard_size, count
        self._readers: OrderedDict[int, ArrayRecordReader] = OrderedDict()  # the open ones, least recently read first
        self._max_open = _allow_open_files(len(paths))
        self._evicts = self._max_open < len(paths)
        self._lock = threading.Lock()  # a reader's seek and read go together

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> bytes:
        return self.read([index])[0]

    def read(self, indices: Sequence[int]) -> list[bytes]:
        """The records at `indices`, in their order."""
        indices = np.asarray(indices, np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self._count):
            raise IndexError(f"record indices must lie in [0, {self._count}), got {indices.min()}..{indices.max()}")
        shards, positions = np.divmod(indices, self._shard_size)
        records = []
        with self._lock:
            for shard, position in zip(shards.tolist(), positions.tolist()):
                reader = self._readers.get(shard)
                if reader is None or self._evicts:
                    reader = self._reader(shard)
                reader.seek(position)
                records.append(reader.read())
        return records

    def check(self) -> None:
        """Opens and closes every shard, so that one cut short or missing fails before any compute."""
        for shard in range(len(self._paths)):
            self._open(shard).close()

    def _reader(self, shard: int) -> ArrayRecordReader:
        """`shard`'s reader, opened if need be, closing the least recently read one where this many are open."""
        reader = self._readers.get(shard)
        if reader is not None:
            self._readers.move_to_end(shard)
            return reader
        if len(self._readers) >= self._max_open:
            self._readers.popitem(last=False)[1].close()
        self._readers[shard] = reader = self._open(shard)
        return reader

    def _open(self, shard: int) -> ArrayRecordReader:
        path = self._paths[shard]
        reader = ArrayRecordReader(path, READER_OPTIONS, file_reader_buffer_size=READ_BUFFER_BYTES)
        if not reader.ok():
            try:
                reader.seek(0)  # a reader that failed to open raises its reason here (e.g. too many open files)
            except RuntimeError as err:
                raise unreadable(path, str(err).strip().split("\n")[0] or "cut short, or not an ArrayRecord file") \
                    from None
        held, expected = reader.num_records(), len(_shard_span(self._count, self._shard_size, shard))
        if held != expected:
            raise ValueError(f"{path} holds {held} records where its manifest needs {expected}; the prepared "
                             f"data is damaged: {PREPARE_AGAIN}")
        return reader


def unreadable(path, reason: str) -> ValueError:
    """The error for a prepared file that cannot be read (`reason`), with the fix its cause needs: where the operating
    system will not open it, the fix for that errno; where it opens, its content may be at fault."""
    try:
        open(path, "rb").close()
    except OSError as err:
        fix = OPEN_FIXES.get(err.errno)
        return ValueError(f"{path} cannot be read ({reason})" + (f"; {fix}" if fix else ""))
    return ValueError(f"{path} cannot be read ({reason}); if the file is damaged, {PREPARE_AGAIN}")


def _allow_open_files(readers: int) -> int:
    """Raises this process's soft limit on open files (often 1,024) to hold `readers` more open shards, as far as
    its hard limit allows (a corpus of 23M rows is 1,150 shards of 20,000); how many of them it can hold."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    wanted = open_now + readers + SPARE_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY:
        return readers
    return max(1, min(readers, soft - open_now - min(SPARE_FILES, (soft - open_now) // 2)))
