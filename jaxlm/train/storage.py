"""Where a run's files live, on a local disk or in cloud storage (gs://, s3://): etils.epath paths
(Orbax takes them too), and the one file a run grows line by line, which a bucket cannot append to."""
from __future__ import annotations

import os
import time

from etils import epath

CLOUD_SCHEMES = ("gs://", "s3://", "az://")


def in_cloud(path) -> bool:
    return os.fspath(path).startswith(CLOUD_SCHEMES)


def run_path(setting) -> epath.Path:
    """The path a setting names: a cloud URI as given, a local path made absolute."""
    text = os.fspath(setting)
    return epath.Path(text if in_cloud(text) else os.path.abspath(text))


def missing_dirs(path) -> list[epath.Path]:
    """The local directories from `path` up that do not exist yet, deepest first (none in the cloud)."""
    if in_cloud(path):
        return []
    missing, here = [], run_path(path)
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    return missing


def remove_if_empty(dirs: list[epath.Path]) -> None:
    """Remove each of `dirs` (deepest first) that holds nothing, stopping at the first that holds something."""
    for directory in dirs:
        try:
            directory.rmdir()
        except OSError:
            return


class GrowingText:
    """A text file grown by `write`: a local file is appended to, each line on disk at once; a cloud
    object (which cannot be appended to) is rewritten whole at most every `every_s` seconds and on
    `close`, so a run killed outright loses at most that much of it."""

    def __init__(self, path: epath.Path, every_s: float = 30.0):
        self.path, self.every_s = path, every_s
        self.local = None if in_cloud(path) else open(path, "a", buffering=1)
        self.text = path.read_text() if self.local is None and path.exists() else ""
        self.written = time.monotonic()

    def write(self, text: str) -> None:
        if self.local is not None:
            self.local.write(text)
            return
        self.text += text
        if time.monotonic() - self.written > self.every_s:
            self.flush()

    def flush(self) -> None:
        if self.local is None:
            self.path.write_text(self.text)
            self.written = time.monotonic()

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        else:
            self.flush()
