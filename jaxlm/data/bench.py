"""`jaxlm bench data`: examples/s per CPU core of each config's pipeline, from its prepared shards."""
from __future__ import annotations

import os
import time

from jaxlm.config import RunConfig
from jaxlm.data.pipeline import open_data


def bench_data(config: RunConfig, batches: int = 20, batch_size: int = 256) -> dict:
    """Times building `batches` local batches (read, decode, transform, stack) in this thread:
    one core's rate, as each input worker of a host would run."""
    _, train, _ = open_data(config)
    train.local_batch(0, batch_size)  # opens the shards, warms the caches
    started = time.process_time()
    wall = time.perf_counter()
    for step in range(1, batches + 1):
        batch = train.local_batch(step, batch_size)
    cpu_s, wall_s = time.process_time() - started, time.perf_counter() - wall
    examples = batches * batch_size
    return {"family": config.model.family, "layout": train.manifest["layout"],
            "seq_len": config.data.max_seq_length, "batch": batch_size,
            "examples_per_s_core": examples / max(cpu_s, 1e-9), "examples_per_s": examples / wall_s,
            "tokens_per_s_core": examples * config.data.max_seq_length / max(cpu_s, 1e-9),
            "ms_per_batch": wall_s / batches * 1e3, "fields": len(batch)}


def format_data_table(rows: list[dict]) -> str:
    columns = ("config", "family", "layout", "seq_len", "batch", "examples_per_s_core", "tokens_per_s_core",
               "ms_per_batch")
    cells = [[f"{row[c]:,.0f}" if isinstance(row[c], float) else str(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    lines.append(f"one thread of one process per row (CPU time); this machine has {os.cpu_count()} cores")
    return "\n".join(lines)
