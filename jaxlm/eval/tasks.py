"""Evaluation tasks: their specs (`heldout`, `ppl:FILE`, `choice:FILE.json[@K]` or `choice:NAME[@K]`, a task of
jaxlm.corpora.choice_tasks), the items a text file or a BIG-bench JSON task turns into for each way of scoring,
and the metrics of their scores."""
from __future__ import annotations

import atexit
import dataclasses
import json
import math
import pathlib
import re
import shutil
import tempfile
from typing import Sequence

import numpy as np

from jaxlm.corpora.choice_tasks import NAMES as CHOICE_TASKS
from jaxlm.corpora.choice_tasks import choice_task
from jaxlm.corpora.text import check_characters, check_file, check_plain_text, utf8_lines, utf8_text
from jaxlm.eval.scoring import Item

# BIG-bench's own defaults for JSON tasks (bigbench/api/json_task.py).
BIGBENCH_DEFAULTS = {"task_prefix": "", "example_input_prefix": "\nQ: ", "example_output_prefix": "\nA: ",
                     "choice_prefix": "\n  choice: ", "few_shot_example_separator": "\n",
                     "append_choices_to_input": True}
SHOT_SEED = 1234


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of a sweep: `kind` heldout, ppl, choice or finetune; `path` its file (a fine-tune's
    config); `shots` for choices."""

    kind: str
    path: pathlib.Path | None = None
    shots: int = 0
    name: str = "heldout"  # what results and file names call it

    @property
    def file_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.@-]+", "-", self.name)


def readable_again(path: pathlib.Path) -> pathlib.Path:
    """`path`, or where it is a pipe (/dev/stdin, a shell's <(...)), which gives its bytes once, a copy of them
    that lasts the process: a sweep reads a task's file more than once (it was found empty the second time)."""
    if not path.exists() or path.is_file() or path.is_dir():
        return path
    copy = pathlib.Path(tempfile.mkdtemp(prefix="jaxlm-task-")) / path.name
    copy.write_bytes(path.read_bytes())
    atexit.register(shutil.rmtree, copy.parent, True)
    return copy


def parse_task(spec: str) -> Task:
    """A Task from `heldout`, `ppl:FILE`, `choice:FILE.json[@K]` (or a named task), `finetune:CONFIG`, its file checked
    (ValueError; a fine-tune config is checked against each source when the sweep is planned)."""
    spec = spec.strip()
    if spec == "heldout":
        return Task("heldout")
    kind, _, rest = spec.partition(":")
    if kind == "ppl" and rest:
        path = readable_again(pathlib.Path(rest))
        read_lines(path)
        return Task("ppl", path, name=f"ppl:{path.stem}")
    if kind == "choice" and rest:
        file, shots = rest, 0
        match = None if pathlib.Path(rest).is_file() else re.fullmatch(r"(.+)@([^@/]*)", rest)
        if match:
            if not match.group(2).isdecimal():
                raise ValueError(f"{spec}: the shots after @ must be a whole number of 0 or more, e.g. "
                                 f"choice:{match.group(1)}@3")
            file, shots = match.group(1), int(match.group(2))
        given = pathlib.Path(file)
        if not given.exists() and file in CHOICE_TASKS:
            given = choice_task(file)
        elif not given.exists() and not given.suffix:  # a misspelt name: no file, and no suffix a task file has
            raise ValueError(f"choice:{file}: no such file or named task; the named tasks are "
                             f"{', '.join(CHOICE_TASKS)}, or give a BIG-bench task.json")
        path = readable_again(given)
        task = load_choice_task(path)
        check_shots(task, shots, path)
        return Task("choice", path, shots, f"choice:{task.name}@{shots}")
    if kind == "finetune" and rest:
        path = pathlib.Path(rest)
        check_file(path, "finetune: config", "give a fine-tune config (configs/finetune/)")
        return Task("finetune", path, name=f"finetune:{path.stem}")
    raise ValueError(f"unknown task {spec!r}; tasks are heldout, ppl:FILE (a text file, one sequence per line), "
                     f"choice:FILE.json[@K] (a BIG-bench JSON task, K shots; or one of {', '.join(CHOICE_TASKS)}) and "
                     "finetune:CONFIG (a fine-tune config)")


TASK_FORMS = "heldout, ppl:FILE, choice:FILE.json[@K] or finetune:CONFIG"


def parse_tasks(specs: Sequence[str]) -> list[Task]:
    """Tasks from comma-separated specs, in order, without repeats."""
    tasks: list[Task] = []
    for spec in specs:
        parts = spec.split(",")
        if len(parts) > 1 and not all(part.strip() for part in parts):
            raise ValueError(f"--tasks {spec!r} has an empty task between its commas; name a task in each place "
                             f"({TASK_FORMS}) or drop the extra comma")
        for part in parts:
            if part.strip():
                task = parse_task(part)
                if task in tasks:
                    continue
                if any(t.name == task.name for t in tasks):
                    raise ValueError(f"two tasks are both named {task.name!r} (results and files are kept by "
                                     "name); give one of the files another name")
                tasks.append(task)
    if not tasks:
        raise ValueError(f"no task given; pass --tasks with {TASK_FORMS}")
    return tasks


# ---------------------------------------------------------------- perplexity files

def read_lines(path: pathlib.Path) -> list[str]:
    """The non-blank lines of a text file."""
    check_file(path, "ppl: file", "give a text file with one sequence per line")
    check_plain_text(path, "ppl: file")
    lines = [line for line in utf8_lines(path) if line.strip()]
    if not lines:
        raise ValueError(f"ppl:{path} holds no text; give one sequence per line")
    return lines


def split_specials(tokenizer, text: str) -> tuple[list[int], list[int], list[int]]:
    """(the special ids the tokenizer puts before `text`, its ids, those it puts after)."""
    core = list(tokenizer.encode(text, add_special_tokens=False))
    full = list(tokenizer.encode(text, add_special_tokens=True))
    for start in range(len(full) - len(core) + 1):
        if full[start:start + len(core)] == core:
            return full[:start], core, full[start + len(core):]
    return [], core, []


def windows(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i:i + size] for i in range(0, len(ids), max(1, size))]


def line_items(tokenizer, line: str, kind: str, limit: int | None, source: Sequence[int] = ()) -> list[Item]:
    """The items of one line of a perplexity file, in windows of what the model reads at once, each
    token scored once. Decoders: the tokenizer's ids (BOS where it adds one), every one after the
    first predicted, each window conditioned on the one token before it. Encoders: every token
    between the tokenizer's special tokens, masked in turn. Encoder-decoders: the ids, EOS included,
    as the target of the `source` ids."""
    if kind == "causal":
        ids = list(tokenizer.encode(line, add_special_tokens=True))
        size = limit or len(ids)
        return [Item((ids[start],), tuple(ids[start + 1:start + 1 + size])) for start in range(0, len(ids) - 1, size)]
    if kind == "seq2seq":
        ids = list(tokenizer.encode(line, add_special_tokens=True))
        return [Item(tuple(source), tuple(w)) for w in windows(ids, limit or len(ids))]
    before, core, after = split_specials(tokenizer, line)
    room = (limit or len(core) + len(before) + len(after)) - len(before) - len(after)
    return [Item(tuple(before), tuple(w), tuple(after)) for w in windows(core, room) if w]


def perplexity_metrics(kind: str, scores: Sequence[np.ndarray], lines: int) -> dict:
    tokens = sum(len(s) for s in scores)
    nll = -float(sum(np.sum(s, dtype=np.float64) for s in scores))
    name = "pseudo_perplexity" if kind == "masked" else "perplexity"
    per_token = nll / max(tokens, 1)
    return {name: math.exp(per_token), "nll_per_token": per_token, "tokens": tokens, "lines": lines}


def grouped(scores: list, groups: list[list[Item]]) -> list[list]:
    """Flat per-item scores split back into the groups (lines, examples) the items came in."""
    starts = np.cumsum([0] + [len(g) for g in groups])
    return [scores[a:b] for a, b in zip(starts[:-1], starts[1:])]


def perplexity_records(groups: list[list[Item]], scores: list[list[np.ndarray]]) -> list[dict]:
    """One record per window of each line: its ids, summed and per-token log-likelihoods."""
    return [{"line": line, "window": window, **item.record(), "loglik": float(np.sum(s, dtype=np.float64)),
             "token_logliks": s.tolist()}
            for line, (group, group_scores) in enumerate(zip(groups, scores))
            for window, (item, s) in enumerate(zip(group, group_scores))]


# ---------------------------------------------------------------- BIG-bench multiple choice

@dataclasses.dataclass(frozen=True)
class ChoiceTask:
    name: str
    examples: list[dict]  # {"input": str, "target_scores": {choice: score}}
    settings: dict  # BIGBENCH_DEFAULTS, as the task sets them


def _missing(path, where: str, field: str, what: str) -> ValueError:
    return ValueError(f"{path} is not a BIG-bench JSON task: {where} has no {field!r} ({what})")


def load_choice_task(path: pathlib.Path) -> ChoiceTask:
    """A BIG-bench JSON task's multiple-choice examples, each checked (ValueError naming the field)."""
    check_file(path, "choice: file", "give a BIG-bench JSON task (task.json)")
    try:
        data = json.loads(utf8_text(path))  # without a byte-order mark, as every reader of text
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a BIG-bench JSON task: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a BIG-bench JSON task: it holds a {type(data).__name__}, not an object "
                         "with 'examples'")
    examples = data.get("examples")
    if not isinstance(examples, list) or not examples:
        raise _missing(path, "the task", "examples", "a non-empty list of {input, target_scores}")
    for index, example in enumerate(examples):
        where = f"examples[{index}]"
        if not isinstance(example, dict) or not isinstance(example.get("input"), str):
            raise _missing(path, where, "input", "the question text")
        scores = example.get("target_scores")
        if not isinstance(scores, dict) or len(scores) < 2:
            raise _missing(path, where, "target_scores", "a mapping of at least two choices to scores; "
                           "choice tasks need multiple-choice examples")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                   for v in scores.values()):  # NaN, Infinity: JSON as Python reads it
            raise ValueError(f"{path}: {where}.target_scores must map each choice to a finite number")
        for text in (example["input"], *scores):
            check_characters(text, f"{path}: {where}")
        if max(scores.values()) <= min(scores.values()):
            raise ValueError(f"{path}: {where}.target_scores has no correct choice (all scores equal)")
    name = str(data.get("name") or (path.parent.name if path.stem == "task" else path.stem))
    settings = {k: data.get(k, default) for k, default in BIGBENCH_DEFAULTS.items()}
    texts = {k: v for k, v in settings.items() if k != "append_choices_to_input"}
    odd = next((k for k, v in texts.items() if not isinstance(v, str)), None)
    if odd is not None:  # was a TypeError's traceback where the prompts were put together
        raise ValueError(f"{path}: {odd!r} is {texts[odd]!r}; give text (BIG-bench's default is "
                         f"{BIGBENCH_DEFAULTS[odd]!r})")
    for text in (name, *texts.values()):
        check_characters(text, f"{path}: the task")
    # a few tasks spell the flag as a string ("false")
    settings["append_choices_to_input"] = str(settings["append_choices_to_input"]).lower() != "false"
    return ChoiceTask(name.replace(" ", "_"), examples, settings)


def correct_choice(example: dict) -> str:
    scores = example["target_scores"]
    return next(k for k, v in scores.items() if v == max(scores.values()))


def formatted_input(example: dict, settings: dict, index: int) -> str:
    """BIG-bench's default format: input prefix, the question, the choices (shuffled once per example,
    seeded by its index) when the task appends them, then the output prefix."""
    text = example["input"]
    if settings["append_choices_to_input"]:
        choices = np.random.RandomState(index).permutation(sorted(example["target_scores"]))
        text += settings["choice_prefix"] + settings["choice_prefix"].join(choices)
    return settings["example_input_prefix"] + text + settings["example_output_prefix"]


def prompts(task: ChoiceTask, shots: int) -> list[str]:
    """Each example's prompt: the task prefix, then `shots` other examples (drawn by a generator seeded
    with the example's index) each followed by its correct choice, then the example."""
    settings = task.settings
    out = []
    for index, example in enumerate(task.examples):
        parts = []
        if shots:
            others = [i for i in range(len(task.examples)) if i != index]
            for shot in np.random.default_rng([SHOT_SEED, index]).choice(others, shots, replace=False):
                parts.append(formatted_input(task.examples[shot], settings, int(shot))
                             + correct_choice(task.examples[shot]))
        parts.append(formatted_input(example, settings, index))
        out.append(settings["task_prefix"] + settings["few_shot_example_separator"].join(parts))
    return out


def continuation_item(tokenizer, kind: str, context: str, continuation: str) -> Item:
    """`continuation` after `context` as ids, split where the whole text's tokens pass the context's.
    Trailing whitespace of the context moves to the continuation (" yes" after "A:", as
    lm-evaluation-harness does), so that the continuation's first token carries its space."""
    stripped = context.rstrip()
    continuation = context[len(stripped):] + continuation
    if kind == "seq2seq":
        return Item(tuple(tokenizer.encode(stripped, add_special_tokens=True)),
                    tuple(tokenizer.encode(continuation.strip(), add_special_tokens=True)))
    before, whole, after = split_specials(tokenizer, stripped + continuation)
    head = list(tokenizer.encode(stripped, add_special_tokens=False))
    if whole[:len(head)] != head:  # the boundary merged into one token: score the continuation alone
        whole = head + list(tokenizer.encode(continuation, add_special_tokens=False))
    if kind == "causal":
        return Item(tuple(before + head), tuple(whole[len(head):]))
    return Item(tuple(before + head), tuple(whole[len(head):]), tuple(after))


def check_shots(task: ChoiceTask, shots, where) -> None:
    """A ValueError unless `shots` is a whole number of 0 or more that the task's other examples can supply."""
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise ValueError(f"{where}: shots={shots!r}; give a whole number of 0 or more")
    if shots and len(task.examples) < shots + 1:
        raise ValueError(f"{where}: {shots}-shot needs at least {shots + 1} examples, it has {len(task.examples)}")


def choice_items(tokenizer, kind: str, task: ChoiceTask, shots: int) -> list[list[Item]]:
    """Per example, one item per choice (in the file's order)."""
    check_shots(task, shots, task.name)
    return [[continuation_item(tokenizer, kind, prompt, choice) for choice in example["target_scores"]]
            for prompt, example in zip(prompts(task, shots), task.examples)]


def choice_metrics(task: ChoiceTask, logliks: list[np.ndarray], tokens: list[np.ndarray]) -> tuple[dict, list]:
    """Accuracy (the highest summed log-likelihood is a correct choice), the same per token, and the
    random baseline; plus each example's chosen index and correctness."""
    hits, hits_norm, chance, picks = [], [], [], []
    for example, scores, counts in zip(task.examples, logliks, tokens):
        targets = np.array(list(example["target_scores"].values()), np.float64)
        best = targets == targets.max()
        pick, pick_norm = int(np.argmax(scores)), int(np.argmax(scores / np.maximum(counts, 1)))
        hits.append(bool(best[pick]))
        hits_norm.append(bool(best[pick_norm]))
        chance.append(best.mean())
        picks.append({"pick": pick, "correct": hits[-1]})
    metrics = {"accuracy": float(np.mean(hits)), "accuracy_norm": float(np.mean(hits_norm)),
               "random_baseline": float(np.mean(chance))}
    return metrics, picks


def choice_results(task: ChoiceTask, groups: list[list[Item]], scores: list[list[np.ndarray]]) -> tuple[dict, list]:
    """(metrics, one record per choice of each example: its ids, log-likelihood, whether it was chosen)."""
    logliks = [np.array([np.sum(s, dtype=np.float64) for s in g]) for g in scores]
    counts = [np.array([len(i.continuation) for i in g]) for g in groups]
    metrics, picks = choice_metrics(task, logliks, counts)
    records = [{"example": index, "choice": number, **item.record(), "loglik": float(value),
                "chosen": number == pick["pick"], "example_correct": pick["correct"]}
               for index, (group, values, pick) in enumerate(zip(groups, logliks, picks))
               for number, (item, value) in enumerate(zip(group, values))]
    return metrics, records
