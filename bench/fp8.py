"""FP8's convergence check: the same pretraining run (config, data, seed) trained as configured and with
model.fp8=true, and as configured from another initialisation; one table of their training and held-out
losses step by step and the largest gap of each to the first. FP8 follows where its gap is no larger than
the other initialisation's (on a GPU, against bfloat16: --set model.dtype=bfloat16; the CPU configs compute
in float32, around the same FP8 rounding).

    python bench/fp8.py [--config configs/bert-tiny.yaml] [--steps 600] [--dir .bench-data/fp8] [--set K=V ...]

The corpus is prepared once under --dir (the config's own corpus, or --set data.corpus=[...]); every run sees
the same batches, and the fp8 run starts from the plain run's initialisation, so its gap is FP8's rounding
alone."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

# name: overrides. The plain run again from another initialisation is the yardstick: FP8 follows where its gap to
# the plain curve is no larger than that run's.
RUNS = {"plain": ["model.fp8=false"], "fp8": ["model.fp8=true"], "seed 1": ["model.fp8=false", "train.seed=1"]}


def jaxlm(*args: str, log: pathlib.Path) -> None:
    """Runs `jaxlm ARGS` to the end, its output in `log`; stops with the log's tail where it fails."""
    with log.open("w") as output:
        code = subprocess.call([sys.executable, "-m", "jaxlm.cli", *args], stdout=output, stderr=subprocess.STDOUT)
    if code:
        sys.exit(f"jaxlm {' '.join(args)} failed:\n{log.read_text()[-3000:]}")


def losses(run_dir: pathlib.Path) -> dict[tuple[str, int], float]:
    """{(split, step): loss} from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {(r["split"], r["step"]): r["loss"] for r in rows if "loss" in r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bert-tiny.yaml")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--dir", default=".bench-data/fp8")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    args = parser.parse_args()
    root = pathlib.Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    data = [f"data.prepared_dir={root / 'data'}", *args.set]
    if not (root / "data" / "manifest.json").is_file():
        jaxlm("prepare", args.config, *data, log=root / "prepare.log")
    curves = {}
    for name, overrides in RUNS.items():
        run_dir = root / f"run-{name.replace(' ', '-')}"
        shutil.rmtree(run_dir, ignore_errors=True)
        jaxlm("train", args.config, *data, *overrides, f"train.steps={args.steps}", f"train.run_dir={run_dir}",
              f"train.log_every={max(args.steps // 12, 1)}", f"train.eval_every={max(args.steps // 4, 1)}",
              f"train.checkpoint_every={args.steps}", log=root / f"train-{run_dir.name}.log")
        curves[name] = losses(run_dir)
    print(f"{args.config} {' '.join(args.set)}: {args.steps} steps; fp8: model.fp8=true; seed 1: the plain run from "
          "another initialisation (train.seed=1)")
    print("| split | step | plain loss | fp8 loss | fp8 / plain | seed 1 loss | seed 1 / plain |")
    print("|---|---|---|---|---|---|---|")
    gaps: dict[tuple[str, str], list[float]] = {}
    for split, step in sorted(curves["plain"], key=lambda key: (key[0] != "train", key[1])):
        plain, fp8, other = (curves[name].get((split, step)) for name in RUNS)
        if fp8 is None or other is None:
            continue
        for name, loss in (("fp8", fp8), ("seed 1", other)):
            gaps.setdefault((split, name), []).append(abs(loss / plain - 1))
        print(f"| {split} | {step} | {plain:.4f} | {fp8:.4f} | {fp8 / plain:.4f} | {other:.4f} | {other / plain:.4f} |")
    for split in ("train", "eval"):
        print(f"largest {split} gap to the plain run: fp8 {max(gaps[split, 'fp8']):.2%}, "
              f"seed 1 {max(gaps[split, 'seed 1']):.2%}")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
