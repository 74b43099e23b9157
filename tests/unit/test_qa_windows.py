"""QA windows equal transformers' overflowing windows on real SQuAD passages, the answer's tokens map
back to its exact characters, and n-best decoding returns character offsets across windows."""
import functools
import json

import numpy as np
import pytest

from jaxlm.corpora.labelled import dataset_path
from jaxlm.corpora.models import minilm_dir
from jaxlm.data.tokenizers.load import load_tokenizer
from jaxlm.finetune import qa

transformers = pytest.importorskip("transformers")


@functools.cache
def tokenizers():
    return load_tokenizer(minilm_dir()), transformers.BertTokenizerFast.from_pretrained(minilm_dir())


def questions(count: int) -> list[dict]:
    return [json.loads(line) for line in dataset_path("squad", "dev").read_text().splitlines()[:count]]


def test_windows_equal_transformers_and_answers_map_back_to_their_characters():
    ours, theirs = tokenizers()
    windows_seen = answers_seen = 0
    for record in questions(60):
        windows = qa.qa_windows(ours, record["question"], record["context"], 96, 24, 64, record["answers"])
        expected = theirs(record["question"], record["context"], truncation="only_second", max_length=96, stride=24,
                          return_overflowing_tokens=True, padding="max_length")
        assert [w.input_ids.tolist() for w in windows] == expected["input_ids"]
        assert [w.segment_ids.tolist() for w in windows] == expected["token_type_ids"]
        windows_seen += len(windows)
        for window in windows:
            if window.start_position:
                begin, end = window.offsets[window.start_position][0], window.offsets[window.end_position][1]
                assert record["context"][begin:end] == record["answers"][0]["text"]
                answers_seen += 1
    assert windows_seen > 100 and answers_seen >= 60


def test_decoding_finds_an_answer_in_a_later_window_with_its_characters():
    ours, _ = tokenizers()
    for record in questions(400):
        windows = qa.qa_windows(ours, record["question"], record["context"], 96, 24, 64, record["answers"])
        later = [(i, w) for i, w in enumerate(windows) if i > 0 and w.start_position]
        if later:
            break
    k, window = later[0]
    start_logits, end_logits = np.zeros((len(windows), 96)), np.zeros((len(windows), 96))
    start_logits[k, window.start_position], end_logits[k, window.end_position] = 9.0, 9.0
    start_logits[0, 2] = 5.0  # inside the question: never an answer
    answers = qa.decode_answers(start_logits, end_logits, windows, record["context"], n_best=5, max_answer_length=30)
    best = answers[0]
    assert best.text == record["answers"][0]["text"]
    assert record["context"][best.start:best.end] == best.text and best.score == 18.0
    assert [a.score for a in answers] == sorted((a.score for a in answers), reverse=True)
    short = qa.decode_answers(start_logits, end_logits, windows, record["context"], n_best=5,
                              max_answer_length=window.end_position - window.start_position)
    assert all(a.text != best.text for a in short) or window.end_position == window.start_position
    line = qa.prediction_record(answers)
    assert line["answer"] == best.text and abs(sum(a["probability"] for a in line["n_best"]) - 1) < 1e-3
