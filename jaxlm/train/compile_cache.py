"""JAX's persistent compilation cache for `jaxlm train`: a restarted job loads its compiled programs."""
from __future__ import annotations

import contextlib
import dataclasses

import jax

from jaxlm.train.storage import run_path

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
    where = run_path(train.run_dir) / "compile-cache" if in_run_dir else run_path(train.compile_cache)
    jax.config.update("jax_compilation_cache_dir", str(where))


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
