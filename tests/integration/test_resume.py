"""A run killed with SIGKILL after its first checkpoint resumes to the uninterrupted run's losses, its
compiled steps loaded from the compilation cache in its run directory, but for an entry cut short, which it
writes anew."""
import os
import re
import signal
import subprocess
import sys

from conftest import ROOT, kill_when, run_cli, xla_flags
from jaxlm.train import checkpoint, compile_cache
from jaxlm.train.metrics import read_jsonl

STEPS = 80
CACHE_ALL = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # a tiny model's steps compile in under JAX's 1 s


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"}


def _committed_steps(checkpoints):
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) if checkpoints.exists() else []


def test_sigkill_then_resume_matches_uninterrupted(tiny_config, tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")  # the suite's shared cache (conftest): this one is the run's
    extra = {"model": {"hidden_dropout": 0.1, "attention_dropout": 0.1},
             "train": {"steps": STEPS, "checkpoint_every": 10, "log_every": 1}}
    straight = tiny_config(extra | {"train": {**extra["train"], "run_dir": str(tmp_path / "straight")}}, "a.yaml")
    killed = tiny_config(extra | {"train": {**extra["train"], "run_dir": str(tmp_path / "killed")}}, "b.yaml")
    run_cli("train", straight)

    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(), **CACHE_ALL)
    proc = subprocess.Popen([sys.executable, "-m", "jaxlm.cli", "train", str(killed)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "killed" / "checkpoints"
    kill_when(proc, lambda: bool(_committed_steps(checkpoints)))
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    at_kill = _committed_steps(checkpoints)
    assert at_kill and at_kill[-1] < STEPS
    logged_before = max(_losses(tmp_path / "killed"))
    assert logged_before < STEPS

    cache = tmp_path / "killed" / "compile-cache"
    cut = max(cache.glob("*-cache"), key=lambda entry: entry.stat().st_size)
    cut.write_bytes(cut.read_bytes()[:cut.stat().st_size // 2])  # as a full disk leaves a write

    resumed = run_cli("train", killed, env_extra=CACHE_ALL)
    output = resumed.stderr + resumed.stdout
    assert f"resumed from step {at_kill[-1]}" in output
    # the restart loads its compiled steps from the run directory's cache, which the killed run wrote, and compiles
    # the one cut short again, without JAX's warning, writing it anew
    loaded = re.search(r"(\d+) of (\d+) programs loaded from the compilation cache in (\S+)", output)
    assert loaded and int(loaded[1]) == int(loaded[2]) - 1 >= 1 and loaded[3] == str(cache), output[-3000:]
    assert "Error reading persistent compilation cache" not in output
    assert cut.exists() and compile_cache.drop_cut_short(cache) == []

    expected, got = _losses(tmp_path / "straight"), _losses(tmp_path / "killed")
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == expected


def test_init_from_starts_from_another_runs_parameters(tiny_config, tmp_path):
    source = tiny_config({"train": {"steps": 30, "run_dir": str(tmp_path / "source")}}, "source.yaml")
    run_cli("train", source)
    recorded = (tmp_path / "source" / "metrics.jsonl").read_bytes()
    shorter = tiny_config({"train": {"steps": 10, "run_dir": str(tmp_path / "source")}}, "shorter.yaml")
    past = run_cli("train", shorter, check=False)  # once exited 0, reporting step 30 as if it had trained to 10
    assert past.returncode == 2 and past.stderr.strip().splitlines()[-1] == (
        f"jaxlm train: error: the run in {tmp_path / 'source'} is at step 30, past train.steps=10: there is nothing "
        "to train; set train.steps above 30 to train on, or choose a new train.run_dir")
    assert (tmp_path / "source" / "metrics.jsonl").read_bytes() == recorded
    # another optimiser's state (LAMB's has a part more than AdamW's) once set every good checkpoint aside as damaged
    lamb = tiny_config({"train": {"steps": 32, "run_dir": str(tmp_path / "source")}, "optim": {"name": "lamb"}},
                       "lamb.yaml")
    other = run_cli("train", lamb, check=False)
    assert other.returncode == 2 and other.stderr.strip().splitlines()[-1] == (
        f"jaxlm train: error: resuming from {tmp_path / 'source' / 'checkpoints' / '30'}: the checkpoint's train state "
        f"is laid out otherwise than this config's: {checkpoint.STATE_DIFFERS}")
    assert not (tmp_path / "source" / "unreadable-checkpoints").exists()
    assert (tmp_path / "source" / "metrics.jsonl").read_bytes() == recorded
    fresh = tiny_config({"train": {"steps": 2, "run_dir": str(tmp_path / "fresh")}}, "fresh.yaml")
    warm = tiny_config({"train": {"steps": 2, "run_dir": str(tmp_path / "warm"),
                                  "init_from": str(tmp_path / "source")}}, "warm.yaml")
    run_cli("train", fresh)
    proc = run_cli("train", warm)
    assert "initialised from" in proc.stdout + proc.stderr
    assert _losses(tmp_path / "warm")[1] < _losses(tmp_path / "fresh")[1] - 0.5
    missing = tiny_config({"train": {"run_dir": str(tmp_path / "x"), "init_from": str(tmp_path / "nowhere")}}, "m.yaml")
    bad = run_cli("train", missing, check=False)
    assert bad.returncode == 2 and "no checkpoint found" in bad.stderr
    wider = tiny_config({"model": {"intermediate_size": 128},
                         "train": {"run_dir": str(tmp_path / "wider"), "init_from": str(tmp_path / "source")}}, "w.yaml")
    misfit = run_cli("train", wider, check=False)
    assert misfit.returncode == 2, misfit.stderr[-2000:]
    assert "does not fit" in misfit.stderr and "(64, 256) vs config (64, 128)" in misfit.stderr, misfit.stderr[-2000:]
    assert not (tmp_path / "wider" / "checkpoints").exists() or not any((tmp_path / "wider" / "checkpoints").iterdir())
