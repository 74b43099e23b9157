"""The `jaxlm` program restarts once with glibc's huge-page tunable, where glibc and the kernel make it count."""
import os
import pathlib
import subprocess
import sys
import sysconfig
import time

import pytest

from jaxlm import host_memory

GLIBC = (2, 36)
# a program that restarts as the `jaxlm` program does, told that glibc and the kernel take the tunable
PROBE = """\
import os, sys
from jaxlm import host_memory
host_memory.glibc_version = lambda: (2, 36)
host_memory.kernel_huge_pages = lambda: "madvise"
print("before", flush=True)
host_memory.restart_with_huge_pages(module="restart_probe")
started_with = open(f"/proc/{os.getpid()}/environ", "rb").read().split(b"\\0")
print(os.getpid(), sys.argv[1:], b"GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in started_with,
      host_memory.RESTARTED in os.environ, open(f"/proc/{os.getpid()}/comm").read().strip())
"""


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


def test_only_the_program_itself_is_started_again(tmp_path):
    script = str(tmp_path / "jaxlm")
    pathlib.Path(script).write_text("")
    python = sys.executable
    assert host_memory.own_command([python, script, "train"], script, None) == (script, [script, "train"])
    assert host_memory.own_command([python, "-X", "dev", "-m", "jaxlm.cli", "train"], "cli.py", "jaxlm.cli") == (
        python, [python, "-X", "dev", "-m", "jaxlm.cli", "train"])
    # run by a profiler or a debugger, or from `python -c`: not restarted
    assert host_memory.own_command([python, "-m", "cProfile", "-m", "jaxlm.cli"], "cli.py", "jaxlm.cli") is None
    assert host_memory.own_command([python, "-m", "pdb", script], script, None) is None
    assert host_memory.own_command([python, "-c", "pass"], "-c", None) is None
    assert host_memory.own_command([python], "", None) is None


def _without_the_tunable() -> dict:
    return {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}


@pytest.mark.parametrize("started_as", ["script", "module"])
def test_a_program_restarts_in_place_once_with_the_tunable(tmp_path, started_as):
    (tmp_path / "restart_probe.py").write_text(PROBE)
    if started_as == "script":
        program = tmp_path / "probe-program"
        program.write_text(f"#!{sys.executable}\n{PROBE}")
        program.chmod(0o755)
        command = [str(program), "an argument"]
    else:
        command = [sys.executable, "-m", "restart_probe", "an argument"]
    env = {**_without_the_tunable(), "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    # the same process and arguments, under its own name; the restart's marker is gone from its environment
    name = "probe-program" if started_as == "script" else pathlib.Path(sys.executable).name[:15]
    assert out.splitlines() == ["before", "before", f"{proc.pid} ['an argument'] True False {name}"], out


@pytest.mark.parametrize("program", [[str(pathlib.Path(sysconfig.get_path("scripts")) / "jaxlm")],
                                     [sys.executable, "-m", "jaxlm.cli"]], ids=["jaxlm", "python -m jaxlm.cli"])
def test_the_jaxlm_program_starts_with_the_tunable_where_it_applies(program):
    env = _without_the_tunable()
    applies = host_memory.with_huge_pages(env, host_memory.glibc_version(), host_memory.kernel_huge_pages()) is not None
    proc = subprocess.Popen([*program, "--help"], env=env, stdout=subprocess.PIPE, text=True)
    seen, name = False, None
    while proc.poll() is None and not seen:  # it restarts at once, then imports for seconds before it prints
        try:
            seen = b"glibc.malloc.hugetlb=1" in pathlib.Path(f"/proc/{proc.pid}/environ").read_bytes()
            name = pathlib.Path(f"/proc/{proc.pid}/comm").read_text().strip()
        except OSError:
            break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "train" in out
    assert seen == applies
    assert name == pathlib.Path(program[0]).name[:15]  # `pgrep jaxlm` finds the program, restarted or not
