"""The launchers' dry runs: every command a 4-worker TPU pod job, its GKE JobSet and a 2-node SLURM job
would run, word for word, and their one-line errors."""
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ROOT

POD = ["--tpu", "pod-a", "--zone", "us-east5-a", "--project", "my-proj", "--workers", "4"]
RUN_DIR = "train.run_dir=gs://my-bucket/runs/bert-large"


def launch(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})))


def commands(printed: str) -> list[list[str]]:
    """The commands of a dry run, a line each but where a quoted word holds newlines (the install's script)."""
    out, pending = [], ""
    for line in printed.splitlines():
        pending += line
        try:
            out.append(shlex.split(pending))
            pending = ""
        except ValueError:  # inside a quoted word
            pending += "\n"
    return out


def test_a_4_worker_pod_job_installs_trains_waits_and_collects_every_log():
    proc = launch("bash", "launch/tpu_pod.sh", "--dry-run", *POD, "--env", "WANDB_MODE=offline",
                  "run", "configs/bert-large.yaml", RUN_DIR)
    assert proc.returncode == 0, proc.stderr
    lines = commands(proc.stdout)
    ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod-a", "--zone=us-east5-a", "--project=my-proj",
           "--worker=all"]
    scp = ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert lines[0] == ["git", "-C", str(ROOT), "archive", "--format=tar.gz", "-o", "/tmp/jaxlm-pod-a.tar.gz", "HEAD"]
    assert lines[1] == [*scp, "/tmp/jaxlm-pod-a.tar.gz", "pod-a:jaxlm.tar.gz", "--zone=us-east5-a",
                        "--project=my-proj", "--worker=all"]
    assert lines[2][:-1] == ssh and lines[2][-1].startswith("--command=say() {")  # run in test_a_pod_install_...
    assert lines[3][:-1] == ssh
    remote = lines[3][-1].removeprefix("--command=")
    assert ("JAXLM_WORKER_COMMAND='env WANDB_MODE=offline .venv/bin/jaxlm train configs/bert-large.yaml "
            f"distributed.enabled=true {RUN_DIR}' nohup sh -c") in remote
    assert remote.endswith("> ~/jaxlm-logs/worker-$id.log 2>&1 < /dev/null & }")
    assert lines[4] == [*ssh, '--command=while pgrep -f "[.]venv/bin/jaxlm train|JAXLM_WORKER_[C]OMMAND" > /dev/null; '
                              'do sleep 30; done']
    assert lines[5] == ["mkdir", "-p", "logs/pod-a"]
    assert lines[6:] == [[*scp, f"pod-a:jaxlm-logs/worker-{i}.log", f"logs/pod-a/worker-{i}.log", "--zone=us-east5-a",
                          "--project=my-proj", f"--worker={i}"] for i in range(4)]


def remote_command(*args) -> str:
    """The shell command `tpu_pod.sh --dry-run ARGS` runs on the workers (its one ssh)."""
    proc = launch("bash", "launch/tpu_pod.sh", "--dry-run", *POD, *args)
    assert proc.returncode == 0, proc.stderr
    (command,) = [word for word in shlex.split(proc.stdout) if word.startswith("--command=")]
    return command.removeprefix("--command=")


def fake_programs(directory, **scripts) -> dict:
    """An environment whose PATH finds `scripts` (name: sh body) in `directory` first."""
    directory.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    return dict(os.environ, PATH=f"{directory}:{os.environ['PATH']}")


def pids(pattern: str) -> set[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return set(map(int, found.split()))


def test_pod_train_returns_once_every_worker_has_started_and_its_log_ends_with_the_status(tmp_path):
    """The whole `cd ... && nohup jaxlm ... &` list went to the background, keeping ssh's output open: `train`
    returned only when training ended. Here the worker's command runs in a local shell, read through a pipe.
    `stop`'s SIGTERM reaches jaxlm, not the shell that writes its status, which `wait` waits for and which a
    SIGTERM of its own does not end before it has. The log of the attempt before is kept: it was overwritten."""
    (tmp_path / "jaxlm/.venv/bin").mkdir(parents=True)
    (tmp_path / "jaxlm/.venv/bin/jaxlm").write_text(f"#!/bin/sh\ntrap 'exit 143' TERM\necho {tmp_path}\n"
                                                    "while true; do sleep 0.1; done\n")
    (tmp_path / "jaxlm/.venv/bin/jaxlm").chmod(0o755)
    env = fake_programs(tmp_path / "bin", curl="echo 3") | {"HOME": str(tmp_path)}
    log = tmp_path / "jaxlm-logs/worker-3.log"
    log.parent.mkdir()
    earlier = "the attempt before\ntpu_pod.sh: jaxlm train exited 143\n"
    log.write_text(earlier)
    started = time.monotonic()
    worker = subprocess.run(f"bash -c {shlex.quote(remote_command('train', 'configs/bert-tiny.yaml'))} | cat",
                            shell=True, cwd=tmp_path, env=env, timeout=60)
    try:
        assert worker.returncode == 0 and time.monotonic() - started < 10
        while log.read_text() == earlier:
            time.sleep(0.05)
        (jaxlm,) = pids("[.]venv/bin/jaxlm train configs/bert-tiny.yaml distributed.enabled=true$")
        (status_writer,) = pids("JAXLM_WORKER_[C]OMMAND") - pids("[.]venv/bin/jaxlm train")
        os.kill(status_writer, signal.SIGTERM)  # as a SIGTERM to every process does: it writes the status after
        os.kill(jaxlm, signal.SIGTERM)  # what `stop` sends
        deadline = time.monotonic() + 30
        while status_writer in pids("JAXLM_WORKER_[C]OMMAND") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.read_text() == f"{earlier}{tmp_path}\ntpu_pod.sh: jaxlm train exited 143\n"
    finally:
        subprocess.run(["pkill", "-f", f"{tmp_path}/jaxlm/.venv/bin/jaxlm"], capture_output=True)
        subprocess.run(["pkill", "-f", "^/bin/sh .venv/bin/jaxlm train"], capture_output=True)


def test_a_pod_install_replaces_its_files_and_keeps_the_runs(tmp_path):
    """A second `install` (run again after a fault) did `rm -rf jaxlm`: the default relative run_dir, runs/..., and
    data/... inside it went with it. It also refuses while jaxlm trains there, and an old python3."""
    import tarfile

    def archive(files):
        with tarfile.open(tmp_path / "jaxlm.tar.gz", "w:gz") as tar:
            for name, text in files.items():
                source = tmp_path / "source" / name
                source.parent.mkdir(parents=True, exist_ok=True)
                source.write_text(text)
                tar.add(source, arcname=name)

    pip = 'mkdir -p .venv/bin && printf "#!/bin/sh\\n" > .venv/bin/pip && chmod +x .venv/bin/pip'
    python = f'if [ "$1" = -m ]; then {pip}; else exec {sys.executable} "$@"; fi'
    env = fake_programs(tmp_path / "bin", python3=python, pgrep="exit 1")
    install = remote_command("install")
    archive({"jaxlm/cli.py": "one", "jaxlm/gone.py": "old"})
    first = subprocess.run(["bash", "-c", install], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    (tmp_path / "jaxlm/runs/bert-tiny").mkdir(parents=True)
    (tmp_path / "jaxlm/runs/bert-tiny/checkpoint").write_text("kept")
    archive({"jaxlm/cli.py": "two"})
    again = subprocess.run(["bash", "-c", install], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "jaxlm/jaxlm/cli.py").read_text() == "two" and not (tmp_path / "jaxlm/jaxlm/gone.py").exists()
    assert (tmp_path / "jaxlm/runs/bert-tiny/checkpoint").read_text() == "kept"

    running = fake_programs(tmp_path / "bin", pgrep="exit 0")
    busy = subprocess.run(["bash", "-c", install], cwd=tmp_path, env=running, capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1 and busy.stderr.endswith(": jaxlm train still runs: stop it first (stop, then wait)\n")
    old = fake_programs(tmp_path / "bin", pgrep="exit 1", python3='[ "$1" = -V ] && echo Python 3.10.12; exit 1')
    too_old = subprocess.run(["bash", "-c", install], cwd=tmp_path, env=old, capture_output=True, text=True, timeout=60)
    assert too_old.returncode == 1 and too_old.stderr.endswith(": jaxlm needs Python 3.11+ (--python): Python 3.10.12\n")
    assert "python3.12 -m venv .venv" in remote_command("install", "--python", "python3.12")
    assert (tmp_path / "jaxlm/runs/bert-tiny/checkpoint").read_text() == "kept"


@pytest.mark.parametrize("states, message", [
    ("", "gcloud cannot describe queued resource pod-a (its message is above): check --tpu, --zone and --project"),
    ("FAILED", "queued resource pod-a is FAILED, and will not become ACTIVE: create it again"),
])
def test_a_queued_pod_that_will_never_be_active_is_an_error(tmp_path, states, message):
    """`--queued` asked gcloud every 30 s, forever, about a mistyped name (NOT_FOUND) or a failed resource."""
    describe = f'echo {states}' if states else 'echo "ERROR: NOT_FOUND" >&2; exit 1'
    env = fake_programs(tmp_path, gcloud=describe)
    proc = subprocess.run(["bash", "launch/tpu_pod.sh", "--queued", *POD, "stop"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.endswith(f"tpu_pod.sh: error: {message}\n")


def test_pod_logs_copies_every_log_it_can(tmp_path):
    """The first worker whose log could not be copied ended `logs`, and the workers after it were never asked."""
    scp = 'case "$*" in *worker-1.log*) echo "scp: no such file" >&2; exit 1 ;; esac; echo "$*" >> "$LOG"'
    env = fake_programs(tmp_path / "bin", gcloud=scp) | {"LOG": str(tmp_path / "copied")}
    proc = subprocess.run(["bash", str(ROOT / "launch/tpu_pod.sh"), *POD, "logs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.endswith(
        "tpu_pod.sh: error: no log copied from worker 1 (gcloud's message is above); the others are in logs/pod-a\n")
    assert [line.split()[4] for line in (tmp_path / "copied").read_text().splitlines()] == [
        "pod-a:jaxlm-logs/worker-0.log", "pod-a:jaxlm-logs/worker-2.log", "pod-a:jaxlm-logs/worker-3.log"]


FAKE_GCLOUD = """
import os, pathlib, shutil, subprocess, sys
args = sys.argv[1:]
worker = next(a for a in args if a.startswith("--worker=")).removeprefix("--worker=")
homes = [pathlib.Path(os.environ["PODS"], f"worker-{i}") for i in range(int(os.environ["WORKERS"]))]
homes = homes if worker == "all" else [homes[int(worker)]]
for home in homes:
    home.mkdir(exist_ok=True)
if args[3] == "ssh":
    command = next(a for a in args if a.startswith("--command=")).removeprefix("--command=")
    for home in homes:
        env = dict(os.environ, HOME=str(home), WORKER_ID=home.name.removeprefix("worker-"))
        subprocess.run(["bash", "-c", command], cwd=home, env=env, check=True)
else:  # scp SOURCE DESTINATION, where TPU:PATH is a path in each worker's home
    source, destination = args[4:6]
    for home in homes:
        remote = lambda path: home / path.split(":", 1)[1] if ":" in path else pathlib.Path(path)
        shutil.copy(remote(source), remote(destination))
"""


@pytest.mark.parametrize("statuses, status, message", [
    ("0 0", 0, ""),
    ("0 143", 143, "tpu_pod.sh: worker 1 stopped early (jaxlm exited 143): run again to resume\n"),
    ("2 75", 2, "tpu_pod.sh: error: worker 0 failed (jaxlm exited 2): see logs/pod-a/worker-0.log\n"
                "tpu_pod.sh: worker 1 stopped early (jaxlm exited 75): run again to resume\n"),
    ("killed 0", 1, "tpu_pod.sh: error: worker 0's jaxlm ended without an exit status (killed, or its VM restarted): "
                    "see logs/pod-a/worker-0.log\n"),
])
def test_a_pod_run_exits_with_its_workers_status(tmp_path, statuses, status, message):
    """`run` exited 0 whatever jaxlm did on the workers: a job that failed, or stopped early, looked finished. Here
    gcloud runs each worker's command in a directory of its own, and jaxlm exits with the status given it."""
    (tmp_path / "gcloud").write_text(f"#!{sys.executable}\n{FAKE_GCLOUD}")
    (tmp_path / "gcloud").chmod(0o755)
    jaxlm = 'echo "training on $WORKER_ID"; /bin/sleep 1; eval "s=\\$STATUS_$WORKER_ID"; [ "$s" = killed ] && kill -9 $PPID; exit $s'
    venv = f"mkdir -p .venv/bin && printf '#!/bin/sh\\n' > .venv/bin/pip && printf '%s\\n' {shlex.quote(jaxlm)} " \
        "> .venv/bin/jaxlm && chmod +x .venv/bin/*"
    # the processes the pattern finds in the workers' directories (test_faults' `jaxlm train` runs beside this test)
    ours = f'for pid in $({shutil.which("pgrep")} "$@"); do case $(readlink /proc/$pid/cwd) in "$PODS"/*) exit 0 ;; ' \
        'esac; done; exit 1'
    env = fake_programs(tmp_path, python3=f'if [ "$1" = -m ]; then {venv}; else exec {sys.executable} "$@"; fi',
                        curl="echo $WORKER_ID", sleep="exec /bin/sleep 0.1", pgrep=ours) | {"PODS": str(tmp_path),
                                                                                            "WORKERS": "2"}
    env.update({f"STATUS_{i}": s for i, s in enumerate(statuses.split())})
    (tmp_path / "job").mkdir()
    proc = subprocess.run(["bash", str(ROOT / "launch/tpu_pod.sh"), *POD[:-1], "2", "run", "configs/bert-tiny.yaml"],
                          cwd=tmp_path / "job", env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (status, message)
    logs = [(tmp_path / f"job/logs/pod-a/worker-{i}.log").read_text().splitlines() for i in range(2)]
    assert [log[0] for log in logs] == ["training on 0", "training on 1"]


def test_a_queued_pod_waits_until_active_and_stop_sends_sigterm():
    proc = launch("bash", "launch/tpu_pod.sh", "--dry-run", "--queued", *POD, "stop")
    assert proc.returncode == 0, proc.stderr
    wait, stop = proc.stdout.splitlines()
    assert wait.startswith('until [ "$(gcloud compute tpus queued-resources describe pod-a --zone=us-east5-a')
    assert wait.endswith('" = ACTIVE ]; do sleep 30; done')
    assert shlex.split(stop)[-1] == '--command=pkill -TERM -f "[.]venv/bin/jaxlm train" || true'


@pytest.mark.parametrize("args, message", [
    (["--tpu", "a", "--zone", "z", "frob"], "unknown action 'frob'"),
    (["--zone", "z", "stop"], "--tpu NAME is required"),
    (["--tpu", "a", "--zone", "z", "train"], "train needs a CONFIG"),
    (["--tpu", "a", "--zone", "z", "train", "nowhere.yaml"], "config nowhere.yaml not found"),
    (["--dry-run", "--tpu", "a", "--zone", "z", "logs"], "--dry-run needs --workers N"),
    (["--tpu", "a", "--zone", "z", "--workers", "0", "stop"], "--workers must be a positive count"),
    (["--tpu", "a", "--zone", "z", "--env", "NOEQUALS", "stop"], "--env takes KEY=VALUE"),
    (["--tpu", "a", "--zone", "z", "--env", "=v", "stop"], "--env takes KEY=VALUE, got '=v'"),
    # once a bash 'unbound variable' with exit 1; a value that is the next option was taken as the value
    (["--tpu", "a", "--zone"], "--zone needs a value: --zone ZONE"),
    (["--tpu", "a", "--zone", "", "stop"], "--zone needs a value: --zone ZONE"),
    (["--tpu", "--zone", "z", "stop"], "--tpu needs a value: --tpu NAME"),
    (["--tpu", "a", "--zone", "z", "--workers"], "--workers needs a value: --workers N"),
    (["--tpu", "a", "--zone", "z", "--project"], "--project needs a value: --project ID"),
    (["--tpu", "a", "--zone", "z", "--env"], "--env needs a value: --env KEY=VALUE"),
    # options without an action printed the 27-line header; a name with a space or a slash reached gcloud and
    # the logs' directory
    (["--tpu", "a", "--zone", "z"], "name an ACTION: install, train, wait, logs, stop or run (see --help)"),
    (["--tpu", "pod a", "--zone", "z", "stop"], "--tpu 'pod a': a TPU's name is lower-case letters, digits and '-'"),
    (["--tpu", "../pod", "--zone", "z", "logs"], "--tpu '../pod': a TPU's name is lower-case letters"),
    (["--tpu", "a", "--zone", "us east5", "stop"], "--zone 'us east5': a zone is lower-case letters, digits and '-'"),
    # once printed the install and train commands first
    (["--dry-run", "--tpu", "a", "--zone", "z", "run", "configs/bert-tiny.yaml"], "--dry-run needs --workers N"),
    (["--tpu", "a", "--zone", "z", "stop", "configs/bert-tiny.yaml"],
     "stop takes no CONFIG or overrides, got 'configs/bert-tiny.yaml'"),
    (["--tpu", "a", "--zone", "z", "train", "configs/bert-tiny.yaml", "--frob"], "unknown option --frob"),
    # the workers run `cd jaxlm && jaxlm train CONFIG` in their copy of the checkout: no other path reaches them
    (["--tpu", "a", "--zone", "z", "train", str(ROOT / "configs/bert-tiny.yaml")],
     f"config {ROOT}/configs/bert-tiny.yaml: give it as configs/bert-tiny.yaml, its path from the checkout's root"),
    (["--tpu", "a", "--zone", "z", "train", str(ROOT.parent / "bert-tiny.yaml")],
     f"config {ROOT.parent}/bert-tiny.yaml is outside this checkout ({ROOT}): the workers get only the checkout"),
    (["--tpu", "a", "--zone", "z", "train", "../main/configs/bert-tiny.yaml"], "without '..'"),
    # read by each worker's jaxlm only, after the install
    (["--dry-run", *POD, "run", "configs/bert-tiny.yaml", "train.steps=abc"],
     "configs/bert-tiny.yaml with train.steps=abc: train.steps must be a number, got 'abc'"),
])
def test_pod_launcher_bad_input(args, message):
    proc = launch("bash", "launch/tpu_pod.sh", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("tpu_pod.sh: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_pod_launcher_usage_is_its_header_comment():
    lines = (ROOT / "launch/tpu_pod.sh").read_text().splitlines()
    header = [line.removeprefix("#").removeprefix(" ") for line in itertools.takewhile(
        lambda line: line.startswith("#"), lines[1:])]
    assert header[0].startswith("Run jaxlm on every worker") and header[-1].startswith("  --dry-run")
    for args in (["--help"], []):
        proc = launch("bash", "launch/tpu_pod.sh", *args)
        assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.splitlines() == header


@pytest.mark.parametrize("args", [["stop", "--dry-run"], ["install", "--dry-run"],
                                  ["train", "configs/bert-large.yaml", "--dry-run", RUN_DIR]])
def test_pod_launcher_options_after_the_action_are_its_own(tmp_path, args):
    """`stop --dry-run` once sent SIGTERM to every worker, `install --dry-run` installed, and `train CONFIG --dry-run`
    trained, with --dry-run passed to `jaxlm train`."""
    gcloud = tmp_path / "gcloud"
    gcloud.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/ran\n')
    gcloud.chmod(0o755)
    proc = launch("bash", "launch/tpu_pod.sh", *POD, *args, env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "ran").exists()
    assert proc.stdout.splitlines() == launch("bash", "launch/tpu_pod.sh", "--dry-run", *POD,
                                              *(arg for arg in args if arg != "--dry-run")).stdout.splitlines()
    assert "--dry-run" not in proc.stdout


def test_pod_launcher_trains_only_a_committed_config_from_the_checkout_root(tmp_path):
    """The workers run `cd jaxlm && jaxlm train CONFIG` in `git archive HEAD`: a config found from the caller's
    directory, left out of git or changed since HEAD was once started anyway, and failed (or ran another) there."""
    checkout = tmp_path / "checkout"
    (checkout / "launch").mkdir(parents=True)
    (checkout / "configs").mkdir()
    for name in ("tpu_pod.sh", "lib.sh", "check_config.py"):
        (checkout / "launch" / name).write_text((ROOT / "launch" / name).read_text())
    (checkout / "configs/a.yaml").write_text("model: {}\n")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-qm", "a"]):
        subprocess.run([*git, *command], check=True, capture_output=True)

    def train(config, cwd=checkout):
        return subprocess.run(["bash", str(checkout / "launch/tpu_pod.sh"), "--dry-run", *POD, "train", config],
                              cwd=cwd, capture_output=True, text=True, timeout=60)

    from_below = train("configs/a.yaml", cwd=checkout / "configs")  # read from the root, as the workers read it
    assert from_below.returncode == 0 and " train configs/a.yaml " in from_below.stdout, from_below.stderr
    errors = {"a.yaml": f"config a.yaml not found in {checkout} (a path from the checkout's root, as the workers "
                        "read it)",
              "configs/b.yaml": "config configs/b.yaml is not in git: the workers get the checkout's HEAD; git add "
                                "and commit it",
              "configs/a.yaml": "config configs/a.yaml has uncommitted changes: the workers would run HEAD's; commit "
                                "them"}
    (checkout / "configs/b.yaml").write_text("model: {}\n")
    (checkout / "configs/a.yaml").write_text("model: {dim: 8}\n")
    for config, message in errors.items():
        proc = train(config, cwd=checkout / "configs")
        assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == f"tpu_pod.sh: error: {message}\n"


BERT = "configs/bert-tiny.yaml"


@pytest.mark.parametrize("count, config, env, message", [
    ("0", BERT, {}, "N=0 processes and JAXLM_TOTAL_DEVICES=8: give positive whole numbers"),  # once bash's division
    ("-2", BERT, {}, "N=-2 processes"),  # once started no process and exited 0
    ("two", BERT, {}, "N=two processes"),
    ("3", BERT, {}, "8 devices cannot be split evenly over 3 processes"),
    # each process said these, as distributed.coordinator='127.0.0.1:abc' or a missing config file
    ("2", BERT, {"JAXLM_PORT": "abc"}, "JAXLM_PORT=abc: give a port from 1 to 65534"),
    ("2", BERT, {"JAXLM_PORT": "65535"}, "JAXLM_PORT=65535: give a port"),
    ("2", "configs/nope.yaml", {}, "config configs/nope.yaml does not exist"),
    # once by each process, as it started
    ("2", f"{BERT} train.steps=abc", {}, f"{BERT} with train.steps=abc: train.steps must be a number"),
])
def test_local_launcher_bad_input(count, config, env, message):
    """`config` is the config and its overrides."""
    proc = launch("bash", "launch/local_multiprocess.sh", count, *config.split(),
                  env={"JAXLM_TOTAL_DEVICES": "8", **env})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("local_multiprocess.sh: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_sigterm_to_the_local_launcher_reaches_every_process(tmp_path):
    """`kill PID` of the launcher once left its processes training, orphaned. Its processes here are a program that
    writes down the signals it gets (the trainer's own answer to SIGTERM is tests/integration/test_faults.py's)."""
    log, program = tmp_path / "signals.log", tmp_path / "jaxlm"
    program.write_text('#!/usr/bin/env bash\ntrap \'echo "$JAXLM_PROCESS_ID TERM" >> "$LOG"; exit 0\' TERM\n'
                       'echo "$JAXLM_PROCESS_ID started $$" >> "$LOG"\nwhile true; do sleep 0.05; done\n')
    program.chmod(0o755)
    env = dict(os.environ, JAXLM_BIN=str(program), LOG=str(log))
    launcher = subprocess.Popen(["bash", "launch/local_multiprocess.sh", "2", "configs/bert-tiny.yaml"], cwd=ROOT,
                                env=env)
    started = lambda: [line.split()[-1] for line in log.read_text().splitlines() if "started" in line]
    deadline = time.time() + 30
    while (len(started()) if log.exists() else 0) < 2 and time.time() < deadline:
        time.sleep(0.05)
    try:
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 0
        assert sorted(line for line in log.read_text().splitlines() if "TERM" in line) == ["0 TERM", "1 TERM"]
    finally:
        subprocess.run(["kill", *started()], capture_output=True)  # where it failed: no process outlives the test


def test_ctrl_c_to_the_local_launchers_group_waits_for_the_saves(tmp_path):
    """A terminal's Ctrl-C reaches the launcher's `sleep` between its checks too: under `set -e` the launcher then
    ended at once, 130, its processes left saving on their own."""
    log, program = tmp_path / "signals.log", tmp_path / "jaxlm"
    program.write_text('#!/usr/bin/env bash\ntrap \'sleep 1; echo "$JAXLM_PROCESS_ID saved" >> "$LOG"; exit 0\' '
                       'TERM INT\necho "$JAXLM_PROCESS_ID started" >> "$LOG"\nwhile true; do sleep 0.05; done\n')
    program.chmod(0o755)
    # with SIGINT's default action, as a terminal starts it: pytest-xdist's workers ignore SIGINT, and a shell keeps
    # a signal ignored at its start ignored, traps and all (a python that restores it and becomes bash: a
    # preexec_fn would fork this multithreaded process)
    as_a_terminal = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execvp('bash', ['bash', *sys.argv[1:]])")
    launcher = subprocess.Popen([sys.executable, "-c", as_a_terminal, "launch/local_multiprocess.sh", "2",
                                 "configs/bert-tiny.yaml"], cwd=ROOT, start_new_session=True,
                                env=dict(os.environ, JAXLM_BIN=str(program), LOG=str(log)))
    deadline = time.time() + 30
    while (log.read_text().count("started") if log.exists() else 0) < 2 and time.time() < deadline:
        time.sleep(0.05)
    try:
        os.killpg(launcher.pid, signal.SIGINT)
        assert launcher.wait(timeout=30) == 0
        assert sorted(line for line in log.read_text().splitlines() if "saved" in line) == ["0 saved", "1 saved"]
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(launcher.pid)], capture_output=True)


def test_a_failed_local_process_ends_the_others(tmp_path):
    """A process that died left the others waiting for it in a collective until JAX's heartbeat timeout (90 s, then
    a C++ abort), and forever where none came. Process 1 fails; process 2 ignores SIGTERM and is killed."""
    log, program = tmp_path / "signals.log", tmp_path / "jaxlm"
    program.write_text('#!/usr/bin/env bash\ntrap \'echo "$JAXLM_PROCESS_ID TERM" >> "$LOG"; '
                       '[ "$JAXLM_PROCESS_ID" = 2 ] || exit 0\' TERM\n'
                       'if [ "$JAXLM_PROCESS_ID" = 1 ]; then sleep 0.5; exit 3; fi\n'
                       'while true; do sleep 0.05; done\n')
    program.chmod(0o755)
    env = {"JAXLM_BIN": str(program), "LOG": str(log), "JAXLM_GRACE_S": "1", "JAXLM_TOTAL_DEVICES": "3"}
    proc = launch("bash", "launch/local_multiprocess.sh", "3", "configs/bert-tiny.yaml", env=env)
    assert proc.returncode == 3
    assert "local_multiprocess.sh: process 1 exited with status 3; stopping the others" in proc.stderr
    assert "local_multiprocess.sh: processes 2 still run 1 s after SIGTERM; killing them" in proc.stderr
    assert sorted(log.read_text().split("\n")[:-1]) == ["0 TERM", "2 TERM"]


def test_the_local_launcher_dry_run_prints_each_process(tmp_path):
    """`--dry-run` was read as N, and a trailing one started N trainings, each refusing it: it may stand anywhere."""
    for where in (0, 3):
        args = ["2", "configs/bert-tiny.yaml", "train.run_dir=runs/a b"]
        proc = launch("bash", "launch/local_multiprocess.sh", *args[:where], "--dry-run", *args[where:],
                      env={"JAXLM_PORT": "23456", "JAXLM_BIN": str(tmp_path / "absent")})
        assert proc.returncode == 0, proc.stderr
        assert [shlex.split(line) for line in proc.stdout.splitlines()] == [
            ["env", "JAXLM_COORDINATOR=127.0.0.1:23456", "JAXLM_NUM_PROCESSES=2", f"JAXLM_PROCESS_ID={i}",
             "JAXLM_LOCAL_DEVICE_COUNT=4", f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', 'cpu')}",
             str(tmp_path / "absent"), "train", "configs/bert-tiny.yaml", "train.run_dir=runs/a b"] for i in range(2)]


def test_the_gke_jobset_has_one_pod_per_host_on_the_slice():
    proc = launch(sys.executable, "launch/gke_jobset.py", "--name", "bert-large", "--image", "registry/jaxlm:1",
                  "--tpu", "v5p", "--topology", "2x2x4", "--config", "configs/bert-large.yaml", "--env", "A=b",
                  "--", RUN_DIR)
    assert proc.returncode == 0, proc.stderr
    jobset = yaml.safe_load(proc.stdout)
    assert jobset["kind"] == "JobSet" and jobset["spec"]["failurePolicy"] == {"maxRestarts": 10}
    (replicated,) = jobset["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    assert replicated["replicas"] == 1 and job["parallelism"] == job["completions"] == 4  # 16 chips, 4 per host
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                   "cloud.google.com/gke-tpu-topology": "2x2x4"}
    (container,) = pod["containers"]
    assert container["command"] == ["jaxlm", "train", "configs/bert-large.yaml", RUN_DIR]
    assert {"name": "A", "value": "b"} in container["env"] and container["resources"]["limits"] == {"google.com/tpu": 4}
    assert pod["terminationGracePeriodSeconds"] >= 60  # time to save at the agreed step after SIGTERM

    bad = launch(sys.executable, "launch/gke_jobset.py", "--name", "x", "--image", "i", "--tpu", "v5p",
                 "--topology", "4by4", "--config", "c.yaml")
    assert bad.returncode == 2 and bad.stderr.strip() == ("gke_jobset.py: error: --topology '4by4': a v5p slice's "
                                                          "topology is 3 sizes joined by a lower-case x, like 4x4x4")
    bad = launch(sys.executable, "launch/gke_jobset.py", "--name", "BERT_large", "--image", "i", "--tpu", "v5p",
                 "--topology", "4x4x4", "--config", "c.yaml")  # kubectl apply refused it, after the dry run passed
    assert bad.returncode == 2 and bad.stderr.startswith("gke_jobset.py: error: --name 'BERT_large': Kubernetes takes")


JOBSET = ["--image", "registry/jaxlm:1", "--tpu", "v5p", "--topology", "4x4x4", "--config", "configs/bert-large.yaml"]
NAME_RULE = ("Kubernetes takes lower-case letters, digits and '-', starting with a letter, ending with a letter or "
             "digit, at most {} of them here (pod names NAME-slice-{}-xxxxx must fit in 63)")


@pytest.mark.parametrize("args, message", [
    (["--name", "1st-run", *JOBSET], "--name '1st-run': " + NAME_RULE.format(46, "0-15")),  # RFC 1035: a letter first
    (["--name", "run-", *JOBSET], "--name 'run-': " + NAME_RULE.format(46, "0-15")),
    (["--name", "a" * 47, *JOBSET], f"--name '{'a' * 47}': " + NAME_RULE.format(46, "0-15")),  # 16 hosts: 0-15
    (["--name", "a" * 47, *JOBSET, "--slices", "11"], f"--name '{'a' * 47}': " + NAME_RULE.format(45, "10-15")),
    (["--name", "run", *JOBSET, "--env", "=v"], "--env takes KEY=VALUE with a KEY, got '=v'"),
    (["--name", "run", *JOBSET, "--image", ""],
     "--image needs the image to run, e.g. REGISTRY/jaxlm:TAG (launch/Dockerfile)"),
    # each printed a manifest that never schedules: no node pool carries the topology label
    (["--name", "run", *JOBSET, "--tpu", "v5e"],
     "--topology '4x4x4': a v5e slice's topology is 2 sizes joined by a lower-case x, like 4x4"),
    (["--name", "run", *JOBSET, "--topology", "2x4"],
     "--topology '2x4': a v5p slice's topology is 3 sizes joined by a lower-case x, like 4x4x4"),
    (["--name", "run", *JOBSET, "--topology", "4X4X4"],
     "--topology '4X4X4': a v5p slice's topology is 3 sizes joined by a lower-case x, like 4x4x4"),
    (["--name", "run", *JOBSET, "--topology", "2x2x2x2"],
     "--topology '2x2x2x2': a v5p slice's topology is 3 sizes joined by a lower-case x, like 4x4x4"),
    (["--name", "run", *JOBSET, "--slices", "99999999999999999999"],
     "--slices 99999999999999999999: give 1 to 2147483647 (Kubernetes' int32)"),
    (["--name", "run", *JOBSET, "--slices", "0"], "--slices 0: give 1 to 2147483647"),  # one message named both
    (["--name", "run", *JOBSET, "--max-restarts", "-1"], "--max-restarts -1: give 0 to 2147483647"),
    # the JobSet's own JAX_PLATFORMS=tpu came after it in the container's env, and won
    (["--name", "run", *JOBSET, "--env", "JAX_PLATFORMS=cpu"],
     "--env JAX_PLATFORMS: the JobSet sets JAX_PLATFORMS=tpu itself; leave it out"),
    (["--name", "run", *JOBSET, "--env", "A=1", "--env", "A=2"], "--env A is given 2 times; give it once"),
    # these printed a manifest that Kubernetes, or jaxlm train on every pod of the slice, refused after scheduling
    (["--name", "run", *JOBSET, "--env", "MY VAR=1"],
     "--env MY VAR: a variable's name is letters, digits and '_', not starting with a digit"),
    (["--name", "run", *JOBSET, "--config", "configs/bert-larg.yaml"],
     f"--config configs/bert-larg.yaml: no such file in this checkout ({ROOT}), which the image is built from; give "
     "its path from the checkout's root"),
    (["--name", "run", *JOBSET, "--", "train.stepz=10"],
     "--config configs/bert-large.yaml with train.stepz=10: unknown key(s) train.stepz; valid keys in train: "),
    (["--name", "run", *JOBSET, "--mount", "my-bucket:mnt", "--service-account", "sa"],
     "--mount 'my-bucket:mnt': give BUCKET:PATH, a Cloud Storage bucket's name and an absolute directory in the "
     "pods, e.g. my-bucket:/mnt/data"),
    (["--name", "run", *JOBSET, "--mount", "my-bucket:/mnt/data"], "--mount needs --service-account NAME: "),
    # argparse's own errors: its usage block and then the error
    ([], "the following arguments are required: --name, --image, --tpu, --topology, --config (`gke_jobset.py "
         "--help` shows how to call it)"),
    (["--name", "run", *JOBSET, "--slices", "two"], "argument --slices: invalid int value: 'two'"),
])
def test_the_gke_jobset_bad_input(args, message):
    proc = launch(sys.executable, "launch/gke_jobset.py", *args)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"gke_jobset.py: error: {message}")


def test_a_gke_jobset_without_kubectl_or_jaxlm_says_so(tmp_path):
    """--apply without kubectl was a FileNotFoundError's traceback; a python without jaxlm skipped the config's check
    without a word."""
    apply = launch(sys.executable, "launch/gke_jobset.py", "--name", "run", *JOBSET, "--apply",
                   env={"PATH": str(tmp_path)})
    assert apply.returncode == 2 and apply.stdout == "" and apply.stderr == (
        "gke_jobset.py: error: --apply pipes the manifest to kubectl, which is not on PATH: install it (gcloud "
        "components install kubectl), or leave --apply out and apply the printed manifest yourself\n")
    (tmp_path / "jaxlm").mkdir()
    (tmp_path / "jaxlm" / "__init__.py").write_text("raise ImportError('not installed here')\n")
    unchecked = launch(sys.executable, "launch/gke_jobset.py", "--name", "run", *JOBSET, "--", "train.stepz=1",
                       env={"PYTHONPATH": str(tmp_path)})
    assert unchecked.returncode == 0 and yaml.safe_load(unchecked.stdout)["kind"] == "JobSet"
    assert unchecked.stderr == ("gke_jobset.py: note: this python cannot import jaxlm, so configs/bert-large.yaml and "
                                "its overrides are checked only as jaxlm starts on the workers (run the launcher from "
                                "the checkout installed with `make install` to check them here)\n")


def test_a_gke_jobset_that_cannot_print_says_so():
    """A full disk under its standard output was a traceback, and one more at exit."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "launch/gke_jobset.py", "--name", "run", *JOBSET], cwd=ROOT,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr == (
        "gke_jobset.py: error: the manifest could not be written to standard output (No space left on device)\n")


def test_a_gke_jobset_mounts_buckets_for_the_prepared_data():
    """The pods had no volume: a data.prepared_dir (read as local files) existed in none of them."""
    proc = launch(sys.executable, "launch/gke_jobset.py", "--name", "run", *JOBSET, "--mount", "my-bucket:/mnt/data",
                  "--service-account", "trainer", "--", "data.prepared_dir=/mnt/data/bert-large", RUN_DIR)
    assert proc.returncode == 0, proc.stderr
    template = yaml.safe_load(proc.stdout)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["metadata"] == {"annotations": {"gke-gcsfuse/volumes": "true"}}
    assert template["spec"]["serviceAccountName"] == "trainer"
    bucket = {"bucketName": "my-bucket", "mountOptions": "implicit-dirs"}
    assert template["spec"]["volumes"] == [
        {"name": "bucket-0", "csi": {"driver": "gcsfuse.csi.storage.gke.io", "volumeAttributes": bucket}}]
    assert template["spec"]["containers"][0]["volumeMounts"] == [{"name": "bucket-0", "mountPath": "/mnt/data"}]


def test_the_longest_gke_name_fits_its_pod_names():
    proc = launch(sys.executable, "launch/gke_jobset.py", "--name", "a" * 46, *JOBSET)
    assert proc.returncode == 0, proc.stderr
    assert len(f"{'a' * 46}-slice-0-15-xxxxx") == 63


def test_apply_after_the_overrides_applies(tmp_path):
    """`-- key=value --apply` once printed the manifest and ran `jaxlm train CONFIG key=value --apply` in it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat > {tmp_path}/manifest\n')
    kubectl.chmod(0o755)
    proc = launch(sys.executable, "launch/gke_jobset.py", "--name", "run", *JOBSET, "--", RUN_DIR, "--apply",
                  "--env", "A=b", "train.steps=10", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert (tmp_path / "args").read_text() == "apply -f -\n"
    (replicated,) = yaml.safe_load((tmp_path / "manifest").read_text())["spec"]["replicatedJobs"]
    (container,) = replicated["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["jaxlm", "train", "configs/bert-large.yaml", RUN_DIR, "train.steps=10"]
    assert {"name": "A", "value": "b"} in container["env"]


@pytest.fixture
def slurm_env(tmp_path) -> dict:
    """A 2-node allocation's variables, and an `scontrol` that expands its node list."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu-[01-02]" ] && printf "gpu-01\\ngpu-02\\n"\n')
    scontrol.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-[01-02]",
            "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "16", "SLURM_SUBMIT_DIR": str(ROOT)}


def test_a_2_node_slurm_job_runs_one_task_per_node(slurm_env):
    proc = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml", RUN_DIR, env=slurm_env)
    assert proc.returncode == 0, proc.stderr
    summary, command = proc.stdout.splitlines()
    assert summary == "jaxlm on 2 nodes, 2 tasks; coordinator gpu-01:61586; job 4242"  # JAX's port: see below
    # the job's --cpus-per-task passed on: srun does not take it from sbatch on every SLURM version (1 CPU a task)
    assert shlex.split(command) == ["srun", "--kill-on-bad-exit=1", "--label", "--cpus-per-task=16", "env",
                                    "JAX_PLATFORMS=cuda", "JAXLM_TASK_PER_GPU=0", "bash",
                                    str(ROOT / "launch/slurm_task.sh"), str(ROOT / ".venv/bin/jaxlm"), "train",
                                    "configs/bert-large.yaml", RUN_DIR]

    explicit = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml",
                      env=slurm_env | {"JAXLM_EXPLICIT_COORDINATOR": "1", "JAXLM_TASK_PER_GPU": "1"})
    words = shlex.split(explicit.stdout.splitlines()[1])
    assert words[:11] == ["srun", "--kill-on-bad-exit=1", "--label", "--cpus-per-task=16", "--gpus-per-task=1", "env",
                          "JAX_PLATFORMS=cuda", "JAXLM_TASK_PER_GPU=1", "JAXLM_COORDINATOR=gpu-01:24242",
                          "JAXLM_NUM_PROCESSES=2", "bash"]

    directives = [line for line in (ROOT / "launch/gpu_slurm.sbatch").read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --signal=TERM@300" in directives and "#SBATCH --requeue" in directives
    assert "#SBATCH --output=%x-%j.log" in directives  # logs/%x-%j.log: SLURM wrote nothing where logs/ was missing


TASK_ENV = ("JAX_LOCAL_DEVICE_IDS", "CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "JAXLM_COORDINATOR",
            "JAXLM_PROCESS_ID", "JAXLM_TASK_PER_GPU")


@pytest.mark.parametrize("env, devices", [
    # JAX's own choice, [SLURM_LOCALID], was GPU 0 alone of a node's eight for the task holding the node
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "SLURM_LOCALID": "0"}, "0,1,2,3,4,5,6,7"),
    ({"CUDA_VISIBLE_DEVICES": "4,5", "SLURM_LOCALID": "0"}, "0,1"),  # CUDA numbers the visible ones from 0
    ({"SLURM_GPUS_ON_NODE": "4", "SLURM_LOCALID": "0"}, "0,1,2,3"),
    ({"JAXLM_TASK_PER_GPU": "1", "CUDA_VISIBLE_DEVICES": "3", "SLURM_LOCALID": "3"}, "0"),  # ordinal 3 was unseen
    ({"JAXLM_TASK_PER_GPU": "1", "SLURM_LOCALID": "3"}, ""),  # every GPU visible: JAX's SLURM_LOCALID is right
    ({"JAX_LOCAL_DEVICE_IDS": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, "1"),
])
def test_a_slurm_task_drives_the_gpus_it_holds(env, devices):
    clean = {k: v for k, v in os.environ.items() if k not in TASK_ENV}
    proc = subprocess.run(["bash", "launch/slurm_task.sh", "bash", "-c", 'echo "$JAX_LOCAL_DEVICE_IDS"'], cwd=ROOT,
                          env=clean | {"SLURM_PROCID": "5"} | env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == f"{devices}\n", proc.stderr
    bare = subprocess.run(["bash", "launch/slurm_task.sh", "true"], cwd=ROOT, env=clean | {"SLURM_PROCID": "5"},
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and bare.stderr == (
        "slurm_task.sh: error: task 5: no GPUs were given to it (CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE are "
        "unset): ask for them with sbatch --gpus-per-node=N\n")
    explicit = subprocess.run(["bash", "launch/slurm_task.sh", "bash", "-c", 'echo "$JAXLM_PROCESS_ID"'], cwd=ROOT,
                              env=clean | {"SLURM_PROCID": "5", "SLURM_GPUS_ON_NODE": "8", "JAXLM_COORDINATOR": "h:1"},
                              capture_output=True, text=True, timeout=60)
    assert explicit.stdout == "5\n", explicit.stderr


def test_a_large_slurm_job_names_its_first_host(slurm_env, tmp_path):
    """`scontrol show hostnames | head -n 1` under pipefail: head's early exit ended scontrol with SIGPIPE, and the
    script with status 141 and no word, on most tries of a 512-node list (here: more than a pipe holds, always)."""
    (tmp_path / "bin" / "scontrol").write_text('#!/bin/sh\nseq -f gpu-%06g 1 100000\n')
    proc = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml", env=slurm_env)
    assert proc.returncode == 0 and "coordinator gpu-000001:61586;" in proc.stdout, proc.stderr


def test_the_slurm_script_needs_the_checkout_and_its_install(slurm_env, tmp_path):
    elsewhere = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml",
                       env=slurm_env | {"SLURM_SUBMIT_DIR": str(tmp_path)})
    assert elsewhere.returncode == 2 and elsewhere.stderr == (
        f"gpu_slurm.sbatch: error: {tmp_path} has no launch/lib.sh: run sbatch from the checkout's root\n")
    missing = launch("bash", "launch/gpu_slurm.sbatch", "configs/bert-large.yaml",
                     env=slurm_env | {"JAXLM_BIN": str(tmp_path / "jaxlm")})
    assert missing.returncode == 2 and missing.stderr.startswith(f"gpu_slurm.sbatch: error: {tmp_path}/jaxlm not found")
    # a CPU-only install (`make install`'s): every node once ended in JAX's traceback, after the queue. Its python
    # here finds no module at all, as a python without JAX's CUDA plugin finds none.
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv/python").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "venv/jaxlm").write_text(f"#!{tmp_path}/venv/python\n")
    for name in ("python", "jaxlm"):
        (tmp_path / "venv" / name).chmod(0o755)
    cpu_only = launch("bash", "launch/gpu_slurm.sbatch", "configs/bert-large.yaml",
                      env=slurm_env | {"JAXLM_BIN": str(tmp_path / "venv/jaxlm")})
    assert cpu_only.returncode == 2 and cpu_only.stdout == "" and cpu_only.stderr == (
        f"gpu_slurm.sbatch: error: {tmp_path}/venv/jaxlm has no CUDA build of JAX: install it with "
        f"{tmp_path}/venv/pip install -e '.[gpu]'\n")


def test_the_slurm_script_outside_an_allocation_says_how_to_submit_it(slurm_env, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", "launch/gpu_slurm.sbatch", "configs/bert-large.yaml"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("gpu_slurm.sbatch: error: SLURM_JOB_ID is not set; submit this script with sbatch "
                                   "(or run it inside salloc)")
    missing = launch("bash", "launch/gpu_slurm.sbatch", "nowhere.yaml", env=slurm_env)
    assert missing.returncode == 2 and missing.stderr.strip() == "gpu_slurm.sbatch: error: config nowhere.yaml not found"
    # every task said it, after the queue
    mistyped = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml", "train.stepz=1",
                      env=slurm_env)
    assert mistyped.returncode == 2 and mistyped.stdout == "" and mistyped.stderr.startswith(
        "gpu_slurm.sbatch: error: configs/bert-large.yaml with train.stepz=1: unknown key(s) train.stepz; valid keys in "
        "train: ") and mistyped.stderr.count("\n") == 1
    # a login node's shell with SLURM's variables copied in: "scontrol: command not found" from the middle of the script
    bare = launch(shutil.which("bash"), "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml",
                  env=slurm_env | {"PATH": str(tmp_path)})
    assert bare.returncode == 2 and bare.stderr.strip() == (
        "gpu_slurm.sbatch: error: scontrol not found on PATH: run this inside a SLURM allocation (sbatch or salloc), "
        "where SLURM's commands are")


def test_the_default_coordinator_is_the_one_jax_picks(slurm_env, monkeypatch):
    """The summary once named port 20000 + SLURM_JOB_ID % 20000 (and JAXLM_PORT), which JAX's own SLURM detection,
    the default, never uses."""
    from jax._src.clusters.slurm_cluster import SlurmCluster

    monkeypatch.setenv("SLURM_JOB_ID", slurm_env["SLURM_JOB_ID"])
    monkeypatch.setenv("SLURM_STEP_NODELIST", slurm_env["SLURM_JOB_NODELIST"])
    monkeypatch.delenv("JAX_COORDINATOR_PORT", raising=False)
    proc = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml", env=slurm_env)
    assert f"coordinator {SlurmCluster.get_coordinator_address(None, None)};" in proc.stdout
    proc = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml",
                  env=slurm_env | {"JAX_COORDINATOR_PORT": "5000"})
    assert "coordinator gpu-01:5000;" in proc.stdout


def test_slurm_dry_run_anywhere_runs_nothing(slurm_env, tmp_path):
    """`gpu_slurm.sbatch CONFIG --dry-run` once ran srun, passing --dry-run to `jaxlm train`."""
    srun = tmp_path / "bin" / "srun"
    srun.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/ran\n')
    srun.chmod(0o755)
    first = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml", RUN_DIR, env=slurm_env)
    for args in (["configs/bert-large.yaml", "--dry-run", RUN_DIR], ["configs/bert-large.yaml", RUN_DIR, "--dry-run"]):
        proc = launch("bash", "launch/gpu_slurm.sbatch", *args, env=slurm_env)
        assert proc.returncode == 0 and proc.stdout == first.stdout, proc.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("value", ["1", "true", "yes", "On", "TRUE"])
def test_slurm_switches_take_the_usual_true_words(slurm_env, value):
    """JAXLM_EXPLICIT_COORDINATOR=true was once read as off: JAX's detection ran where it was known to fail."""
    proc = launch("bash", "launch/gpu_slurm.sbatch", "--dry-run", "configs/bert-large.yaml",
                  env=slurm_env | {"JAXLM_EXPLICIT_COORDINATOR": value, "JAXLM_TASK_PER_GPU": value})
    assert proc.returncode == 0, proc.stderr
    assert "coordinator gpu-01:24242;" in proc.stdout
    words = shlex.split(proc.stdout.splitlines()[1])
    assert "--gpus-per-task=1" in words and "JAXLM_COORDINATOR=gpu-01:24242" in words


@pytest.mark.parametrize("env, message", [
    ({"JAXLM_EXPLICIT_COORDINATOR": "maybe"}, "JAXLM_EXPLICIT_COORDINATOR=maybe: give 1 or 0 (true/false, yes/no, "
                                              "on/off)"),
    ({"JAXLM_TASK_PER_GPU": "2"}, "JAXLM_TASK_PER_GPU=2: give 1 or 0 (true/false, yes/no, on/off)"),
    ({"JAXLM_PORT": "1234"}, "JAXLM_PORT is for JAXLM_EXPLICIT_COORDINATOR=1 only; JAX picks its own port (61440 + "
                             "SLURM_JOB_ID % 4096, or JAX_COORDINATOR_PORT): unset it, or set "
                             "JAXLM_EXPLICIT_COORDINATOR=1"),
    ({"JAXLM_EXPLICIT_COORDINATOR": "1", "JAXLM_PORT": "65535"},
     "JAXLM_PORT=65535: give a port from 1 to 65534 (the next one is taken too)"),
    ({"JAXLM_EXPLICIT_COORDINATOR": "1", "JAXLM_PORT": "http"},
     "JAXLM_PORT=http: give a port from 1 to 65534 (the next one is taken too)"),
    # the summary once read "coordinator gpu-01:abc", and every task failed in JAX
    ({"JAX_COORDINATOR_PORT": "abc"}, "JAX_COORDINATOR_PORT=abc: give a port from 1 to 65535"),
    ({"JAX_COORDINATOR_PORT": "99999"}, "JAX_COORDINATOR_PORT=99999: give a port from 1 to 65535"),
    # one GPU of each node's eight trained, the others idle, without a word
    ({"JAXLM_TASK_PER_GPU": "1", "SLURM_GPUS_ON_NODE": "8"},
     "JAXLM_TASK_PER_GPU=1 with one task per node would drive 1 of each node's 8 GPUs: submit with "
     "--ntasks-per-node=8 --gpus-per-task=1, or leave JAXLM_TASK_PER_GPU off (a task holds the node)"),
])
def test_slurm_bad_settings(slurm_env, env, message):
    proc = launch("bash", "launch/gpu_slurm.sbatch", "configs/bert-large.yaml", env=slurm_env | env)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == f"gpu_slurm.sbatch: error: {message}\n"


def test_a_run_stopped_early_never_exits_0():
    """It exited 0 after saving: Kubernetes marks such a pod Succeeded and its Job done, and a restart loop ends."""
    from jaxlm.train.faults import stop_status

    assert [stop_status(reason) for reason in ("SIGTERM", "SIGTERM (a preemption notice)", "Ctrl-C",
                                               "train.time_limit_minutes=5")] == [143, 143, 130, 75]


def test_the_launch_readme_shows_what_the_pod_dry_run_prints():
    """launch/README.md's dry run of a TPU pod job, and what it prints, word for word."""
    section = (ROOT / "launch/README.md").read_text().split("## A TPU pod, end to end", 1)[1]
    commands_block, printed_block = re.findall(r"```(?:bash)?\n(.*?)```", section, re.S)[:2]
    dry_run = next(line for line in commands_block.replace("\\\n", " ").splitlines() if "--dry-run" in line)
    proc = launch("bash", *shlex.split(dry_run, comments=True))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed_block.replace("/path/to/jaxlm", str(ROOT))
