"""One writer per run directory: the lock `jaxlm train` and `jaxlm finetune` hold on a local train.run_dir."""
from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxlm import file_lock
from jaxlm.config import ConfigError
from jaxlm.train.storage import in_cloud

LOCK_FILE = "train.lock"


@contextlib.contextmanager
def writing(run_dir: str) -> Iterator[None]:
    """Holds the run directory's lock for the block; process 0, the one that writes the run's files, takes it,
    and every process raises a ConfigError at once where another command holds it (two trainers in one
    directory interleave their metrics and race on its checkpoints). The kernel releases the lock when its
    holder ends, however it ends, SIGKILL included: a stopped run leaves nothing to clean up. A directory in
    cloud storage has no lock."""
    fd, holder = None, ""
    if jax.process_index() == 0 and not in_cloud(run_dir):
        fd, holder = file_lock.take(pathlib.Path(run_dir) / LOCK_FILE)
    free = not holder
    if jax.process_count() > 1:
        free = bool(multihost_utils.broadcast_one_to_all(np.int32(free)))
    if not free:
        raise ConfigError(f"train.run_dir={run_dir} is being written by {holder or 'another command'} "
                          "(its train.lock); wait for it to end, or give another train.run_dir")
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)
