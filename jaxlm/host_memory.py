"""Transparent huge pages for the host memory a process allocates through glibc (XLA's buffers on CPUs): the
`glibc.malloc.hugetlb` tunable, which glibc reads only when a process starts, so `jaxlm` restarts itself once
with it. Standard library only: this runs before anything heavy is imported.

Why: glibc serves an allocation above its mmap threshold (32 MiB at most) with a mapping of its own, unmapped
when it is freed. XLA on a CPU allocates a program's temporaries for each run (bert-tiny's train step: 306 MiB),
so every step faulted them in again, 4 KB at a time (about 100,000 page faults a step). With the tunable glibc
asks the kernel for 2 MB pages on those mappings (`madvise`), where the kernel lends huge pages on request."""
from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Mapping, Sequence

TUNABLE = "glibc.malloc.hugetlb"
HUGE_PAGES = f"{TUNABLE}=1"
FIRST_GLIBC_WITH_IT = (2, 35)
KERNEL_SETTING = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
RESTARTED = "JAXLM_RESTARTED_WITH_HUGE_PAGES"  # set for the restarted process alone: it never restarts again


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc as (major, minor); None under another C library or OS."""
    try:
        _, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, OSError, TypeError, ValueError):
        return None


def kernel_huge_pages() -> str | None:
    """The kernel's transparent huge page mode (`always`, `madvise` or `never`); None where it has none."""
    try:
        text = KERNEL_SETTING.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def with_huge_pages(env: Mapping[str, str], glibc: tuple[int, int] | None, mode: str | None) -> dict | None:
    """`env` with the tunable added to GLIBC_TUNABLES; None where it would change nothing: a glibc without
    it, a kernel that lends huge pages only on request not in that mode (`always` gives them unasked), or a
    GLIBC_TUNABLES that already sets it (the user's choice stands)."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if glibc is None or glibc < FIRST_GLIBC_WITH_IT or mode != "madvise":
        return None
    if any(setting.split("=")[0] == TUNABLE for setting in tunables.split(":")):
        return None
    return {**env, "GLIBC_TUNABLES": f"{tunables}:{HUGE_PAGES}" if tunables else HUGE_PAGES}


def environment() -> dict | None:
    """This process's environment with the tunable, or None (as `with_huge_pages`)."""
    return with_huge_pages(os.environ, glibc_version(), kernel_huge_pages())


def own_command(orig_argv: Sequence[str], script: str, module: str | None) -> tuple[str, list[str]] | None:
    """The file and arguments that start this program again: the console script `script` by its own path, where
    the interpreter was started on it (the process keeps its name), or the interpreter with its arguments,
    where their first `-m` runs `module`; None where another program runs it (a debugger, a profiler)."""
    if len(orig_argv) > 1 and orig_argv[1] == script and os.path.isfile(script):
        return script, list(orig_argv[1:])
    after_first_m = orig_argv[orig_argv.index("-m") + 1:] if "-m" in orig_argv else []
    if module is not None and after_first_m[:1] == [module]:
        return sys.executable, list(orig_argv)
    return None


def restart_with_huge_pages(module: str | None = None) -> None:
    """Replaces this process (same pid, arguments, streams) by one started with the tunable, where it would
    change something and this program is the process's own (a console script, or `python -m module`); returns
    otherwise, and where the restart fails."""
    if os.environ.pop(RESTARTED, None) or getattr(sys, "frozen", False) or not sys.executable:
        return
    env, command = environment(), own_command(sys.orig_argv, sys.argv[0], module)
    if env is None or command is None:
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    try:
        os.execve(*command, {**env, RESTARTED: "1"})
    except (OSError, TypeError, ValueError):
        return
