"""JAX's persistent compilation cache for `jaxlm train`: a restarted job loads its compiled programs."""
from __future__ import annotations

import contextlib
import dataclasses
import pathlib

import jax
from jax._src import compilation_cache as jax_cache  # private: the decompression its reads use

from jaxlm.config import ConfigError
from jaxlm.corpora.text import file_in_the_way
from jaxlm.train.storage import in_cloud, run_path

IN_RUN_DIR = "run_dir"  # train.compile_cache: <run_dir>/compile-cache
OFF = "off"
HITS, MISSES = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"


def enable(train) -> None:
    """Point this process's compilation cache at where `train.compile_cache` says, unless the user set
    JAX_COMPILATION_CACHE_DIR (theirs is kept). Process-wide: call it once, before anything compiles (the
    CLI does; a library caller sets JAX's option itself)."""
    if jax.config.jax_compilation_cache_dir or train.compile_cache == OFF:
        return
    in_run_dir = train.compile_cache == IN_RUN_DIR
    where = in_run(train.run_dir) if in_run_dir else run_path(train.compile_cache)
    if (blocked := _file_in_the_way(where)) is not None:
        raise ConfigError(f"train.compile_cache={train.compile_cache}: {blocked} is a file; name a directory for "
                          "the compiled programs, run_dir (inside the run) or off")
    if not in_cloud(where):  # an object in a bucket is written whole or not at all
        drop_cut_short(pathlib.Path(where))
    jax.config.update("jax_compilation_cache_dir", str(where))


def in_run(run_dir: str):
    """Where train.compile_cache=run_dir keeps the compiled programs."""
    return run_path(run_dir) / "compile-cache"


def check_users_cache() -> None:
    """A ConfigError where the user's JAX_COMPILATION_CACHE_DIR (which JAX reads itself, whatever the command) has
    a file standing where the directory is needed: JAX warned it could not use it, and every command went on."""
    theirs = jax.config.jax_compilation_cache_dir
    if theirs and (blocked := _file_in_the_way(theirs)) is not None:
        raise ConfigError(f"JAX_COMPILATION_CACHE_DIR={theirs}: {blocked} is a file; name a directory for the compiled "
                          "programs, or unset it")


def _file_in_the_way(where) -> pathlib.Path | None:
    """The file standing where the cache's directory `where` is needed; None in a bucket, which has no files in the
    way."""
    return None if in_cloud(where) else file_in_the_way(pathlib.Path(where))


def drop_cut_short(directory: pathlib.Path) -> list[pathlib.Path]:
    """Remove the cache's entries that do not decompress, and return them. JAX writes an entry in place and never
    replaces one, so a write cut short (a full disk, a kill) would otherwise be read, warned about and compiled
    again on every restart."""
    broken = []
    for entry in sorted(directory.glob("*-cache")) if directory.is_dir() else []:
        try:
            jax_cache.decompress_executable(entry.read_bytes())
        except Exception:  # zstd and zlib raise their own kinds for a truncated stream
            entry.unlink(missing_ok=True)
            broken.append(entry)
    return broken


@dataclasses.dataclass
class Lookups:
    hits: int = 0
    misses: int = 0

    def listen(self, event: str, **_) -> None:
        self.hits += event == HITS
        self.misses += event == MISSES


def summary(seconds: float, lookups: Lookups) -> str:
    """The log line: the steps' compile time, and what the cache gave (the state's initialiser included)."""
    looked_up = lookups.hits + lookups.misses
    loaded = (f"; {lookups.hits} of {looked_up} programs loaded from the compilation cache in "
              f"{jax.config.jax_compilation_cache_dir}" if looked_up else "")
    return f"train and eval steps compiled in {seconds:.1f} s{loaded}"


@contextlib.contextmanager
def counted():
    """The cache's hits and misses while the block runs (the programs it loaded, and those it compiled)."""
    lookups = Lookups()
    jax.monitoring.register_event_listener(lookups.listen)
    try:
        yield lookups
    finally:
        jax.monitoring.unregister_event_listener(lookups.listen)
