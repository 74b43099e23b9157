"""Transparent huge pages for the host memory a process allocates through glibc (XLA's buffers on CPUs): the
`glibc.malloc.hugetlb` tunable, which glibc reads only when a process starts, so `jaxlm` restarts itself once
with it. Standard library only: this runs before anything heavy is imported.

Why: XLA on a CPU allocates a program's temporaries from a thread's glibc arena; one larger than such an arena's
64 MB heap is mapped for the run and unmapped after it, and the next run faults it in again, 4 KB at a time
(bert-tiny's train step: 306 MiB a step, about 100,000 page faults). With the tunable glibc asks the kernel for
2 MB pages on those mappings (`madvise`), where the kernel lends huge pages on request."""
from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Mapping

HUGE_PAGES = "glibc.malloc.hugetlb=1"
FIRST_GLIBC_WITH_IT = (2, 35)
KERNEL_SETTING = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc as (major, minor); None under another C library or OS."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
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
    name = HUGE_PAGES.split("=")[0]
    if glibc is None or glibc < FIRST_GLIBC_WITH_IT or mode != "madvise":
        return None
    if any(setting.split("=")[0] == name for setting in tunables.split(":")):
        return None
    return {**env, "GLIBC_TUNABLES": f"{tunables}:{HUGE_PAGES}" if tunables else HUGE_PAGES}


def environment() -> dict | None:
    """This process's environment with the tunable, or None (as `with_huge_pages`)."""
    return with_huge_pages(os.environ, glibc_version(), kernel_huge_pages())


def restart_with_huge_pages() -> None:
    """Replaces this process (same pid, arguments, streams) by one started with the tunable, where it would
    change something; returns where it would not, or where the restart fails."""
    env = environment()
    if env is None:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError:
        return
