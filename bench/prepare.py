"""Preparation at corpus scale: a corpus of --mb megabytes made of the demo corpora's documents repeated,
prepared by `jaxlm prepare` in-process and on Beam's direct runner with 1 and 2 workers; one table of
MB of text per second and peak memory (the command and its worker processes together, sampled every
0.1 s), and whether every run wrote the same files.

    python bench/prepare.py --mb 2048 [--config configs/bert-tiny.yaml] [--runs inprocess,beam1,beam2]
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import pathlib
import subprocess
import sys
import time

import psutil

from jaxlm.corpora.registry import fetch_demo_corpus
from jaxlm.corpora.text import repeated_copy, write_repeated

RUNS = {"inprocess": [], "beam1": ["--runner", "direct"], "beam2": ["--runner", "direct", "--workers", "2"]}


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants."""
    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run(command: list[str], log: pathlib.Path) -> tuple[float, int]:
    """(seconds, peak resident bytes of the process tree) of a command that must succeed; its output
    goes to `log` (a pipe nobody reads until the end would fill and stall the command)."""
    start = time.perf_counter()
    with log.open("w") as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        watched, peak = psutil.Process(child.pid), 0
        while child.poll() is None:
            try:
                peak = max(peak, tree_rss(watched))
            except psutil.Error:
                pass
            time.sleep(0.1)
    if child.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{log.read_text()[-4000:]}")
    return time.perf_counter() - start, peak


def digest(directory: pathlib.Path) -> str:
    h = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2048, help="megabytes of text, at least: whole copies of the "
                        "demo corpora, so one copy at the least")
    parser.add_argument("--config", default="configs/bert-tiny.yaml")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--dir", default=".bench-data/prepare")
    parser.add_argument("--set", action="append", default=[], help="a config override, e.g. data.dupe_factor=5")
    args = parser.parse_args()
    runs = [name for name in args.runs.split(",") if name]
    unknown = [name for name in runs if name not in RUNS]
    if unknown or not runs:
        parser.error(f"--runs {args.runs!r}: give names from {', '.join(RUNS)}, separated by commas")
    sources = fetch_demo_corpus()
    copy_mb = len(repeated_copy(sources).encode("utf-8")) / 2**20
    if not args.mb >= copy_mb:  # NaN too
        parser.error(f"--mb {args.mb:g}: the corpus is whole copies of the demo corpora, {copy_mb:.2f} MB each; "
                     f"give {math.ceil(copy_mb * 10) / 10:g} or more")
    root = pathlib.Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / f"corpus-{args.mb:g}mb.txt"
    if not corpus.is_file():
        write_repeated(sources, corpus, int(args.mb * 2**20))
    mb = corpus.stat().st_size / 2**20
    print(f"corpus {corpus}: {mb:,.0f} MB; config {args.config} {' '.join(args.set)}", flush=True)
    print("| run | workers | seconds | MB/s | peak memory (GiB) | output digest |")
    print("|---|---|---|---|---|---|")
    for name in runs:
        out = root / f"out-{name}"
        command = [sys.executable, "-m", "jaxlm.cli", "prepare", args.config, f"data.corpus=[{corpus}]",
                   f"data.prepared_dir={out}", *args.set, "--overwrite", *RUNS[name]]
        seconds, peak = run(command, root / f"{name}.log")
        workers = RUNS[name][-1] if "--workers" in RUNS[name] else ("1" if RUNS[name] else "-")
        print(f"| {name} | {workers} | {seconds:,.0f} | {mb / seconds:,.2f} | {peak / 2**30:.2f} | {digest(out)} |",
              flush=True)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
