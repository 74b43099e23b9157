"""A run killed with SIGKILL after its first checkpoint resumes to the uninterrupted run's losses."""
import signal
import subprocess
import sys
import time

from conftest import ROOT, run_cli
from jaxlm.train.metrics import read_jsonl

STEPS = 80


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"}


def _committed_steps(checkpoints):
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) if checkpoints.exists() else []


def test_sigkill_then_resume_matches_uninterrupted(tiny_config, tmp_path):
    extra = {"model": {"hidden_dropout": 0.1, "attention_dropout": 0.1},
             "train": {"steps": STEPS, "checkpoint_every": 10, "log_every": 1}}
    straight = tiny_config(extra | {"train": {**extra["train"], "run_dir": str(tmp_path / "straight")}}, "a.yaml")
    killed = tiny_config(extra | {"train": {**extra["train"], "run_dir": str(tmp_path / "killed")}}, "b.yaml")
    run_cli("train", straight)

    env = dict(__import__("os").environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.Popen([sys.executable, "-m", "jaxlm.cli", "train", str(killed)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 600
    while not _committed_steps(checkpoints) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    at_kill = _committed_steps(checkpoints)
    assert at_kill and at_kill[-1] < STEPS
    logged_before = max(_losses(tmp_path / "killed"))
    assert logged_before < STEPS

    resumed = run_cli("train", killed)
    assert f"resumed from step {at_kill[-1]}" in resumed.stderr + resumed.stdout

    expected, got = _losses(tmp_path / "straight"), _losses(tmp_path / "killed")
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == expected
