"""What `jaxlm eval` writes in --out: results.jsonl (one record per run, step, task and metric),
results.csv (one row per run and step), curves.png, per-item examples files, and the printed table."""
from __future__ import annotations

import csv
import io
import json
import math
import pathlib

from jaxlm.corpora.download import write_atomic

RESULTS = "results.jsonl"
WRITTEN = (RESULTS, "results.csv", "curves.png")  # the files of every evaluation's --out
# counts and baselines, which are records but not curves
NOT_PLOTTED = ("tokens", "lines", "random_baseline")


def check_results_files(out: pathlib.Path) -> None:
    """Refuses an --out where a file the evaluation writes is a directory (`read_records` checks results.jsonl's
    text)."""
    for name in WRITTEN:
        if (out / name).is_dir():
            raise ValueError(f"{out / name} is a directory where the evaluation writes its {name}: move it or "
                             "choose another --out")


def read_records(out: pathlib.Path) -> list[dict]:
    """The records written so far; a line cut short by an interruption is ignored."""
    path = out / RESULTS
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text, so not the results of a `jaxlm eval`: move it or choose another "
                         "--out") from None
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and {"source", "step", "task", "metric"} <= set(record):
            records.append(record)
    return records


def done(records: list[dict]) -> set[tuple[str, int, str]]:
    """(source, step, task) triples already evaluated."""
    return {(r["source"], r["step"], r["task"]) for r in records}


def append_records(out: pathlib.Path, records: list[dict]) -> None:
    """All the metrics of one (source, step, task) in one write, so an interruption leaves none or all; after a
    line an interruption cut short, on a line of their own (glued to it, the first would be lost with it)."""
    text = "".join(json.dumps(r) + "\n" for r in records)
    with open(out / RESULTS, "a+b") as stream:
        end = stream.seek(0, io.SEEK_END)
        if end:
            stream.seek(end - 1)
            if stream.read(1) != b"\n":
                text = "\n" + text
        stream.write(text.encode("utf-8"))


def write_examples(path: pathlib.Path, rows: list[dict]) -> None:
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def wide_rows(records: list[dict]) -> tuple[list[str], list[dict]]:
    """(columns, rows): one row per run and step, one column per task/metric."""
    columns: list[str] = []
    rows: dict[tuple, dict] = {}
    for r in records:
        column = f"{r['task']}/{r['metric']}"
        if column not in columns:
            columns.append(column)
        rows.setdefault((r["run"], r["step"]), {"run": r["run"], "step": r["step"]})[column] = r["value"]
    return ["run", "step", *columns], [rows[k] for k in sorted(rows, key=lambda k: (k[0], k[1]))]


def write_csv(out: pathlib.Path, records: list[dict]) -> None:
    columns, rows = wide_rows(records)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(out / "results.csv", buffer.getvalue())


def cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) and abs(value) < 1e6 else f"{value:.4g}"
    return str(value)


def format_table(records: list[dict], errors: list[str] = ()) -> str:
    """One block per task: a row per run and step, a column per metric; then the checkpoints skipped."""
    blocks = []
    for task in dict.fromkeys(r["task"] for r in records):
        mine = [r for r in records if r["task"] == task]
        metrics = list(dict.fromkeys(r["metric"] for r in mine))
        rows: dict[tuple, dict] = {}
        for r in mine:
            rows.setdefault((r["run"], r["step"]), {"run": r["run"], "step": r["step"],
                                                     "examples": r.get("examples", "")})[r["metric"]] = r["value"]
        header = ["run", "step", "examples", *metrics]
        body = [[cell(row.get(c, "")) for c in header] for row in (rows[k] for k in sorted(rows))]
        widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(header)]
        lines = [f"{task}", "  " + "  ".join(h.ljust(w) for h, w in zip(header, widths))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
        blocks.append("\n".join(lines))
    if errors:
        blocks.append("skipped:\n" + "\n".join(f"  {e}" for e in errors))
    return "\n\n".join(blocks)


def plot_curves(out: pathlib.Path, records: list[dict]) -> None:
    """curves.png: each task/metric against step, one line per run, its baseline dashed."""
    from matplotlib.figure import Figure  # here: 0.5 s that only the end of a sweep needs

    panels = list(dict.fromkeys((r["task"], r["metric"]) for r in records
                                if isinstance(r["value"], (int, float)) and r["metric"] not in NOT_PLOTTED))
    if not panels:
        return
    colors = {run: f"C{i % 10}" for i, run in enumerate(dict.fromkeys(r["run"] for r in records))}
    columns = min(4, len(panels))
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(4.5 * columns, 3.5 * rows))
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, (task, metric) in zip(axes, panels):
        mine = [r for r in records if r["task"] == task and r["metric"] == metric]
        for run in dict.fromkeys(r["run"] for r in mine):
            points = sorted((r["step"], r["value"]) for r in mine if r["run"] == run)
            ax.plot(*zip(*points), "o-", markersize=3, label=run, color=colors[run])
            baselines = [r["baseline"] for r in mine if r["run"] == run and "baseline" in r]
            if baselines:
                ax.axhline(baselines[-1], color=colors[run], linestyle="--", linewidth=1)
        ax.set_title(f"{task} {metric}", fontsize=9)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=90)
