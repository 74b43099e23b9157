"""Evaluation tasks: specs, BIG-bench prompts and shots, the items text becomes, and the metrics."""

import json
import re

import numpy as np
import pytest

from jaxlm.corpora.choice_tasks import NAMES as CHOICE_TASKS
from jaxlm.corpora.choice_tasks import bigbench_example, choice_task, choice_tasks
from jaxlm.corpora.models import bert_vocab_path, gpt2_tokenizer_dir
from jaxlm.data.tokenizers.load import load_tokenizer
from jaxlm.eval import tasks
from jaxlm.eval.scoring import bucket


@pytest.fixture(scope="module")
def arithmetic(arithmetic_task):
    return tasks.load_choice_task(arithmetic_task)


def test_task_specs(tmp_path, arithmetic_task):
    lines = tmp_path / "valid.txt"
    lines.write_text("one line\n\n")
    parsed = tasks.parse_tasks([f"heldout,ppl:{lines}", f"choice:{arithmetic_task}@3", "heldout", "choice:arc_easy"])
    assert [(t.kind, t.shots, t.name) for t in parsed] == [
        ("heldout", 0, "heldout"), ("ppl", 0, "ppl:valid"),
        ("choice", 3, "choice:basic_arithmetic@3"), ("choice", 0, "choice:arc_easy@0")]
    with pytest.raises(ValueError, match="needs at least 9 examples"):
        tasks.parse_task(f"choice:{arithmetic_task}@8")
    with pytest.raises(FileNotFoundError, match=r"^ppl: file .*missing.txt does not exist; give a text file"):
        tasks.parse_task(f"ppl:{tmp_path / 'missing.txt'}")
    # a folder was "no such file", and shots that are not a number a file named with them
    with pytest.raises(IsADirectoryError, match=rf"^ppl: file {tmp_path} is a directory; give a text file"):
        tasks.parse_task(f"ppl:{tmp_path}")
    for shots in ("x", "-1"):
        with pytest.raises(ValueError, match=rf"^choice:arc_easy@{shots}: the shots after @ must be a whole number "
                                             r"of 0 or more, e.g. choice:arc_easy@3$"):
            tasks.parse_task(f"choice:arc_easy@{shots}")
    with pytest.raises(ValueError, match=r"^choice:arc_easy@²: the shots after @ must be a whole number"):  # int()'s
        tasks.parse_task("choice:arc_easy@²")  # "invalid literal for int() with base 10: '²'"
    # a misspelt name was "file arc_eazy does not exist; give a BIG-bench JSON task", naming none of the tasks
    with pytest.raises(ValueError, match=r"^choice:arc_eazy: no such file or named task; the named tasks are "
                                         r"arc_easy, .*, or give a BIG-bench task.json$"):
        tasks.parse_task("choice:arc_eazy@1")
    # JSON Lines read as text: its syntax was scored as the text's perplexity
    (records := tmp_path / "records.jsonl").write_text('{"text": "one line"}\n')
    with pytest.raises(ValueError, match=r"^ppl: file .*records.jsonl is JSON Lines, and this reads plain text"):
        tasks.parse_task(f"ppl:{records}")


@pytest.mark.parametrize(("shots", "expected"), [(8, "8-shot needs at least 9 examples, it has 8"),
                                                 (-1, "shots=-1; give a whole number of 0 or more")])
def test_the_library_checks_shots_as_the_command_does(arithmetic, shots, expected):
    """`choice_accuracy(..., shots=8)` on 8 examples was NumPy's "Cannot take a larger sample than population"."""
    with pytest.raises(ValueError, match=f"^basic_arithmetic: {re.escape(expected)}$"):
        tasks.choice_items(None, "causal", arithmetic, shots)


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "holds a list"),
    ("{not json", "not JSON"),
    ('{"examples": []}', "has no 'examples'"),
    ('{"examples": [{"target_scores": {"a": 1, "b": 0}}]}', "examples[0] has no 'input'"),
    ('{"examples": [{"input": "q", "target_scores": {"a": 1}}]}', "examples[0] has no 'target_scores'"),
    ('{"examples": [{"input": "q", "target_scores": {"a": 1, "b": 1}}]}', "no correct choice"),
])
def test_a_file_that_is_not_a_bigbench_choice_task_names_what_is_missing(tmp_path, content, message):
    path = tmp_path / "task.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tasks.load_choice_task(path)


@pytest.mark.parametrize("content, message", [
    # NaN won every comparison it was in: the example counted as wrong whatever the model chose
    ('{"examples": [{"input": "q", "target_scores": {"a": NaN, "b": 0}}]}', "examples[0].target_scores must map each "
                                                                            "choice to a finite number"),
    ('{"examples": [{"input": "q", "target_scores": {"a": Infinity, "b": 0}}]}', "to a finite number"),
    # each was a TypeError's (or the tokenizer's) traceback once the sweep had begun
    ('{"examples": [{"input": "q", "target_scores": {"a": 1, "b": 0}}], "task_prefix": 5}',
     "'task_prefix' is 5; give text (BIG-bench's default is '')"),
    ('{"examples": [{"input": "q", "target_scores": {"a": 1, "b": 0}}], "example_input_prefix": null}',
     "'example_input_prefix' is None; give text"),
    ('{"examples": [{"input": "caf\\ud83d", "target_scores": {"a": 1, "b": 0}}]}',
     "examples[0] holds 'caf\\ud83d', with half a surrogate pair"),
    ('{"examples": [{"input": "q", "target_scores": {"\\udc00": 1, "b": 0}}]}', "examples[0] holds '\\udc00', with half"),
])
def test_a_task_whose_values_json_allows_but_bigbench_does_not_is_named(tmp_path, content, message):
    path = tmp_path / "task.json"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        tasks.load_choice_task(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value), str(error.value)


def test_a_task_saved_with_a_byte_order_mark_is_read_as_every_text_file_is(tmp_path):
    """It was "not JSON (Unexpected UTF-8 BOM)", where the ppl lines and fine-tuning files drop the mark."""
    path = tmp_path / "task.json"
    path.write_text("\ufeff" + json.dumps({"examples": [{"input": "q", "target_scores": {"a": 1, "b": 0}}]}),
                    encoding="utf-8")
    assert tasks.load_choice_task(path).examples == [{"input": "q", "target_scores": {"a": 1, "b": 0}}]


def test_zero_shot_prompt_follows_bigbench_default_format(arithmetic):
    first = arithmetic.examples[0]
    assert first == {"input": "Calculate 5 + 91 =", "target_scores": {"97": 0, "95": 0, "106": 0, "96": 1}}
    shuffled = list(np.random.RandomState(0).permutation(["106", "95", "96", "97"]))
    expected = "\nQ: Calculate 5 + 91 =" + "".join("\n  choice: " + c for c in shuffled) + "\nA: "
    assert tasks.prompts(arithmetic, 0)[0] == expected


def test_shots_are_other_examples_with_their_answers_drawn_deterministically(arithmetic):
    three = tasks.prompts(arithmetic, 3)
    assert three == tasks.prompts(arithmetic, 3)
    for index, prompt in enumerate(three):
        parts = prompt.split("\n\nQ: ")
        assert len(parts) == 4 and parts[-1].startswith(arithmetic.examples[index]["input"])
        for shot in parts[:-1]:
            question, answer = shot.removeprefix("\nQ: ").split("\nA: ")
            source = next(e for e in arithmetic.examples if question.startswith(e["input"]))
            assert source is not arithmetic.examples[index] and answer == tasks.correct_choice(source)


def test_continuation_carries_the_prompts_trailing_space_and_splits_the_whole_texts_tokens():
    gpt2 = load_tokenizer(gpt2_tokenizer_dir())
    item = tasks.continuation_item(gpt2, "causal", "Q: 1 + 4 =\nA: ", "5")
    assert list(item.context) + list(item.continuation) == gpt2.encode("Q: 1 + 4 =\nA: 5")
    assert gpt2.decode(list(item.continuation)) == " 5"
    bert = load_tokenizer(bert_vocab_path())
    item = tasks.continuation_item(bert, "masked", "the capital of france is ", "paris")
    assert bert.convert_ids_to_tokens([item.context[0]]) == ["[CLS]"] and item.suffix == (bert.token_to_id("[SEP]"),)
    assert bert.decode(list(item.continuation)) == "paris"


def test_perplexity_lines_become_windows_that_score_each_token_once():
    gpt2 = load_tokenizer(gpt2_tokenizer_dir())
    line = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    ids = gpt2.encode(line, add_special_tokens=True)
    items = tasks.line_items(gpt2, line, "causal", 8)
    assert sum((list(i.continuation) for i in items), []) == ids[1:]
    assert all(len(i.context) == 1 and len(i.continuation) <= 8 for i in items) and len(items) >= 2
    assert [i.context[0] for i in items] == ids[:-1:8]
    bert = load_tokenizer(bert_vocab_path())
    items = tasks.line_items(bert, line, "masked", 10)
    assert all(len(i.context) + len(i.continuation) + len(i.suffix) <= 10 for i in items)
    assert sum((list(i.continuation) for i in items), []) == bert.encode(line)


def test_choice_metrics_count_ties_as_correct_and_report_the_random_baseline():
    choice = tasks.ChoiceTask("t", [{"input": "a", "target_scores": {"x": 1, "y": 0}},
                                    {"input": "b", "target_scores": {"x": 1, "y": 1, "z": 0, "w": 0}}], {})
    metrics, picks = tasks.choice_metrics(choice, [np.array([-1.0, -2.0]), np.array([-9.0, -3.0, -1.0, -5.0])],
                                          [np.array([1, 1]), np.array([1, 1, 1, 1])])
    assert metrics == {"accuracy": 0.5, "accuracy_norm": 0.5, "random_baseline": 0.5}
    assert picks == [{"pick": 0, "correct": True}, {"pick": 2, "correct": False}]
    per_token, _ = tasks.choice_metrics(choice, [np.array([-3.0, -2.0]), np.array([-9.0, -8.0, -1.0, -5.0])],
                                        [np.array([4, 1]), np.array([1, 8, 1, 1])])
    assert per_token["accuracy"] == 0.0 and per_token["accuracy_norm"] == 1.0


def test_lengths_are_padded_to_few_buckets():
    assert [bucket(n, 64) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    assert bucket(100, None) == 128


def test_two_tasks_of_the_same_name_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test.txt").write_text("a line\n")
    with pytest.raises(ValueError, match="both named 'ppl:test'"):
        tasks.parse_tasks([f"ppl:{tmp_path / 'a' / 'test.txt'},ppl:{tmp_path / 'b' / 'test.txt'}"])


def test_an_empty_task_between_commas_is_refused():
    """`heldout,,heldout` once ran heldout alone: a task left out of the list (an empty variable) went unnoticed."""
    for spec in ("heldout,,heldout", "heldout,"):
        with pytest.raises(ValueError, match="has an empty task between its commas"):
            tasks.parse_tasks([spec])
    assert tasks.parse_tasks(["heldout", "heldout"]) == tasks.parse_tasks(["heldout"])


def test_the_named_choice_tasks_are_real_questions_with_one_correct_choice_each():
    for name, path in choice_tasks(*CHOICE_TASKS).items():
        task = tasks.load_choice_task(path)
        assert task.name == name and len(task.examples) >= 299
        assert all(sorted(e["target_scores"].values())[-2:] == [0, 1] for e in task.examples)
    arc = tasks.load_choice_task(choice_task("arc_easy"))
    assert arc.examples[0] == {"input": "Which technology was developed most recently?", "target_scores": {
        "cellular telephone": 1, "television": 0, "refrigerator": 0, "airplane": 0}}
    expected = "Question: Which technology was developed most recently?\nAnswer: "
    assert tasks.prompts(arc, 0)[0] == expected  # lm-evaluation-harness's form: the choices are not listed
    shot, example = tasks.prompts(arc, 1)[0].split("\n\n")
    question, answer = shot.removeprefix("Question: ").split("\nAnswer: ")
    source = next(e for e in arc.examples if e["input"] == question)
    assert example == expected and answer == tasks.correct_choice(source)
    with pytest.raises(ValueError, match="no choice task arc; the named ones are arc_easy, arc_challenge"):
        choice_tasks("arc")


def test_a_cached_choice_task_of_other_prompt_settings_or_cut_short_is_written_again(tmp_path, monkeypatch):
    current = json.loads(choice_task("arc_easy").read_text())
    monkeypatch.setenv("JAXLM_CACHE", str(tmp_path))
    stale = {**current, "append_choices_to_input": True, "example_output_prefix": "\nA: "}  # BIG-bench's default
    for cached in (json.dumps(stale), json.dumps(current)[:1000]):
        path = tmp_path / "choice-cloze" / "arc_easy" / "task.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cached)
        assert choice_task("arc_easy") == path and json.loads(path.read_text()) == current


def test_a_row_whose_choices_repeat_or_miss_the_answer_is_left_out():
    row = {"question": "2 + 2 =", "choices": {"text": ["4", "5"], "label": ["A", "B"]}, "answerKey": "A"}
    assert bigbench_example(row) == {"input": "2 + 2 =", "target_scores": {"4": 1, "5": 0}}
    assert bigbench_example({**row, "choices": {"text": ["4", "4"], "label": ["A", "B"]}}) is None
    assert bigbench_example({**row, "answerKey": "C"}) is None


@pytest.mark.parametrize("kind", ["ppl", "choice"])
def test_a_task_read_from_a_pipe_keeps_its_text(kind, tmp_path):
    """`ppl:/dev/stdin` (or a shell's <(...)) was read once to check it and found empty when its items were read."""
    import os

    from jaxlm.eval.tasks import parse_task, read_lines
    text = "The cat sat.\nEmma was rich.\n" if kind == "ppl" else json.dumps(
        {"name": "piped", "examples": [{"input": "2+2=", "target_scores": {"4": 1, "5": 0}}]})
    readable, writable = os.pipe()
    os.write(writable, text.encode())
    os.close(writable)
    try:
        task = parse_task(f"{kind}:/dev/fd/{readable}")
    finally:
        os.close(readable)
    assert task.path.read_text() == text
    if kind == "ppl":
        assert read_lines(task.path) == read_lines(task.path) == ["The cat sat.", "Emma was rich."]
