"""`jaxlm preflight` (and the start of `jaxlm train`) on real processes: two processes pass; a process
with another config, a run directory that is not shared, and processes that never start are each
named in one line before any compute; a process late at a barrier is named."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, free_port, write_config, xla_flags

from jaxlm.cli import main

JAXLM = str(ROOT / ".venv" / "bin" / "jaxlm")


def processes(config, count: int, ids=None, overrides=None, cwd=None, extra=()):
    """`jaxlm preflight` as processes `ids` of `count` (4 CPU devices each); (returncode, output) of each."""
    port, started = free_port(), []
    for index in ids if ids is not None else range(count):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAXLM_COORDINATOR=f"127.0.0.1:{port}",
                   JAXLM_NUM_PROCESSES=str(count), JAXLM_PROCESS_ID=str(index), JAXLM_LOCAL_DEVICE_COUNT="4")
        env["XLA_FLAGS"] = xla_flags(None)
        args = [JAXLM, "preflight", str(config), *extra, *((overrides or {}).get(index, []))]
        started.append(subprocess.Popen(args, cwd=(cwd or {}).get(index, ROOT), env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True))
    return [(proc.wait(timeout=300), proc.stdout.read()) for proc in started]


@pytest.fixture
def config(tmp_path, prepared_dir):
    return write_config(tmp_path, {"data": {"prepared_dir": str(prepared_dir)},
                                   "train": {"run_dir": str(tmp_path / "run")}})


def test_two_processes_pass(config, tmp_path):
    (code0, out0), (code1, out1) = processes(config, 2)
    assert code0 == code1 == 0, out0 + out1
    assert "preflight passed:" in out0 and "over 8 devices of 2 processes" in out0
    assert "global batch 32: 4 rows per batch shard, 16 read by each process" in out0
    assert "preflight passed" not in out1  # process 0 reports
    assert not (tmp_path / "run").exists()  # the probe is cleaned up, and the run directory made for it


def test_a_run_directory_preflight_made_is_removed_and_one_that_was_there_is_kept(config, tmp_path, capsys):
    """A mistyped train.run_dir used to be left behind as an empty tree of directories."""
    made = tmp_path / "typo" / "deeper" / "run"
    assert main(["preflight", str(config), f"train.run_dir={made}"]) == 0
    assert "preflight passed:" in capsys.readouterr().out
    assert list(tmp_path.glob("typo*")) == []
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main(["preflight", str(config), f"train.run_dir={kept / 'run'}"]) == 0
    assert kept.is_dir() and list(kept.iterdir()) == []


def test_a_process_with_another_config_is_named(config):
    results = processes(config, 2, overrides={1: ["optim.peak_lr=0.1"]})
    for code, output in results:
        assert code == 2, output
        assert "error: processes 1 see a different config than process 0; give every process the same" in output


def test_a_run_directory_that_is_not_shared_is_named(tmp_path, prepared_dir):
    """The same relative run_dir from two working directories: two directories, as on unshared disks."""
    config = write_config(tmp_path, {"data": {"prepared_dir": str(prepared_dir)}, "train": {"run_dir": "run"}})
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    results = processes(config, 2, cwd={0: tmp_path / "a", 1: tmp_path / "b"})
    for code, output in results:
        assert code == 2, output
        assert "train.run_dir=run is not shared by the processes (process 0 cannot see what process 1 wrote" in output


def test_processes_that_never_start_are_named(config):
    ((code, output),) = processes(config, 3, ids=[0], extra=["distributed.init_timeout_s=3"])
    assert code == 2 and "error: processes 1, 2 of 3 did not start within distributed.init_timeout_s=3 s" in output
    ((code, output),) = processes(config, 2, ids=[1], extra=["distributed.init_timeout_s=3"])
    assert code == 2 and "error: process 0 (the coordinator, 127.0.0.1:" in output and "did not answer" in output


def test_a_coordinator_port_in_use_is_named_by_process_0(config):
    """Another program on the coordinator's port: JAX's service failed there with a 23-line traceback ("Failed to
    start RPC server"), and the other processes waited for it until the launcher ended them."""
    import socket
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAXLM_COORDINATOR=f"127.0.0.1:{port}", JAXLM_NUM_PROCESSES="2",
                   JAXLM_PROCESS_ID="0", JAXLM_LOCAL_DEVICE_COUNT="4", XLA_FLAGS=xla_flags(None))
        proc = subprocess.run([JAXLM, "preflight", str(config)], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"jaxlm preflight: error: process 0 cannot listen on the coordinator's port {port}: Address already in use; "
        "choose another coordinator port (JAXLM_PORT for the launchers)"], proc.stderr[-2000:]


def test_a_coordinator_without_a_usable_port_and_a_cluster_that_is_not_there_are_named(config):
    """A port past 65534 was an OverflowError's traceback and one missing Python's int() message; with
    `distributed.enabled=true` and no cluster, JAX said "coordinator_address should be defined"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXLM_")} | {"JAX_PLATFORMS": "cpu"}

    def last_line(*overrides):
        proc = subprocess.run([JAXLM, "preflight", str(config), *overrides], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        return proc.stderr.strip().splitlines()[-1]

    for coordinator in ("127.0.0.1:99999", "localhost"):
        assert last_line(f"distributed.coordinator={coordinator}", "distributed.num_processes=2",
                         "distributed.process_id=0") == (
            f"jaxlm preflight: error: distributed.coordinator={coordinator!r} must be host:port with a port from 1 to "
            "65534 (the next port is taken too)")
    assert last_line("distributed.enabled=true").startswith(
        "jaxlm preflight: error: distributed.enabled=true, but JAX found no cluster to start from")


def test_no_prepared_data_is_named_by_every_process(config, tmp_path):
    """It once passed ("the same prepared data on every process": none), and `jaxlm train` then stopped at once."""
    for code, output in processes(config, 2, extra=[f"data.prepared_dir={tmp_path / 'none'}"]):
        assert code == 2 and "(manifest.json missing): run `jaxlm prepare CONFIG` first" in output, output


def test_prepared_data_that_does_not_fit_the_run_is_named(config, capsys):
    """Preflight makes train's checks on the data too: it passed a batch larger than the train split, which
    `jaxlm train` then refused."""
    assert main(["preflight", str(config), "train.global_batch=1048576", "train.eval_batches=0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "jaxlm preflight: error: the train split has ")
    assert main(["preflight", str(config), "train.global_batch=8192"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "jaxlm preflight: error: the valid split has ")


def test_a_mesh_that_does_not_fit_the_devices(config):
    for code, output in processes(config, 2, extra=["mesh.data=3"]):
        assert code == 2 and "error: mesh data=3 x fsdp=1 x tensor=1 has 3 devices but 8 are present" in output


LATE_PROCESS = """
import sys, time
import jax
from jaxlm.config import ConfigError, DistributedConfig
from jaxlm.parallel import distributed
distributed.initialize(DistributedConfig())
if jax.process_index() == 1:
    time.sleep(15)
try:
    distributed.barrier("the test's barrier", 3)
except ConfigError as err:
    print(f"error: {err}")
    sys.exit(2)
"""


def test_a_process_late_at_a_barrier_is_named():
    port, started = free_port(), []
    for index in range(2):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAXLM_COORDINATOR=f"127.0.0.1:{port}", JAXLM_NUM_PROCESSES="2",
                   JAXLM_PROCESS_ID=str(index), JAXLM_LOCAL_DEVICE_COUNT="1")
        started.append(subprocess.Popen([sys.executable, "-c", LATE_PROCESS], cwd=ROOT, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    code, output = started[0].wait(timeout=120), started[0].stdout.read()
    started[1].kill()
    assert code == 2, output
    assert ("error: processes 1 did not reach \"the test's barrier\" within distributed.barrier_timeout_s=3 s: "
            "they are stuck or dead; see their logs") in output


@pytest.mark.parametrize("overrides, expected", [
    (["mesh.rules=fsdp_tp", "mesh.data=2", "mesh.tensor=4"],
     "parameter params/encoder/embeddings/word/embedding has 2002 along 'vocab', which the mesh rules split 4 ways"),
    (["model.vocab_multiple=1000000000"], "the train state (parameters and optimiser state) needs "),
])
def test_the_train_states_checks_are_made(overrides, expected, config, capsys):
    """Preflight passed a parameter the mesh rules split unevenly and a state no device could hold, which `jaxlm
    train` then refused (or failed to allocate)."""
    assert main(["preflight", str(config), *overrides]) == 2
    assert capsys.readouterr().err.startswith(f"jaxlm preflight: error: {expected}")
    assert main(["preflight", str(config)]) == 0
    assert "  train state: " in capsys.readouterr().out
