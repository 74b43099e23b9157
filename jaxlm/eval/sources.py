"""What `jaxlm eval` reads: run directories, single checkpoints and converted checkpoints as sources,
their committed steps, the step selection, the evaluation config after overrides, and the output
directory's place (never inside a source)."""
from __future__ import annotations

import dataclasses
import pathlib
import re
import time

import flax.linen as nn
import jax

from jaxlm import config as config_lib
from jaxlm import families
from jaxlm.config import ConfigError, MeshConfig, RunConfig
from jaxlm.convert import store
from jaxlm.corpora.text import check_writable
from jaxlm.data.sources import model_tokenizer
from jaxlm.data.settings import DataConfig
from jaxlm.errors import first_line
from jaxlm.eval import results
from jaxlm.models.presets import model_config
from jaxlm.train import checkpoint


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which committed steps to evaluate: all, latest, every:N (multiples of N), steps:A,B,..."""

    kind: str = "all"
    every: int = 0
    steps: tuple[int, ...] = ()

    def pick(self, steps: list[int]) -> list[int]:
        steps = sorted(steps)
        if self.kind == "latest":
            return steps[-1:]
        if self.kind == "every":
            return [s for s in steps if s % self.every == 0]
        if self.kind == "steps":
            return [s for s in steps if s in self.steps]
        return steps


def parse_selection(text: str) -> Selection:
    text = text.strip()
    if text in ("all", "latest"):
        return Selection(text)
    match = re.fullmatch(r"every:(\d+)", text)
    if match and int(match.group(1)) > 0:
        return Selection("every", every=int(match.group(1)))
    match = re.fullmatch(r"steps:(\d+(?:,\d+)*)", text)
    if match:
        return Selection("steps", steps=tuple(int(s) for s in match.group(1).split(",")))
    raise ValueError(f"--select {text!r}; choose all, latest, every:N (N > 0) or steps:A,B,...")


@dataclasses.dataclass
class Source:
    """One input: `directory` is its Orbax manager's, `own_step` the step a checkpoints/<step> path
    names, `run_dir` the training run it belongs to (None for converted checkpoints), `stored` the
    config item its checkpoints carry and `config` that config after the evaluation's overrides."""

    label: str
    path: pathlib.Path
    directory: pathlib.Path
    own_step: int | None
    run_dir: pathlib.Path | None
    stored: dict
    config: RunConfig

    @property
    def is_run(self) -> bool:
        return "train" in self.stored

    @property
    def final_step(self) -> int:
        """The step the run ends at (0 for a converted checkpoint)."""
        return int(self.stored["train"]["steps"]) if self.is_run else 0

    def committed_steps(self) -> list[int]:
        """Steps Orbax has finalised, read afresh from disk (a checkpoint still being written is not one)."""
        mngr = checkpoint.read_only_manager(self.directory)
        try:
            steps = sorted(mngr.all_steps())
        finally:
            mngr.close()
        return [s for s in steps if self.own_step is None or s == self.own_step]

    def commit_stamp(self, step: int) -> int | None:
        """When Orbax committed `step` (ns since the epoch), which tells a checkpoint from one written at the same
        path and step later (a run trained anew); None where the checkpoint is gone or does not say."""
        mngr = checkpoint.read_only_manager(self.directory)
        try:
            return getattr(mngr.metadata(step), "commit_timestamp_nsecs", None)
        except FileNotFoundError:
            return None
        finally:
            mngr.close()

    def stored_params(self, step: int) -> dict:
        """The parameter tree's metadata at `step` (shapes only; no array is read)."""
        mngr = checkpoint.read_only_manager(self.directory)
        try:
            return checkpoint.stored_tree(mngr, step).get("params", {})
        finally:
            mngr.close()


def _stored_config(directory: pathlib.Path, step: int, path: pathlib.Path) -> dict:
    mngr = checkpoint.read_only_manager(directory)
    try:
        stored = checkpoint.stored_config(mngr, step)
    except Exception as err:  # Orbax raises many kinds for an unreadable item
        raise ValueError(f"{path} is not a jaxlm checkpoint: step {step} has no readable config ({first_line(err)}); "
                         f"{store.NOT_A_CHECKPOINT}") from None
    finally:
        mngr.close()
    if stored is None:
        raise ValueError(f"{path} is not a jaxlm checkpoint: step {step} records no model config; "
                         f"{store.NOT_A_CHECKPOINT}")
    return stored


class NoCheckpointYet(ValueError):
    """The source (still) holds no committed checkpoint."""


def open_source(path: str | pathlib.Path, overrides: list[str], wait: float = 0.0, poll: float = 2.0) -> Source:
    """A Source for a run directory, its checkpoints/ or checkpoints/<step>, or a converted checkpoint;
    NoCheckpointYet when it holds no committed checkpoint (after waiting up to `wait` seconds for one
    to appear: a watched run may not have written its first)."""
    deadline, said = time.time() + wait, False
    while True:
        try:
            return _open_source(pathlib.Path(path), overrides)
        except NoCheckpointYet as err:
            if time.time() >= deadline or not pathlib.Path(path).absolute().parent.is_dir():
                raise
            if not said:  # a mistyped path waited in silence, 30 minutes by default
                print(f"jaxlm eval: {str(err).split(';')[0]}; waiting up to {wait:g} s for its first checkpoint",
                      flush=True)
                said = True
            time.sleep(poll)


def _open_source(given: pathlib.Path, overrides: list[str]) -> Source:
    if not given.exists():  # a run yet to start, which --watch waits for (checkpoint.resolve refuses a file)
        raise NoCheckpointYet(f"{given}: no such directory; give a run directory (train.run_dir), one of its "
                                "checkpoints/<step> directories or a `jaxlm convert` output")
    directory, own = checkpoint.resolve(given)
    directory = directory.absolute()
    mngr = checkpoint.read_only_manager(directory)
    try:
        steps = sorted(mngr.all_steps())
    finally:
        mngr.close()
    if own is not None and own not in steps:
        raise ValueError(f"{given}: step {own} is not a committed checkpoint (still being written, or broken)")
    if not steps:
        raise NoCheckpointYet(f"{given} holds no committed checkpoint; give a run directory with checkpoints/, one "
                         "checkpoints/<step> directory or a `jaxlm convert` output")
    stored = _stored_config(directory, own if own is not None else steps[-1], given)
    run_dir = directory.parent if "train" in stored else None
    label = (run_dir or directory).name
    return Source(label, given.absolute(), directory, own, run_dir, stored, eval_config(stored, overrides, given))


def eval_config(stored: dict, overrides: list[str], where) -> RunConfig:
    """The source's config with the evaluation's overrides; ConfigError for one that changes the
    parameters' shapes (naming them) or that a converted checkpoint cannot take."""
    extra = config_lib.parse_overrides(overrides)
    if "train" in stored:
        config = config_lib.from_dict(config_lib.merge(stored, extra))
        original = config_lib.from_dict(stored).model
    else:  # a model alone: its model, mesh and distributed overrides apply; data.* and train.* are the runs'
        unknown = sorted(set(extra) - set(config_lib.SECTIONS))
        if unknown:
            raise ConfigError(f"unknown section(s) {unknown}; valid sections: {', '.join(config_lib.SECTIONS)}")
        try:
            original = model_config(**stored["model"])
            model = model_config(**config_lib.merge(stored["model"], extra.get("model", {})))
            model.validate()
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{where}: {err}") from None
        config = RunConfig(model=model, mesh=config_lib.section(MeshConfig, extra.get("mesh") or {}, "mesh"),
                           distributed=config_lib.section(config_lib.DistributedConfig,
                                                          extra.get("distributed") or {}, "distributed"))
    if "model" in extra:
        check_same_shapes(original, config.model, where)
    return config


def param_shapes(model) -> dict[str, tuple]:
    objective = families.make_objective(model, DataConfig(max_seq_length=16, max_predictions=2))
    tree = jax.eval_shape(objective.init, jax.random.key(0))
    return {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_flatten_with_path(nn.unbox(tree))[0]}


def check_same_shapes(original, changed, where, listed: int = 6) -> None:
    before, after = param_shapes(original), param_shapes(changed)
    problems = [f"{name} {before.get(name)} -> {after.get(name)}" for name in sorted(set(before) | set(after))
                if before.get(name) != after.get(name)]
    if problems:
        more = f" (and {len(problems) - listed} more)" if len(problems) > listed else ""
        raise ConfigError(f"{where}: the model overrides change the parameters' shapes: {'; '.join(problems[:listed])}"
                          f"{more}; evaluation may change how the model runs (attention kernel, dtype, remat, mesh), "
                          "not its parameters")


def source_tokenizer(source: Source):
    """The tokenizer a source's checkpoints were made with: a run's data.vocab (with its lowercase and
    sentinels settings), or a converted checkpoint's tokenizer/ directory."""
    if source.is_run:
        return model_tokenizer(source.config)
    directory = source.directory / store.TOKENIZER_DIR
    if not directory.is_dir():
        raise store.no_tokenizer(source.path, "text cannot become ids")
    return store.CheckpointTokenizer(directory, layout=families.get(source.config.model.family).layout).load()


def check_out(out: pathlib.Path, sources: list[Source]) -> None:
    """Refuse an output directory inside (or equal to) a source's run or checkpoint directory or another run's, or
    where nothing can be written."""
    target = out.resolve()
    runs = [p for p in (target, *target.parents) if checkpoint.is_run_dir(p)]
    for source in sources:
        runs += filter(None, (source.run_dir, source.directory, source.path))
    for guarded in runs:  # the sources, and any other run (whose curves.png the evaluation's would replace)
        guarded = guarded.resolve()
        if target == guarded or guarded in target.parents:
            raise ValueError(f"--out {out} lies inside {guarded}; the evaluator never writes into a run or "
                             "checkpoint directory: choose an --out outside it (default: eval/)")
    check_writable(out, f"--out {out}")
    results.check_results_files(out)
