"""`jaxlm eval`: every selected committed checkpoint of each source evaluated on each task, resumable,
optionally watching a run that is still training; everything checked before any compute."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
import time
from typing import Callable, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from jaxlm import config as config_lib
from jaxlm.data.pipeline import open_data
from jaxlm.data.tokenizers.roles import special_ids
from jaxlm.eval import results, tasks as tasks_lib
from jaxlm.eval.scoring import (Item, Scorer, abstract_params, check_fits, kind_of, position_limit,
                                required_groups)
from jaxlm.eval.sources import Selection, Source, check_out, open_source, parse_selection, source_tokenizer
from jaxlm.eval.tasks import Task
from jaxlm.parallel.mesh import make_mesh
from jaxlm.parallel.rules import rules_for
from jaxlm.train import checkpoint
from jaxlm.train.loop import build, compile_eval, evaluate, heldout_baselines, with_perplexity
from jaxlm.train.preflight import check_batch

@dataclasses.dataclass
class Plan:
    """A checked sweep: nothing in it has touched a device."""

    sources: list[Source]
    tasks: list[Task]
    selection: Selection
    out: pathlib.Path
    batch_size: int = 32
    encoder_input: str = ""
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)  # task name -> `task_inputs`
    items: dict[str, dict] = dataclasses.field(default_factory=dict)  # source path -> task name -> TaskItems


def finetune_run():
    """jaxlm.finetune.run, imported when a sweep has a finetune task (seqeval and the tasks load slowly)."""
    from jaxlm.finetune import run  # see the docstring
    return run


def finetune_config(task: Task, source: Source, step: int, run_dir: pathlib.Path):
    """(config, source) of the fine-tune `task` names, from `source`'s checkpoint at `step`, into `run_dir`."""
    init = source.directory / str(step)
    return finetune_run().load(task.path, [f"train.run_dir={run_dir}"], init_from=str(init))


def check_task(source: Source, task: Task, first_step: int | None, encoder_input: str = ""):
    """Raise ValueError unless `source` can run `task` (before any compute); a ppl or choice task's TaskItems (None
    for the others)."""
    if task.kind == "finetune":
        if first_step is not None:  # reads and checks the data and the head against the checkpoint
            finetune_run().plan(*finetune_config(task, source, first_step, pathlib.Path("unused")))
        return
    if task.kind == "heldout":
        if not source.is_run:
            raise ValueError(f"heldout needs a training run's data and objective; {source.path} is a converted "
                             "checkpoint (use ppl:FILE or choice:FILE.json)")
        if source.config.finetune.task:
            raise ValueError(f"heldout needs a pretraining run's data and objective; {source.path} is fine-tuned for "
                             f"{source.config.finetune.task} (its summary.json holds its dev and test metrics; "
                             "`jaxlm predict` predicts with it)")
        prepared_dir = source.config.data.prepared_dir
        if not pathlib.Path(prepared_dir).is_dir():
            if prepared_dir != source.stored.get("data", {}).get("prepared_dir"):
                raise ValueError(f"heldout: data.prepared_dir={prepared_dir} is not a directory; give the prepared "
                                 f"data of {source.path}")
            raise ValueError(f"heldout: {source.path} was trained on {prepared_dir}, which is not here; pass "
                             "data.prepared_dir=DIR (the prepared data of that run)")
        held_out, batch = len(open_data(source.config)[2]), source.config.train.global_batch
        if held_out < batch:
            raise ValueError(f"heldout: the held-out split has {held_out} examples, fewer than one batch "
                             f"(train.global_batch={batch}); pass a smaller train.global_batch")
        return
    tokenizer = source_tokenizer(source)
    if tokenizer.vocab_size > source.config.model.vocab_size:
        raise ValueError(f"{task.name}: {source.path}'s tokenizer has {tokenizer.vocab_size} tokens, more than the "
                         f"model's vocabulary ({source.config.model.vocab_size}): tokenizer and checkpoint do not match")
    kind = kind_of(source.config.model)
    if kind == "masked" and special_ids(tokenizer)["mask"] is None:
        raise ValueError(f"{task.name}: {source.path}'s tokenizer has no mask token, which pseudo-log-likelihood needs")
    if first_step is not None:
        lacking = [g for g in required_groups(source.config.model) if g not in source.stored_params(first_step)]
        if lacking and source.config.finetune.task:
            raise ValueError(f"{task.name}: {source.path} cannot score text: it is fine-tuned for "
                             f"{source.config.finetune.task}, and keeps no {', '.join(lacking)} parameters; score the "
                             "checkpoint it was fine-tuned from (its finetune.init_from)")
        if lacking:
            raise ValueError(f"{task.name}: {source.path} cannot score text: its checkpoint has no "
                             f"{', '.join(lacking)} parameters (an encoder converted without its masked-LM head); "
                             "convert a checkpoint that has one (e.g. from BertForMaskedLM)")
    return task_items(source, task, tokenizer, encoder_input)


class TaskItems(NamedTuple):
    """What a ppl or choice task scores: per line (ppl) or per example (choice), its items; a choice task's
    examples."""
    groups: list[list[Item]]
    choices: tasks_lib.ChoiceTask | None = None


def task_items(source: Source, task: Task, tokenizer, encoder_input: str) -> TaskItems:
    """A ppl or choice task's TaskItems; ValueError where there is nothing the model can score or more than it can
    read at once."""
    model = source.config.model
    kind, limit = kind_of(model), position_limit(model)
    if task.kind == "ppl":
        context = tokenizer.encode(encoder_input, add_special_tokens=True) if kind == "seq2seq" else ()
        choices = None
        groups = [tasks_lib.line_items(tokenizer, line, kind, limit, context)
                  for line in tasks_lib.read_lines(task.path)]
        if not any(item.continuation for group in groups for item in group):  # its perplexity would be 1
            raise ValueError(f"{task.name}: no line of {task.path} holds a token to score ({source.path}'s tokenizer "
                             "keeps none, and a decoder scores each token after a line's first); give lines of text")
    else:
        choices = tasks_lib.load_choice_task(task.path)
        groups = tasks_lib.choice_items(tokenizer, kind, choices, task.shots)
        for index, (example, group) in enumerate(zip(choices.examples, groups)):
            empty = next((c for c, item in zip(example["target_scores"], group) if not item.continuation), None)
            if empty is not None:  # scored 0, the highest log-likelihood, it would always be chosen
                raise ValueError(f"{task.path}: examples[{index}] has the choice {empty!r}, in which {source.path}'s "
                                 "tokenizer finds no token to score; give every choice some text")
    try:
        check_fits([item for group in groups for item in group], model, kind)
    except ValueError as err:
        raise ValueError(f"{task.name}: {err}") from None
    return TaskItems(groups, choices)


def recorded_base(path: pathlib.Path) -> pathlib.Path:
    """The run (or converted checkpoint) directory of a source path --out records: a run's checkpoints/<step> or
    checkpoints/ stand for the run."""
    if path.name == "checkpoints" or (path.name.isdecimal() and path.parent.name == "checkpoints"):
        return path.parent if path.name == "checkpoints" else path.parent.parent
    return path


def label_apart(sources: list[Source], recorded: dict[str, str] | None = None) -> None:
    """Sources of different runs (or converted checkpoints) whose folders share a name, told apart by as many of
    their parent folders as it takes (g1@a/runs, g1@b/runs), also from the sources --out holds results of
    (`recorded`: source path -> its label), whose labels stay theirs: rows of two runs of one name evaluated by
    two calls into one --out shared a label, and the later call's replaced the earlier's. The checkpoints of one
    run keep one label."""
    kept = {recorded_base(pathlib.Path(path)).absolute(): label for path, label in (recorded or {}).items()}
    bases = [(s.run_dir or s.directory).absolute() for s in sources]
    pool = {*bases, *kept}
    for source, base in zip(sources, bases):
        if base in kept:
            source.label = kept[base]
            continue
        others = {b for b in pool if b.name == base.name and b != base}
        depth = 0
        while others:
            depth += 1
            suffix = base.parent.parts[-depth:]
            others = {b for b in others if b.parent.parts[-depth:] == suffix}
            source.label = f"{base.name}@{'/'.join(suffix)}"


def task_inputs(task: Task, overrides: list[str], encoder_input: str) -> str:
    """A digest of what decides a task's results besides the checkpoint: its file's contents, the model
    overrides and the encoder input. Each record keeps it, so that `--out` is reused only for the same."""
    digest = hashlib.sha256(json.dumps([sorted(overrides), encoder_input]).encode())
    if task.path is not None:
        digest.update(task.path.read_bytes())
    return digest.hexdigest()[:16]


def check_reuse(out: pathlib.Path, sources: list[Source], inputs: dict[str, str]) -> None:
    """ValueError where `--out` holds a task of one of these sources evaluated on other inputs (another file of the
    same name, other overrides): its records would stand in for the new ones."""
    paths = {str(s.path): s.label for s in sources}
    for record in results.read_records(out) if out.is_dir() else []:
        recorded, now = record.get("inputs"), inputs.get(record["task"])
        if record["source"] in paths and now is not None and recorded is not None and recorded != now:
            raise ValueError(f"--out {out} holds {record['task']} of {paths[record['source']]} evaluated on another "
                             "file or with other overrides or --encoder-input; give another --out, or remove its "
                             f"{results.RESULTS} to evaluate again")


POLL, LONGEST_POLL = 2.0, 86400  # --watch's seconds between looks: by default, at most
IDLE_TIMEOUT = 1800.0  # --watch stops after this many seconds without a new checkpoint, by default


def plan(paths: list[str], task_specs: list[str], select: str = "all", out: str = "eval",
         overrides: list[str] = (), batch_size: int = 32, encoder_input: str = "", watch: bool = False,
         idle_timeout: float = 0.0, poll: float = POLL) -> Plan:
    """Every input, task, selection and the output place checked; ValueError/ConfigError otherwise.
    When watching, a run that has no committed checkpoint yet is waited for up to `idle_timeout` s."""
    if not paths:
        raise ValueError("give at least one run directory, checkpoint or converted checkpoint to evaluate")
    if batch_size < 1:
        raise ValueError(f"--batch-size {batch_size} must be at least 1")
    if not 0 < poll <= LONGEST_POLL:  # nan fails too; a longer sleep overflows time.sleep
        raise ValueError(f"--poll {poll:g}: give the seconds between looks for new checkpoints, above 0 and at most "
                         f"{LONGEST_POLL} (a day)")
    if not idle_timeout >= 0:  # nan too: it would never time out
        raise ValueError(f"--idle-timeout {idle_timeout:g}: give the seconds to wait for a new checkpoint, 0 or more")
    config_lib.refuse_unread_sections(overrides, ("model", "mesh", "distributed", "data", "train"))
    selection = parse_selection(select)
    task_list = tasks_lib.parse_tasks(task_specs)
    wait = idle_timeout if watch else 0.0
    sources = [open_source(p, list(overrides), wait, poll) for p in paths]
    out_path = pathlib.Path(out)
    label_apart(sources, {r["source"]: r["run"] for r in results.read_records(out_path)} if out_path.is_dir() else {})
    if encoder_input and not (any(t.kind == "ppl" for t in task_list)
                              and any(kind_of(s.config.model) == "seq2seq" for s in sources)):
        raise ValueError(f"--encoder-input {encoder_input!r} is read by ppl tasks of encoder-decoders (T5, BART) only, "
                         "and this evaluation would ignore it: remove it")
    check_out(out_path, sources)
    if out_path.exists() and not out_path.is_dir():
        raise ValueError(f"--out {out} is a file; give a directory")
    items: dict[str, dict] = {}
    for source in sources:
        mesh = make_mesh(source.config.mesh)  # a mesh that does not fit the devices fails here
        if any(t.kind == "heldout" for t in task_list) and source.is_run:
            if source.config.train.eval_batches < 1:
                raise config_lib.ConfigError(f"train.eval_batches={source.config.train.eval_batches}: the heldout "
                                             "task reads that many batches; give 1 or more, or other --tasks")
            check_batch(source.config, mesh)
        committed = source.committed_steps()
        chosen = selection.pick(committed)
        missing = sorted(set(selection.steps) - set(committed))
        if (missing or not chosen) and not watch:
            what = f": step {', '.join(map(str, missing))} is not among" if missing else " matches none of"
            raise ValueError(f"--select {select}{what} {source.path}'s committed steps "
                             f"({', '.join(map(str, committed))})")
        for task in task_list:
            scored = check_task(source, task, chosen[0] if chosen else None, encoder_input)
            if scored is not None:
                items.setdefault(str(source.path), {})[task.name] = scored
    inputs = {task.name: task_inputs(task, list(overrides), encoder_input) for task in task_list}
    check_reuse(out_path, sources, inputs)
    return Plan(sources, task_list, selection, out_path, batch_size, encoder_input, inputs, items)


# ---------------------------------------------------------------- one source, compiled once

class SourceEvaluator:
    """Evaluates the checkpoints of one source: builds the mesh, compiles and tokenizes once, then
    restores each step onto the mesh and runs each task."""

    def __init__(self, source: Source, task_list: list[Task], batch_size: int, encoder_input: str,
                 items: dict | None = None):
        """`items`: task name -> the plan's `task_items` (made here where not given)."""
        config = source.config
        self.source = source
        self.setup = self.compiled = self.valid = self.scorer = self.baselines = None
        self.items: dict[str, TaskItems] = {}
        if any(t.kind == "heldout" for t in task_list):
            self.setup = build(config)
            self.compiled = compile_eval(self.setup)
            self.valid = open_data(config)[2]
            self.mesh, self.rules, self.target = self.setup.mesh, self.setup.rules, self.setup.abstract.params
        else:
            self.mesh, self.rules = make_mesh(config.mesh), rules_for(config.mesh.rules)
            self.target = abstract_params(config.model, self.mesh, self.rules)
        scoring = [t for t in task_list if t.kind in ("ppl", "choice")]
        if scoring:
            tokenizer = source_tokenizer(source)
            self.scorer = Scorer(config.model, self.mesh, self.rules, batch_size, special_ids(tokenizer)["mask"])
            for task in scoring:
                given = (items or {}).get(task.name)
                self.items[task.name] = given or task_items(source, task, tokenizer, encoder_input)

    def restore(self, step: int):
        return checkpoint.restore_params(self.source.directory, self.target, step, setting="")

    def rows(self, task: Task) -> int:
        if task.kind in ("heldout", "finetune"):
            return 0
        return self.scorer.row_count([i for group in self.items[task.name].groups for i in group])

    def evaluate(self, task: Task, params, progress: Callable[[int], None], step: int = 0,
                 out: pathlib.Path | None = None) -> tuple[dict, int, dict, list]:
        """(metrics, examples, baselines by metric, per-item records) of one task on `params` (of
        `step`; a fine-tune starts from that checkpoint and runs in a directory under `out`)."""
        if task.kind == "finetune":
            return self.finetune(task, step, out)
        if task.kind == "heldout":
            final = with_perplexity(evaluate(self.setup, self.compiled, params, self.valid))
            if self.baselines is None:
                self.baselines = heldout_baselines(self.valid, final)
            return final, int(final.pop("examples", 0)), self.baselines, []
        groups, choices = self.items[task.name]
        scores = self.scorer(params, [i for group in groups for i in group], progress)
        per_group = tasks_lib.grouped(scores, groups)
        if task.kind == "ppl":
            metrics = tasks_lib.perplexity_metrics(self.scorer.kind, scores, len(groups))
            return metrics, len(groups), {}, tasks_lib.perplexity_records(groups, per_group)
        metrics, records = tasks_lib.choice_results(choices, groups, per_group)
        chance = metrics["random_baseline"]
        return metrics, len(groups), {"accuracy": chance, "accuracy_norm": chance}, records


    def finetune(self, task: Task, step: int, out: pathlib.Path) -> tuple[dict, int, dict, list]:
        """The dev and test metrics (and baselines) of a fine-tune from this step, in a fresh
        OUT/RUN/finetune-NAME-STEP directory (one an interrupted sweep left is replaced)."""
        run_dir = out / self.source.label / f"{task.file_name}-{step}"
        if jax.process_index() == 0:
            shutil.rmtree(run_dir, ignore_errors=True)
        summary = finetune_run().finetune(*finetune_config(task, self.source, step, run_dir))
        metrics, baselines = {}, {}
        for split in ("dev", "test"):
            metrics |= {f"{split}_{k}": v for k, v in summary.get(split, {}).items()}
            baselines |= {f"{split}_{k}": v for k, v in summary.get(f"{split}_baseline", {}).items()}
        return metrics, summary["train_records"], baselines, []


# ---------------------------------------------------------------- the sweep

@dataclasses.dataclass
class Progress:
    records: list[dict]
    errors: list[str]
    throughput: dict  # task -> [items scored, seconds]


def evaluate_step(evaluator: SourceEvaluator, plan_: Plan, step: int, finished: set, progress: Progress,
                  writer: bool) -> None:
    """Every task not yet done at one step of one source; a checkpoint that cannot be restored is
    reported and skipped."""
    source = evaluator.source
    todo = [t for t in plan_.tasks if (str(source.path), step, t.name) not in finished]
    if not todo:
        return
    try:
        params = evaluator.restore(step)
    except Exception as err:  # a broken or vanished checkpoint must not end the sweep
        progress.errors.append(f"{source.label} step {step}: could not restore ({type(err).__name__}: "
                               f"{str(err).splitlines()[0][:200]})")
        print(f"jaxlm eval: skipped {progress.errors[-1]}", flush=True)
        return
    committed = source.commit_stamp(step)
    for task in todo:
        rows = evaluator.rows(task)
        bar = tqdm(total=rows or None, desc=f"{source.label}@{step} {task.name}", unit="row", leave=False,
                   disable=not writer or rows == 0, dynamic_ncols=True)
        began = time.time()
        metrics, examples, baselines, items = evaluator.evaluate(task, params, bar.update, step, plan_.out)
        bar.close()
        elapsed = time.time() - began
        speed = progress.throughput.setdefault(task.name, [0, 0.0])
        speed[0], speed[1] = speed[0] + (len(items) if items else examples), speed[1] + elapsed
        new = [{"run": source.label, "source": str(source.path), "step": step, "task": task.name, "metric": name,
                "value": value, "examples": examples, "inputs": plan_.inputs.get(task.name), "committed": committed}
               | ({"baseline": baselines[name]} if name in baselines else {}) for name, value in metrics.items()]
        if writer:
            if items:
                results.write_examples(plan_.out / source.label / f"examples-{task.file_name}-{step}.jsonl", items)
            results.append_records(plan_.out, new)
        progress.records.extend(new)
        if writer:
            shown = ", ".join(f"{k} {results.cell(v)}" for k, v in metrics.items())
            tqdm.write(f"jaxlm eval: {source.label} step {step} {task.name}: {shown}")
        finished.add((str(source.path), step, task.name))


def agreed(values: list[int]) -> list[int]:
    """Process 0's integers on every process: each process must take the same steps through the sweep's
    collectives, whatever its own disk, clock or listing says."""
    if jax.process_count() == 1:
        return values
    count = int(multihost_utils.broadcast_one_to_all(np.int64(len(values))))
    mine = np.asarray(values if jax.process_index() == 0 else [0] * count, np.int64).reshape(count)
    return [int(v) for v in multihost_utils.broadcast_one_to_all(mine)]


def still_current(records: list[dict], sources: list[Source]) -> list[dict]:
    """`records` less those of a checkpoint written again since they were taken (a run trained anew at the same
    path): its commit time is another. They stood in for the new checkpoint's results."""
    by_path, stamps, kept = {str(s.path): s for s in sources}, {}, []
    for record in records:
        source, key = by_path.get(record["source"]), (record["source"], record["step"])
        if source is not None and "committed" in record:
            if key not in stamps:
                stamps[key] = source.commit_stamp(record["step"])
            if stamps[key] not in (None, record["committed"]):  # a checkpoint since deleted keeps its results
                continue
        kept.append(record)
    return kept


def agreed_done(plan_: Plan, current: list[dict]) -> set[tuple[str, int, str]]:
    """The (source, step, task) triples of `current` (the records --out holds of the checkpoints as they are, as
    process 0 reads them), on every process."""
    keys, names = [str(s.path) for s in plan_.sources], [t.name for t in plan_.tasks]
    local = [(keys.index(k), step, names.index(t)) for k, step, t in results.done(current)
             if k in keys and t in names] if jax.process_index() == 0 else []
    flat = agreed([v for triple in local for v in triple])
    return {(keys[a], b, names[c]) for a, b, c in zip(flat[::3], flat[1::3], flat[2::3])}


def run(plan_: Plan, watch: bool = False, idle_timeout: float = IDLE_TIMEOUT, poll: float = POLL) -> Progress:
    """Evaluate what the plan selects that --out does not hold yet; with `watch`, keep evaluating new
    committed checkpoints until each run has written its final step or none came for `idle_timeout` s.
    (A multi-process evaluation starts `jax.distributed` before planning: see jaxlm.cli.)"""
    writer = jax.process_index() == 0
    if writer:
        plan_.out.mkdir(parents=True, exist_ok=True)
    try:
        return _evaluate(plan_, watch, idle_timeout, poll, writer)
    finally:  # also where Ctrl-C stops a --watch: the table and plot of what was evaluated
        if writer:
            everything = results.read_records(plan_.out)
            if everything:
                results.write_csv(plan_.out, everything)
                results.plot_curves(plan_.out, everything)


def _evaluate(plan_: Plan, watch: bool, idle_timeout: float, poll: float, writer: bool) -> Progress:
    """`run`'s loop: each selected step not yet in --out, until done (or idle, with `watch`)."""
    current = still_current(results.read_records(plan_.out), plan_.sources) if writer else []
    finished = agreed_done(plan_, current)
    keys = {str(s.path) for s in plan_.sources}
    progress = Progress([r for r in current if r["source"] in keys], [], {})
    evaluators: dict[str, SourceEvaluator] = {}
    seen: dict[str, set[int]] = {key: set() for key in keys}
    last_new = time.time()
    while True:
        for source in plan_.sources:
            key = str(source.path)
            committed = agreed(source.committed_steps())
            chosen = set(plan_.selection.pick(committed))
            for step in sorted(set(committed) - seen[key]):
                pending = any((key, step, t.name) not in finished for t in plan_.tasks)
                if step in chosen and pending:
                    if key not in evaluators:
                        evaluators[key] = SourceEvaluator(source, plan_.tasks, plan_.batch_size, plan_.encoder_input,
                                                          plan_.items.get(key))
                    evaluate_step(evaluators[key], plan_, step, finished, progress, writer)
                seen[key].add(step)
                last_new = time.time()
        done = not watch or all(source_finished(s, seen[str(s.path)]) for s in plan_.sources)
        idle = not done and time.time() - last_new > idle_timeout
        if agreed([int(done or idle)])[0]:
            if idle and writer:
                print(f"jaxlm eval: no new checkpoint for {idle_timeout:g} s; stopping", flush=True)
            break
        time.sleep(poll)
    return progress


def source_finished(source: Source, seen: set[int]) -> bool:
    """A run is finished once its final step has been seen; a converted checkpoint or one named step
    at once."""
    return not source.is_run or source.own_step is not None or any(s >= source.final_step for s in seen)


def summary(progress: Progress) -> str:
    lines = [results.format_table(progress.records, progress.errors)]
    for task, (items, seconds) in progress.throughput.items():
        lines.append(f"{task}: {items} items in {seconds:.1f} s ({items / max(seconds, 1e-9):.1f} items/s)")
    return "\n".join(lines)
