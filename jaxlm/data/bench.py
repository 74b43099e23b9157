"""`jaxlm bench data`: examples/s of each config's input pipeline, from its prepared shards: per CPU core
in this thread, and through the loader with 0, 1, 2, ... grain worker processes."""
from __future__ import annotations

import os
import time

from jaxlm.config import RunConfig
from jaxlm.data.pipeline import open_data

WARM_UP_S = 2.0  # loader batches taken untimed after the first: every worker running, the buffers drained


def bench_data(config: RunConfig, batches: int = 20, batch_size: int = 256, workers: int | None = None) -> dict:
    """Times `batches` local batches (read, decode, transform, stack). workers=None: built in this thread,
    one core's rate (CPU time), as each input worker runs; workers=N: taken from the loader the trainer
    uses (`iterate`, N grain processes, 0 a background thread), wall time in the steady state: after the
    first batch and WARM_UP_S more seconds of batches (the workers start one after the other, and the batches
    they built meanwhile would count as free)."""
    _, train, _ = open_data(config)
    if workers is None:
        train.local_batch(0, batch_size)  # opens the shards, warms the caches
        started, wall = time.process_time(), time.perf_counter()
        for step in range(1, batches + 1):
            batch = train.local_batch(step, batch_size)
        cpu_s, wall_s = time.process_time() - started, time.perf_counter() - wall
    else:
        stream = train.iterate(0, batch_size, workers=workers)
        try:
            next(stream)  # the workers' start-up
            warm_until = time.perf_counter() + WARM_UP_S
            while time.perf_counter() < warm_until:
                next(stream)
            wall = time.perf_counter()
            for _ in range(batches):
                batch = next(stream)
            wall_s = time.perf_counter() - wall
        finally:
            stream.close()
        cpu_s = None
    examples = batches * batch_size
    per_core = {"examples_per_s_core": examples / max(cpu_s, 1e-9),
                "tokens_per_s_core": examples * config.data.max_seq_length / max(cpu_s, 1e-9)} if cpu_s else {}
    return {"family": config.model.family, "layout": train.manifest["layout"],
            "seq_len": config.data.max_seq_length, "batch": batch_size,
            "workers": "thread" if workers is None else workers, "examples_per_s": examples / wall_s,
            **per_core, "ms_per_batch": wall_s / batches * 1e3, "fields": len(batch)}


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


def format_data_table(rows: list[dict]) -> str:
    columns = ("config", "family", "layout", "seq_len", "batch", "workers", "examples_per_s", "examples_per_s_range",
               "examples_per_s_core", "tokens_per_s_core", "ms_per_batch")
    cells = [[f"{row[c]:,.0f}" if isinstance(row.get(c), float) else str(row.get(c, "-")) for c in columns]
             for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    lines.append(f"workers: thread = built in the timing thread (per core: CPU time); N = the trainer's loader with N "
                 f"grain processes (0: one background thread), wall time; this machine has {os.cpu_count()} cores")
    return "\n".join(lines)
