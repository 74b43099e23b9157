"""The `jaxlm` program restarts once with glibc's huge-page tunable, where glibc and the kernel make it count."""
import os
import pathlib
import subprocess
import sys
import time

import pytest

from jaxlm import host_memory

GLIBC = (2, 36)


def test_the_tunable_is_added_only_where_it_changes_something():
    assert host_memory.with_huge_pages({"A": "1"}, GLIBC, "madvise") == {
        "A": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert host_memory.with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, GLIBC, "madvise") == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    assert host_memory.with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, GLIBC, "madvise") is None
    assert host_memory.with_huge_pages({}, (2, 31), "madvise") is None
    assert host_memory.with_huge_pages({}, None, "madvise") is None
    assert host_memory.with_huge_pages({}, GLIBC, "always") is None
    assert host_memory.with_huge_pages({}, GLIBC, "never") is None
    assert host_memory.with_huge_pages({}, GLIBC, None) is None


def _without_the_tunable() -> dict:
    return {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}


def _started_with_it(pid: int) -> bool:
    return b"glibc.malloc.hugetlb=1" in pathlib.Path(f"/proc/{pid}/environ").read_bytes()


def test_a_process_restarts_in_place_with_the_tunable_where_it_applies():
    env = _without_the_tunable()
    applies = host_memory.with_huge_pages(env, host_memory.glibc_version(), host_memory.kernel_huge_pages()) is not None
    script = ("import os, sys; from jaxlm import host_memory; print('before', flush=True); "
              "host_memory.restart_with_huge_pages(); print(os.getpid(), sys.argv[1:], "
              "b'glibc.malloc.hugetlb=1' in open(f'/proc/{os.getpid()}/environ', 'rb').read())")
    proc = subprocess.Popen([sys.executable, "-c", script, "an argument"], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    lines = out.splitlines()
    # the restarted process runs the same command line in the same process, and restarts no further
    assert lines[-1] == f"{proc.pid} ['an argument'] {applies}", out
    assert lines[:-1] == ["before"] * (2 if applies else 1), out


@pytest.mark.parametrize("program", [[str(pathlib.Path(sys.executable).parent / "jaxlm")],
                                     [sys.executable, "-m", "jaxlm.cli"]], ids=["jaxlm", "python -m jaxlm.cli"])
def test_the_jaxlm_program_starts_with_the_tunable_where_it_applies(program):
    env = _without_the_tunable()
    applies = host_memory.with_huge_pages(env, host_memory.glibc_version(), host_memory.kernel_huge_pages()) is not None
    proc = subprocess.Popen([*program, "--help"], env=env, stdout=subprocess.PIPE, text=True)
    seen = False
    while proc.poll() is None and not seen:  # it restarts at once, then imports for seconds before it prints
        try:
            seen = _started_with_it(proc.pid)
        except OSError:
            break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "train" in out
    assert seen == applies
