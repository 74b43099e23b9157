"""FP8's convergence in CI: BERT-tiny pretrained on real text with and without model.fp8, the same data,
initialisation and batches (and the vocabulary learnt from that text, as the other tests' runs); the FP8 run's
held-out loss falls as the plain run's does and ends within 2% of it (`bench/fp8.py` is the longer check)."""
from __future__ import annotations

import json

from conftest import VOCAB_SIZE, austen_vocab, run_cli
from jaxlm.cli import main

CONFIG = "configs/bert-tiny.yaml"
COMMON = ["model.num_layers=1", "data.corpus=[demo:austen]", "data.max_seq_length=64", "data.max_predictions=10",
          "data.dupe_factor=1", "train.steps=60", "train.global_batch=16", "train.log_every=20", "train.eval_every=30",
          "train.eval_batches=8", "train.checkpoint_every=1000", "optim.warmup_steps=10"]


def eval_losses(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "eval"}


def test_fp8_follows_the_plain_loss_curve(tmp_path, capsys):
    data = [*COMMON, f"data.prepared_dir={tmp_path / 'data'}", f"data.vocab={austen_vocab()}",
            f"model.vocab_size={VOCAB_SIZE}"]
    assert main(["prepare", CONFIG, *data]) == 0
    curves = {}
    for fp8 in ("false", "true"):  # each in a process of its own, which a native crash ends with its output kept
        run_dir = tmp_path / f"run-fp8-{fp8}"
        run_cli("train", CONFIG, *data, f"model.fp8={fp8}", f"train.run_dir={run_dir}")
        curves[fp8] = eval_losses(run_dir)
    plain, fp8 = curves["false"], curves["true"]
    with capsys.disabled():
        print(f"\nheld-out loss without / with fp8: {plain} / {fp8}")
    assert plain.keys() == fp8.keys() == {0, 30, 60}
    assert fp8[60] < 0.8 * fp8[0]
    for step in (0, 30, 60):
        assert abs(fp8[step] / plain[step] - 1) < (1e-3 if step == 0 else 0.02), (step, plain, fp8)
