"""Where metrics go: a progress bar, TensorBoard events and a JSONL file; and the final plot."""
from __future__ import annotations

import io
import json
import math
import sys

from etils import epath
from tqdm.auto import tqdm

from jaxlm.train.storage import GrowingText

BAR_KEYS = ("loss", "mlm_acc", "nsp_acc", "tokens_per_s", "mfu")


class MetricsWriter:
    """Writes on process 0 only; every other process gets a silent writer."""

    def __init__(self, run_dir: epath.Path, start_step: int, total_steps: int, active: bool = True):
        self.active = active
        if not active:
            return
        self.jsonl = GrowingText(epath.Path(run_dir) / "metrics.jsonl")
        self.tb = summary_writer(str(run_dir / "tensorboard"))
        self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    def write(self, step: int, metrics: dict, split: str = "train") -> None:
        if not self.active:
            return
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        self.jsonl.write(json.dumps({"step": step, "split": split, **clean}) + "\n")
        for key, value in clean.items():
            if math.isfinite(value):
                self.tb.add_scalar(f"{split}/{key}", value, step)
        if split == "train":
            self.bar.set_postfix({k: f"{clean[k]:.4g}" for k in BAR_KEYS if k in clean}, refresh=False)

    def advance(self, steps: int) -> None:
        if self.active:
            self.bar.update(steps)

    def message(self, text: str) -> None:
        if self.active:
            self.bar.write(text)

    def close(self) -> None:
        if self.active:
            self.bar.close()
            self.tb.close()
            self.jsonl.close()


def summary_writer(directory: str):
    """tensorboardX's writer, imported with PyTorch hidden from it: where torch is installed, tensorboardX
    imports it (2 s of every run's start) only to accept torch tensors, and the writer here logs floats."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # Python's way to make `import torch` raise ImportError
    try:
        from tensorboardX import SummaryWriter  # here: with torch hidden, and only on process 0
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter(directory)


def read_jsonl(path: epath.PathLike) -> list[dict]:
    """Records in order, keeping the last record for each (split, step): a resumed run rewrites steps."""
    latest: dict[tuple, dict] = {}
    for line in epath.Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            latest[(record.get("split"), record["step"])] = record
    return sorted(latest.values(), key=lambda r: (r.get("split") or "", r["step"]))


def plot_curves(jsonl_path: epath.PathLike, png_path: epath.PathLike, baselines: dict | None = None,
                panels: dict | None = None) -> None:
    """One panel per metric the records hold (loss, the pretraining accuracies and `panels`: key -> title)."""
    from matplotlib.figure import Figure  # here: 0.5 s that only the end of a run needs

    records = read_jsonl(jsonl_path)
    titles = {"loss": "loss", "mlm_acc": "MLM accuracy", "nsp_acc": "NSP accuracy", "sop_acc": "SOP accuracy",
              "sbo_acc": "SBO accuracy", "lm_acc": "token accuracy"} | (panels or {})
    panels = [(k, t) for k, t in titles.items() if k == "loss" or any(k in r for r in records)]
    # a Figure of its own (no pyplot): importing or plotting never changes a notebook's backend
    fig = Figure(figsize=(5 * len(panels), 4))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for split, style in (("train", "-"), ("eval", "o-")):
            points = [(r["step"], r[key]) for r in records if r.get("split") == split and key in r]
            if points:
                ax.plot(*zip(*points), style, label=split, markersize=4)
        if baselines and key in baselines:
            ax.axhline(baselines[key], color="gray", linestyle="--", label="trivial baseline")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    epath.Path(png_path).write_bytes(png.getvalue())
