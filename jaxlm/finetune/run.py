"""`jaxlm finetune`: the plan (config, source checkpoint, tokenizer, records, rows; every check before
compute), then the pretraining trainer's sharded step on the task's objective, evaluation on dev every
epoch, the best checkpoint kept by the dev metric, early stopping, and the test split on the best."""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.experimental import multihost_utils

from jaxlm import config as config_lib
from jaxlm import families
from jaxlm.config import ConfigError, RunConfig
from jaxlm.convert import store
from jaxlm.corpora.text import check_writable
from jaxlm.data.sources import resolve_vocab
from jaxlm.eval.sources import Source, eval_config, open_source, source_tokenizer
from jaxlm.finetune import data as task_data
from jaxlm.finetune.features import Rows, batch_rows, fitted_batch
from jaxlm.finetune.optim import check_ulmfit, layer_groups, slanted_triangular, ulmfit
from jaxlm.finetune.tasks import LOWER_IS_BETTER, TASKS, Context, Task
from jaxlm.models.task_heads import POOLINGS
from jaxlm.parallel.mesh import replicated
from jaxlm.parallel.xla_options import project_xla_options
from jaxlm.train import checkpoint, run_lock
from jaxlm.train.loop import Setup, batch_structs, build, compile_steps, global_batch, memory_summary
from jaxlm.train.metrics import MetricsWriter, plot_curves
from jaxlm.train.optim import make_optimizer, schedule
from jaxlm.train.state import count_params, create_state
from jaxlm.train.step import dropout_key, init_key

SPLITS = ("train", "dev", "test")
# the finetune section's counts: those that must be positive, and those where 0 means none (no overlap of
# question-answering windows, no early stopping)
POSITIVE_SETTINGS = ("max_length", "n_best", "max_answer_length", "max_span_length", "max_target_length",
                     "num_beams", "evals_per_epoch", "max_query_length")
SETTINGS_OR_ZERO = ("doc_stride", "early_stopping")
SHORTEST_MAX_LENGTH = 8  # a pair's three special tokens and a few of each text's


# ---------------------------------------------------------------- the plan (no compute)

def load(path, overrides=(), init_from: str | None = None) -> tuple[RunConfig, Source]:
    """The fine-tune config: the file and `overrides`, the model section taken from the checkpoint
    `finetune.init_from` names (overrides of it may change how it runs, not its shapes)."""
    tree = config_lib.merge(config_lib.load_tree(path), config_lib.parse_overrides(list(overrides)))
    settings = tree.get("finetune") or {}
    if init_from is not None:
        settings = {**settings, "init_from": init_from}
    task = settings.get("task")
    if task is None:
        raise ConfigError(f"{path} has no finetune.task: it is not a fine-tuning config (those are in "
                          "configs/finetune/); set finetune.task to one of " + ", ".join(TASKS))
    if task not in TASKS:
        raise ConfigError(f"{path}: finetune.task={task!r}; choose one of {', '.join(TASKS)}")
    if not settings.get("init_from"):
        raise ConfigError(f"{path}: finetune.init_from is empty; name a training run, one of its "
                          "checkpoints/<step> directories or a `jaxlm convert` output")
    try:
        source = open_source(settings["init_from"], [])
    except ValueError as err:
        raise ConfigError(f"finetune.init_from: {err}") from None
    model_overrides = tree.get("model") or {}
    eval_config(source.stored, [f"model.{k}={json.dumps(v)}" for k, v in model_overrides.items()],
                f"finetune.init_from={settings['init_from']}")  # refuses an override that changes shapes
    tree = {**tree, "finetune": settings, "model": config_lib.merge(source.stored["model"], model_overrides),
            "data": source_data(source)}
    config = config_lib.from_dict(tree)
    check_settings(config)
    return config, source


def source_data(source: Source) -> dict:
    """The data section that names the source's tokenizer: a run's data.vocab (with its lowercase and
    sentinels settings) or a converted checkpoint's tokenizer/ directory."""
    if source.is_run:
        data = source.config.data
        return {"vocab": data.vocab, "lowercase": data.lowercase, "sentinels": data.sentinels}
    return {"vocab": str(source.directory / store.TOKENIZER_DIR)}


def check_own_settings(settings) -> None:
    """ConfigError where a setting only other heads read is set: the task would ignore it silently."""
    task, defaults = TASKS[settings.task], type(settings)()
    for name in sorted({name for other in TASKS.values() for name in other.own_settings} - set(task.own_settings)):
        value = getattr(settings, name)
        if value != getattr(defaults, name):
            readers = " and ".join(other.name for other in TASKS.values() if name in other.own_settings)
            shown = str(value).lower() if isinstance(value, bool) else repr(value)
            raise ConfigError(f"finetune.{name}={shown} is read by {readers} only; {task.name} would ignore it: "
                              "remove it")


def check_settings(config: RunConfig) -> None:
    settings, model = config.finetune, config.model
    heads = families.get(model.family).heads
    if settings.task not in heads:
        raise ConfigError(f"finetune.task={settings.task} does not fit a {model.family} model; its heads: "
                          f"{', '.join(heads) or 'none'}")
    positions = model.max_position_embeddings - model.position_offset
    if settings.max_length > positions:
        raise ConfigError(f"finetune.max_length={settings.max_length} exceeds the model's {positions} positions")
    for name in POSITIVE_SETTINGS:
        if getattr(settings, name) <= 0:
            raise ConfigError(f"finetune.{name} must be positive, got {getattr(settings, name):g}")
    if settings.max_length < SHORTEST_MAX_LENGTH:
        raise ConfigError(f"finetune.max_length={settings.max_length} leaves no room for the special tokens and some "
                          f"text; give {SHORTEST_MAX_LENGTH} or more")
    for name in SETTINGS_OR_ZERO:
        if getattr(settings, name) < 0:
            raise ConfigError(f"finetune.{name} must be 0 or more, got {getattr(settings, name)}")
    if settings.epochs <= 0:
        raise ConfigError(f"finetune.epochs must be positive, got {settings.epochs}")
    if not 0 <= settings.warmup_ratio < 1:
        raise ConfigError(f"finetune.warmup_ratio must be in [0, 1), got {settings.warmup_ratio}")
    if settings.pooling and settings.pooling not in POOLINGS:
        raise ConfigError(f"finetune.pooling={settings.pooling!r}; choose one of {', '.join(POOLINGS)}, or leave it "
                          "empty for the family's own")
    check_ulmfit(settings.train_layers, settings.layer_lr_decay, settings.unfreeze_every)
    if settings.schedule not in ("linear", "slanted_triangular"):
        raise ConfigError(f"finetune.schedule={settings.schedule!r}; choose linear or slanted_triangular")
    check_own_settings(settings)
    TASKS[settings.task].check_settings(settings)
    if not settings.train:
        raise ConfigError("finetune.train is empty; name the training data (a JSONL, CSV or TSV file, "
                          "tfds:NAME:SPLIT or a named dataset such as polarity:train)")


@dataclasses.dataclass
class Plan:
    config: RunConfig
    task: Task
    ctx: Context
    source: Source
    records: dict[str, list[dict]]
    rows: dict[str, Rows]
    steps_per_epoch: int
    eval_every: int
    metric: str  # the dev metric that picks the best checkpoint

    @property
    def total_steps(self) -> int:
        return self.config.train.steps


def read_split(task: Task, config: RunConfig, split: str) -> list[dict]:
    settings = config.finetune
    return task_data.read_records(getattr(settings, split), task.field_names(settings), task.roles,
                                  f"finetune.{split}", config.data.tfds_data_dir)


def plan(config: RunConfig, source: Source) -> Plan:
    """Reads and checks every split, encodes it and sizes the run: all before any compute."""
    settings = config.finetune
    task = TASKS[settings.task]
    records = {split: read_split(task, config, split) for split in SPLITS if getattr(settings, split)}
    labels = task.labels(settings, records["train"])
    settings = dataclasses.replace(settings, labels=labels)
    for split, split_records in records.items():
        task.check(split_records, labels, f"finetune.{split}={getattr(settings, split)}", settings)
    metric = task.metric_for(settings, records.get("dev") or records["train"])
    tokenizer = source_tokenizer(source)
    if tokenizer.vocab_size > config.model.vocab_size:
        raise ConfigError(f"{source.path}'s tokenizer has {tokenizer.vocab_size} tokens, more than the model's "
                          f"vocabulary ({config.model.vocab_size}): tokenizer and checkpoint do not match")
    ctx = Context(config.model, settings, labels, tokenizer)
    check_train_layers(settings.train_layers, task.objective(ctx))
    rows = {split: task.rows(ctx, split_records, labelled=True) for split, split_records in records.items()}
    batch = fitted_batch(config.train.global_batch, len(rows["train"]), jax.device_count())
    steps_per_epoch = math.ceil(len(rows["train"]) / batch)
    total = max(1, math.ceil(settings.epochs * steps_per_epoch))
    if total >= config_lib.INT_LIMIT:  # the step reaches the jitted schedule as an int32: an OverflowError's traceback
        raise ConfigError(f"finetune.epochs={settings.epochs:g} makes {total:,} steps ({steps_per_epoch} an epoch), "
                          f"more than a run counts ({config_lib.INT_LIMIT - 1:,}); give fewer epochs")
    config = dataclasses.replace(
        config, finetune=settings,
        train=dataclasses.replace(config.train, global_batch=batch, steps=total, checkpoint_every=total,
                                  eval_every=total),
        optim=dataclasses.replace(config.optim, warmup_steps=int(settings.warmup_ratio * total)))
    eval_every = max(1, round(steps_per_epoch / settings.evals_per_epoch))
    return Plan(config, task, dataclasses.replace(ctx, settings=config.finetune), source, records, rows,
                steps_per_epoch, eval_every, metric)


def check_train_layers(train_layers: int, objective) -> None:
    """ConfigError for a finetune.train_layers beyond the model's layers (every one of them would train, the
    embeddings not: a larger number was taken as that, silently)."""
    if train_layers <= 0:
        return
    layers = layer_groups(nn.unbox(jax.eval_shape(objective.init, jax.random.key(0))))[1] - 1
    if train_layers > layers:
        raise ConfigError(f"finetune.train_layers={train_layers} exceeds the model's {layers} layer groups (ALBERT's "
                          f"shared layer is one); give at most {layers}, or -1 to train every parameter")


def optimizer_for(config: RunConfig, steps_per_epoch: int):
    """(abstract params) -> (optimizer, schedule): the config's optimiser on the fine-tune's schedule,
    then ULMFiT's layer-wise freezing and rates when asked for."""
    settings, total = config.finetune, config.train.steps

    def make(abstract_params):
        lr = (slanted_triangular(total, config.optim.peak_lr) if settings.schedule == "slanted_triangular"
              else schedule(config.optim, total))
        optimizer = make_optimizer(config.optim, total, lr)
        if settings.train_layers >= 0 or settings.layer_lr_decay != 1.0 or settings.unfreeze_every > 0:
            optimizer = optax.chain(optimizer, ulmfit(
                abstract_params, train_layers=settings.train_layers, layer_lr_decay=settings.layer_lr_decay,
                unfreeze_every=round(settings.unfreeze_every * steps_per_epoch)))
        return optimizer, lr

    return make


# ---------------------------------------------------------------- running rows through the model

class Runner:
    """The task's compiled deterministic outputs over rows, in batches of train.global_batch padded
    with weight-0 rows, each process feeding its own slice; outputs come back whole to every process."""

    def __init__(self, setup: Setup, task: Task):
        self.setup, self.size = setup, setup.config.train.global_batch
        with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
            fn = jax.jit(task.outputs(setup.objective), in_shardings=(setup.shardings.params, setup.batch_shardings),
                         out_shardings=replicated(setup.mesh))
            self.compiled = fn.lower(setup.abstract.params, batch_structs(setup)).compile(
                project_xla_options(setup.mesh.devices.flat) or None)

    def outputs(self, params, rows: Rows):
        pieces = []
        for start in range(0, len(rows), self.size):
            indices = np.arange(start, min(start + self.size, len(rows)))
            batch = local_rows(batch_rows(rows, indices, self.size))
            out = jax.device_get(self.compiled(params, global_batch(self.setup, batch)))
            pieces.append(jax.tree.map(lambda x, n=len(indices): np.asarray(x)[:n], out))
        return jax.tree.map(lambda *xs: np.concatenate(xs), *pieces)


def local_rows(batch: dict) -> dict:
    """This process's contiguous share of a global batch's rows."""
    count, index = jax.process_count(), jax.process_index()
    size = len(next(iter(batch.values()))) // count
    return {k: v[index * size:(index + 1) * size] for k, v in batch.items()}


def evaluate(plan_: Plan, runner: Runner, params, split: str) -> tuple[dict, list[dict]]:
    records, rows = plan_.records[split], plan_.rows[split]
    predictions = plan_.task.predictions(plan_.ctx, runner, params, rows, records)
    return plan_.task.score(plan_.ctx, predictions, records), predictions


# ---------------------------------------------------------------- the run

def initial_params(setup: Setup, source: Source, state) -> tuple[dict, list[str]]:
    """The head's fresh parameters with every top-level group the source checkpoint also holds with the same
    shapes (the backbone, and the head of a fine-tune on the same labels) restored from it, onto this run's
    shardings; and what was taken, said after "from SOURCE". A group of other shapes (another task's head:
    3 labels where this has 2) stays fresh, as transformers' ignore_mismatched_sizes leaves it."""
    step = source.own_step if source.own_step is not None else source.committed_steps()[-1]
    stored = source.stored_params(step)
    shared = [name for name in setup.abstract.params if name in stored]
    if not shared:
        raise ValueError(f"{source.path} holds none of the parameter groups this head needs "
                         f"({', '.join(setup.abstract.params)})")
    shapes = {name: (checkpoint.leaf_shapes(stored[name]), checkpoint.leaf_shapes(setup.abstract.params[name]))
              for name in shared}
    # the model section is the checkpoint's (load refuses overrides of its shapes): only a head can differ
    fitting = [name for name in shared if shapes[name][0] == shapes[name][1]] or shared  # none: check_fits says why
    abstract = {name: setup.abstract.params[name] for name in fitting}
    try:
        restored = checkpoint.restore_params(source.path, abstract, step, "finetune.init_from")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    fresh = [f"{name} new (the checkpoint's has other shapes: {_first_difference(*shapes[name])})"
             for name in shared if name not in fitting]
    return {**state.params, **restored}, fitting + fresh


def _first_difference(stored: dict, wanted: dict) -> str:
    name = next(name for name in wanted if stored.get(name) != wanted[name])
    return f"{name} {stored.get(name, 'missing')} vs {wanted[name]}"


START_AGAIN = "start the fine-tune again in an empty train.run_dir"


def prepare_run_dir(config: RunConfig, source: Source) -> tuple[pathlib.Path, RunConfig]:
    """The run directory with the source's tokenizer copied into it; the config then names that copy,
    so the run's checkpoints are self-contained (`jaxlm predict`, `jaxlm embed` read them alone)."""
    run_dir = pathlib.Path(config.train.run_dir)
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        raise ConfigError(f"train.run_dir={run_dir} already holds checkpoints, of an earlier fine-tune or another run; "
                          "a fine-tune starts in an empty directory of its own (it does not resume): choose another "
                          "train.run_dir or remove that one")
    tokenizer_dir = run_dir / store.TOKENIZER_DIR
    if jax.process_index() == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
        store.copy_tokenizer(resolve_vocab(config.data), tokenizer_dir, config.data.lowercase)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("finetune run directory")
    return run_dir, dataclasses.replace(config, data=dataclasses.replace(config.data, vocab=str(tokenizer_dir)))


def train_batch(the_plan: Plan, step: int) -> dict:
    """The training rows of `step`: each epoch a permutation of the rows drawn from (seed, epoch)."""
    rows, size = the_plan.rows["train"], the_plan.config.train.global_batch
    epoch, within = divmod(step, the_plan.steps_per_epoch)
    order = np.random.default_rng([the_plan.config.train.seed, epoch]).permutation(len(rows))
    return batch_rows(rows, order[within * size:(within + 1) * size], size)


@dataclasses.dataclass
class BestDev:
    """The best dev scores so far (before any, the untrained model's, which no checkpoint holds) and how
    many evaluations have passed since they last improved."""
    metric: str
    scores: dict
    step: int | None = None
    value: float | None = None
    stale: int = 0

    def offer(self, step: int, scores: dict) -> bool:
        """Takes `scores` if they beat the best; whether they did."""
        value = rank_value(scores[self.metric], self.metric in LOWER_IS_BETTER)
        if self.value is not None and value <= self.value:
            self.stale += 1
            return False
        self.step, self.value, self.scores, self.stale = step, value, scores, 0
        return True


def finetune(config: RunConfig, source: Source) -> dict:
    """Fine-tunes `config.finetune.task` from `source`; returns the summary (best dev and test metrics,
    baselines), also written to RUN/summary.json. A multi-process run starts `jax.distributed` first
    (see jaxlm.cli). Another command writing the same run directory is refused (`run_lock`)."""
    the_plan = plan(config, source)
    check_writable(pathlib.Path(config.train.run_dir), f"train.run_dir={config.train.run_dir}")
    with run_lock.writing(config.train.run_dir):
        return _finetune(the_plan, source)


def _finetune(the_plan: Plan, source: Source) -> dict:
    """The fine-tune, once every check has passed and its run directory is this command's alone."""
    config, task, settings = the_plan.config, the_plan.task, the_plan.config.finetune
    metric = the_plan.metric
    run_dir, config = prepare_run_dir(config, source)
    setup = build(config, objective=task.objective(the_plan.ctx),
                  optimizer_for=optimizer_for(config, the_plan.steps_per_epoch))
    rng = dropout_key(config.train)
    state = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules,
                         init_key(config.train))
    params, restored = initial_params(setup, source, state)
    state = state.replace(params=params, opt_state=setup.optimizer.init(params))
    compiled_train, _ = compile_steps(setup, with_eval=False)
    runner = Runner(setup, task) if "dev" in the_plan.rows or "test" in the_plan.rows else None
    resolved = config_lib.to_dict(config)
    is_main = jax.process_index() == 0
    if is_main:
        (run_dir / "config.json").write_text(json.dumps(resolved, indent=2))
    has_dev = "dev" in the_plan.rows
    writer = MetricsWriter(run_dir, 0, the_plan.total_steps, active=is_main)
    writer.message(f"{task.name} on {len(the_plan.records['train'])} training records "
                   f"({len(the_plan.rows['train'])} rows), {the_plan.total_steps} steps of "
                   f"{config.train.global_batch}; {count_params(state.params) / 1e6:.2f}M parameters, "
                   f"{', '.join(restored)} from {source.path}")
    writer.message(f"train step memory: {memory_summary(compiled_train)}")

    def save(step: int, scores: dict | None) -> None:
        position = {"step": step, "epoch": step / the_plan.steps_per_epoch}
        metrics = {k: float(v) for k, v in scores.items()} if scores is not None else None
        with checkpoint.stop_if_writing_fails(mngr, step, START_AGAIN):
            checkpoint.save(mngr, step, {"params": state.params}, position, resolved, metrics)

    try:  # the progress bar closed before a failure is reported
        best = None
        if has_dev:  # where the dev metric starts, before any training
            dev_scores = evaluate(the_plan, runner, state.params, "dev")[0]
            writer.write(0, dev_scores, split="eval")
            best = BestDev(metric, dev_scores)
        mngr = (checkpoint.best_manager(run_dir / "checkpoints", metric) if has_dev
                else checkpoint.manager(run_dir / "checkpoints", keep=1))
        step = 0
        while step < the_plan.total_steps:
            batch = global_batch(setup, local_rows(train_batch(the_plan, step)))
            state, metrics = compiled_train(state, batch, rng)
            step += 1
            if step % config.train.log_every == 0 or step == the_plan.total_steps:
                writer.write(step, {k: float(v) for k, v in jax.device_get(metrics).items()})
            writer.advance(1)
            if best is None or not (step % the_plan.eval_every == 0 or step == the_plan.total_steps):
                continue
            dev_scores = evaluate(the_plan, runner, state.params, "dev")[0]
            writer.write(step, dev_scores, split="eval")
            if best.offer(step, dev_scores):
                save(step, {metric: best.value})
            elif settings.early_stopping and best.stale >= settings.early_stopping:
                writer.message(f"early stopping at step {step}: dev {metric} has not improved for {best.stale} "
                               f"evaluations (best {best.scores[metric]:.4f} at step {best.step})")
                break
        if has_dev:
            best_step = best.step
        else:
            best_step = step
            save(step, None)
        with checkpoint.stop_if_writing_fails(mngr, step, START_AGAIN):  # an asynchronous save failed
            mngr.wait_until_finished()
        summary = {"task": task.name, "metric": metric, "best_step": best_step, "steps": step,
                   "train_records": len(the_plan.records["train"])}
        if has_dev:
            summary["dev"] = best.scores
            summary["dev_baseline"] = task.baseline(the_plan.ctx, the_plan.records["train"], the_plan.records["dev"])
        if "test" in the_plan.rows:
            if best_step != step:
                params = checkpoint.restore_params(run_dir / "checkpoints", setup.abstract.params, best_step,
                                                   setting="")
            else:
                params = state.params
            summary["test"], predictions = evaluate(the_plan, runner, params, "test")
            summary["test_baseline"] = task.baseline(the_plan.ctx, the_plan.records["train"], the_plan.records["test"])
            if is_main:
                write_jsonl(run_dir / "test_predictions.jsonl", predictions)
    finally:
        writer.close()
    mngr.close()
    if is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        baseline = summary.get("dev_baseline", {}).get(metric)
        plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png",
                    {metric: baseline} if baseline is not None else {}, panels={metric: f"dev {metric}"})
    return summary


def write_jsonl(path: pathlib.Path, rows: list[dict]) -> None:
    """Written beside and renamed into place, so a reader never sees half a file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    partial.replace(path)


def rank_value(value: float, lower_is_better: bool) -> float:
    """The dev metric as a number to maximise: negated where lower is better, NaN (a constant
    prediction's correlation) the worst."""
    value = -value if lower_is_better else value
    return -math.inf if math.isnan(value) else value


def format_summary(summary: dict, run_dir) -> str:
    """The printed result: the best dev and the test metrics beside the trivial baseline's."""
    kept = "best dev {metric} at step" if "dev" in summary else "no dev split, kept the last step,"
    lines = [f"{summary['task']}: {kept.format(**summary)} {summary['best_step']} of {summary['steps']}"]
    for split in ("dev", "test"):
        if split in summary:
            scores = "  ".join(f"{k} {v:.4f}" for k, v in summary[split].items())
            baseline = "  ".join(f"{k} {v:.4f}" for k, v in summary[f"{split}_baseline"].items())
            lines.append(f"  {split:<4} {scores}\n       baseline: {baseline}")
    run_dir = pathlib.Path(run_dir)
    lines.append(f"  checkpoint: {run_dir / 'checkpoints'}   summary: {run_dir / 'summary.json'}")
    return "\n".join(lines)
