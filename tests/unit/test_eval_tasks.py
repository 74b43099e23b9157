"""Evaluation tasks: specs, BIG-bench prompts and shots, the items text becomes, and the metrics."""

import numpy as np
import pytest

from jaxlm.corpora.bigbench import bigbench_task
from jaxlm.corpora.models import bert_vocab_path, gpt2_tokenizer_dir
from jaxlm.data.tokenizers.load import load_tokenizer
from jaxlm.eval import tasks
from jaxlm.eval.scoring import bucket


@pytest.fixture(scope="module")
def arithmetic():
    return tasks.load_choice_task(bigbench_task("simple_arithmetic_json_multiple_choice"))


def test_task_specs(tmp_path, arithmetic):
    lines = tmp_path / "valid.txt"
    lines.write_text("one line\n\n")
    path = bigbench_task("simple_arithmetic_json_multiple_choice")
    parsed = tasks.parse_tasks([f"heldout,ppl:{lines}", f"choice:{path}@3", "heldout"])
    assert [(t.kind, t.shots, t.name) for t in parsed] == [
        ("heldout", 0, "heldout"), ("ppl", 0, "ppl:valid"),
        ("choice", 3, "choice:simple_arithmetic_json_multiple_choice@3")]
    with pytest.raises(ValueError, match="needs at least 9 examples"):
        tasks.parse_task(f"choice:{path}@8")
    with pytest.raises(FileNotFoundError, match="no such file"):
        tasks.parse_task(f"ppl:{tmp_path / 'missing.txt'}")


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


def test_zero_shot_prompt_follows_bigbench_default_format(arithmetic):
    first = arithmetic.examples[0]
    assert first == {"input": "1 + 4 =", "target_scores": {"5": 1, "4": 0, "6": 0, "3": 0}}
    shuffled = list(np.random.RandomState(0).permutation(["3", "4", "5", "6"]))
    expected = "\nQ: 1 + 4 =" + "".join(" option: " + c for c in shuffled) + "\nA: "
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
