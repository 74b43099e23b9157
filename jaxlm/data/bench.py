"""`jaxlm bench data`: examples/s of each config's input pipeline, from its prepared shards: per CPU core
in this thread, and through the loader with 0, 1, 2, ... grain worker processes."""
from __future__ import annotations

import dataclasses
import os
import time

import psutil

from jaxlm.config import RunConfig
from jaxlm.data.pipeline import open_data

WARM_UP_S = 2.0  # loader batches taken untimed after the first: every worker running, the buffers drained


def bench_split(config: RunConfig):
    """The train split `bench_data` times, opened and checked (ConfigError where the run's data is not there)."""
    _, train, _ = open_data(dataclasses.replace(config, train=dataclasses.replace(config.train, global_batch=1,
                                                                                  eval_batches=0)))
    return train


def bench_data(config: RunConfig, batches: int = 20, batch_size: int = 256, workers: int | None = None,
               train=None) -> dict:
    """Times `batches` local batches (read, decode, transform, stack). workers=None: built in this thread,
    one core's rate (CPU time), as each input worker runs; workers=N: taken from the loader the trainer
    uses (`iterate`, N grain processes, 0 a background thread), wall time in the steady state: after the
    first batch and WARM_UP_S more seconds of batches (the workers start one after the other, and the batches
    they built meanwhile would count as free). `cores_used`: the CPU time of this process and its workers
    over that wall time. A train split smaller than `batch_size` is timed in batches of the whole split; the
    run's train.global_batch and held-out split are neither read nor checked. `train`: its `bench_split`, if
    already opened."""
    train = bench_split(config) if train is None else train
    batch_size = min(batch_size, len(train))
    if workers is None:
        train.local_batch(0, batch_size)  # opens the shards, warms the caches
        started, wall = time.process_time(), time.perf_counter()
        for step in range(1, batches + 1):
            batch = train.local_batch(step, batch_size)
        cpu_s, wall_s = time.process_time() - started, time.perf_counter() - wall
        examples = batches * batch_size
        measures = {"examples_per_s_core": examples / max(cpu_s, 1e-9),
                    "tokens_per_s_core": examples * config.data.max_seq_length / max(cpu_s, 1e-9)}
    else:
        stream = train.iterate(0, batch_size, workers=workers)
        try:
            next(stream)  # the workers' start-up
            warm_until = time.perf_counter() + WARM_UP_S
            while time.perf_counter() < warm_until:
                next(stream)
            tree_cpu, wall = process_tree_cpu_s(), time.perf_counter()
            for _ in range(batches):
                batch = next(stream)
            wall_s = time.perf_counter() - wall
            measures = {"cores_used": (process_tree_cpu_s() - tree_cpu) / wall_s}
        finally:
            stream.close()
    return {"family": config.model.family, "layout": train.manifest["layout"],
            "seq_len": config.data.max_seq_length, "batch": batch_size,
            "workers": "thread" if workers is None else workers, "examples_per_s": batches * batch_size / wall_s,
            **measures, "ms_per_batch": wall_s / batches * 1e3, "fields": len(batch)}


def process_tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every process it started (the loader's workers)."""
    tree = psutil.Process()
    total = 0.0
    for process in (tree, *tree.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def median_rows(runs: list[dict]) -> list[dict]:
    """One row per (config, seq_len, workers) of repeated `bench_data` runs: the run of median examples/s,
    with the range of all of them as `examples_per_s_range` when there are several."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["config"], run["seq_len"], run["workers"]), []).append(run)
    rows = []
    for group in groups.values():
        group = sorted(group, key=lambda run: run["examples_per_s"])
        rate = [run["examples_per_s"] for run in group]
        spread = {"examples_per_s_range": f"{rate[0]:,.0f}-{rate[-1]:,.0f}"} if len(group) > 1 else {}
        rows.append(group[(len(group) - 1) // 2] | spread)
    return rows


def _cell(row: dict, column: str) -> str:
    value = row.get(column, "-")
    if not isinstance(value, float):
        return str(value)
    return f"{value:.2f}" if column == "cores_used" else f"{value:,.0f}"


def format_data_table(rows: list[dict]) -> str:
    columns = ("config", "family", "layout", "seq_len", "batch", "workers", "examples_per_s", "examples_per_s_range",
               "examples_per_s_core", "tokens_per_s_core", "cores_used", "ms_per_batch")
    cells = [[_cell(row, c) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    lines.append(f"workers: thread = built in the timing thread (per core: CPU time); N = the trainer's loader with N "
                 f"grain processes (0: one background thread), wall time, and the CPU time of the trainer's process and its "
                 f"workers over it (cores_used); this machine has {os.cpu_count()} cores")
    return "\n".join(lines)
