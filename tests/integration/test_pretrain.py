"""A short pretraining run of the demo config on the real corpus beats both trivial baselines."""
import json
import math

from conftest import ROOT, run_cli
from jaxlm.train.metrics import read_jsonl

STEPS = 400


def test_short_pretraining_beats_the_baselines(tmp_path):
    overrides = [f"data.prepared_dir={tmp_path / 'data'}", "data.dupe_factor=1", f"train.run_dir={tmp_path / 'run'}",
                 f"train.steps={STEPS}", "train.eval_every=1000", "train.checkpoint_every=1000",
                 "train.eval_batches=40"]
    config = ROOT / "configs" / "bert-tiny.yaml"
    run_cli("prepare", config, *overrides, devices=1)
    # one device, as `make demo` runs: 1.4x the steps per second of 8 simulated ones on 2 cores, the same losses
    # (every objective also trains on 8 devices: test_objectives_train.py)
    proc = run_cli("train", config, *overrides, devices=1, timeout=1800)
    assert "held-out after" in proc.stdout

    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    train = [r["loss"] for r in records if r["split"] == "train"]
    assert len(train) == STEPS // 10
    assert sum(train[-5:]) / 5 < sum(train[:2]) / 2 - 2.0, train

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mlm_acc"] >= 1.5 * summary["mlm_baseline"], summary
    standard_error = math.sqrt(0.25 / summary["examples"])
    assert summary["nsp_acc"] > 0.5 + 3 * standard_error, summary
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))

    # run again, as `make demo` again: a finished run only reports (it once compiled, evaluated again and recorded
    # that evaluation a second time in metrics.jsonl)
    recorded = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    again = run_cli("train", config, *overrides, devices=1)
    report = lambda output: output[output.index("held-out after"):]
    assert report(again.stdout) == report(proc.stdout)
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == recorded
