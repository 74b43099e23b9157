"""`jaxlm finetune` and `jaxlm predict` on real labelled data with the real all-MiniLM-L6-v2, CI-sized:
classification beats the majority class, QA learns the answers it trained on, tagging (softmax and CRF) is
scored as seqeval scores it, Sentence-BERT's result is what `jaxlm embed` loads, and bad input stops before any
compute."""
import json

import jax
import numpy as np
import pytest
import seqeval.metrics
import yaml

from conftest import ROOT, run_cli
from jaxlm.cli import main
from jaxlm.config import ConfigError
from jaxlm.corpora.labelled import dataset_path

BASE = {"mesh": {"data": -1, "rules": "dp"},
        "optim": {"name": "adamw", "peak_lr": 1.0e-4, "weight_decay": 0.01, "eps": 1.0e-8},
        "train": {"global_batch": 16, "seed": 0, "log_every": 5}}


def write(tmp_path, name: str, finetune: dict, **sections) -> tuple:
    run_dir = tmp_path / f"run-{name}"
    tree = {**BASE, **sections, "finetune": {"epochs": 2, "max_length": 64, **finetune},
            "train": {**BASE["train"], **sections.get("train", {}), "run_dir": str(run_dir)}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path, run_dir


def finetune(config) -> None:
    """`jaxlm finetune CONFIG` on one device in a process of its own, as a user's CPU run goes: these models'
    steps take 1.7x as long split over this process's 8 simulated devices on two cores (the polarity run:
    115 s against 69, the same accuracies). The frozen-body and decoder tests fine-tune on all 8."""
    run_cli("finetune", config, devices=1, timeout=1200)


def summary_of(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def polarity(tmp_path_factory, minilm_converted):
    """A sentiment classifier fine-tuned from all-MiniLM-L6-v2 on the polarity sentences."""
    tmp_path = tmp_path_factory.mktemp("polarity")
    config, run_dir = write(tmp_path, "polarity", {
        "task": "sequence_classification", "init_from": str(minilm_converted), "train": "polarity:train",
        "dev": "polarity:dev", "test": "polarity:test", "epochs": 4})
    finetune(config)
    return run_dir


def test_classification_beats_the_majority_class(polarity):
    summary = summary_of(polarity)
    assert summary["dev"]["accuracy"] > summary["dev_baseline"]["accuracy"] + 0.15
    assert summary["test"]["accuracy"] > summary["test_baseline"]["accuracy"] + 0.1
    evaluations = [r for r in read_jsonl(polarity / "metrics.jsonl") if r.get("split") == "eval"]
    assert evaluations[0]["step"] == 0 and len(evaluations) == 5  # before training, then every epoch
    assert max(r["accuracy"] for r in evaluations) == summary["dev"]["accuracy"]
    steps = [int(p.name) for p in (polarity / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps == [summary["best_step"]]  # only the best checkpoint is kept


def test_predict_writes_the_label_and_probabilities_of_each_record(polarity, tmp_path):
    output = tmp_path / "predictions.jsonl"
    assert main(["predict", str(polarity), "--input", "polarity:test", "--output", str(output)]) == 0
    lines = read_jsonl(output)
    assert len(lines) == 30 and set(lines[0]) == {"text", "label", "probabilities"}
    assert all(abs(sum(line["probabilities"].values()) - 1) < 1e-5 for line in lines)
    assert [line["label"] for line in lines] == [p["label"] for p in read_jsonl(polarity / "test_predictions.jsonl")]
    assert main(["predict", str(polarity), "--input", "polarity:test", "--output", str(output)]) == 2  # no overwrite


def test_a_batch_larger_than_the_input_is_as_large_as_the_input(polarity, tmp_path, monkeypatch):
    """--batch-size 100000000 padded a batch of that many rows: the process was killed for memory."""
    from jaxlm.finetune import predict
    batches, build = [], predict.build

    def checked(config, **kwargs):
        batches.append(config.train.global_batch)
        assert config.train.global_batch <= 1024, "a batch of padding"  # before the memory runs out
        return build(config, **kwargs)

    monkeypatch.setattr(predict, "build", checked)
    output = tmp_path / "predictions.jsonl"
    assert main(["predict", str(polarity), "--input", "polarity:test[:5]", "--output", str(output),
                 "--batch-size", str(10 ** 8)]) == 0
    assert batches == [-(-5 // jax.device_count()) * jax.device_count()] and len(read_jsonl(output)) == 5


def test_to_hf_of_a_fine_tuned_classifier_says_what_to_export_instead(polarity, tmp_path, capsys):
    """It said only that the parameters do not fit ("unexpected: classifier/bias; ...")."""
    capsys.readouterr()
    assert main(["convert", "to-hf", str(polarity), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxlm convert to-hf: error: {polarity} was fine-tuned for sequence_classification, a "
                          "head the Hugging Face pretraining model does not hold (parameters do not fit") and \
        err.endswith("; export the checkpoint it was fine-tuned from (its finetune.init_from)\n") and \
        err.count("\n") == 1, err
    assert not (tmp_path / "hf").exists()


def test_eval_of_a_fine_tuned_run_says_what_it_can_score_instead(polarity, tmp_path, capsys):
    """heldout said the run's data/prepared was missing (pass data.prepared_dir=DIR, then its masked-LM parameters
    were), and ppl that it was an encoder converted without its masked-LM head."""
    lines = tmp_path / "lines.txt"
    lines.write_text("a fine film\n")
    expected = {"heldout": f"heldout needs a pretraining run's data and objective; {polarity} is fine-tuned for "
                           "sequence_classification (its summary.json holds its dev and test metrics",
                f"ppl:{lines}": f"ppl:lines: {polarity} cannot score text: it is fine-tuned for "
                                "sequence_classification, and keeps no mlm parameters; score the checkpoint it was "
                                "fine-tuned from (its finetune.init_from)"}
    capsys.readouterr()
    for task, said in expected.items():
        assert main(["eval", str(polarity), "--tasks", task, "--out", str(tmp_path / "eval")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"jaxlm eval: error: {said}") and err.count("\n") == 1, err
    assert not (tmp_path / "eval").exists()


def test_pretraining_from_a_fine_tuned_run_says_to_start_from_what_it_was_tuned_from(polarity, tiny_config, capsys):
    """train.init_from a fine-tuned run listed the pretraining heads' parameters as missing and said to make the
    model section match the checkpoint."""
    capsys.readouterr()
    assert main(["train", str(tiny_config({"train": {"init_from": str(polarity)}}))]) == 2
    err = capsys.readouterr().err
    assert err == (f"jaxlm train: error: train.init_from={polarity} is fine-tuned for sequence_classification: its "
                   "head is not this model's, and it keeps none of the pretraining heads; start from the checkpoint "
                   "it was fine-tuned from (its finetune.init_from)\n"), err


def test_another_tasks_classifier_starts_from_the_fine_tuned_encoder_with_a_new_head(polarity, tmp_path, capsys):
    """From the 2-label polarity run to 3 labels: its classifier's shapes differ, so the classifier starts fresh
    and the encoder is the fine-tuned one (this was an error after initialisation, naming train.init_from); with
    train_layers=0 only the head (pooler, classifier) moves."""
    from jaxlm.convert.store import load_checkpoint
    records = read_jsonl(dataset_path("polarity", "train"))[:48]
    train = tmp_path / "three.jsonl"
    train.write_text("".join(json.dumps({**r, "label": "neutral" if i % 3 == 0 else r["label"]}) + "\n"
                             for i, r in enumerate(records)))
    config, run_dir = write(tmp_path, "three", {"task": "sequence_classification", "init_from": str(polarity),
                                                "train": str(train), "epochs": 1, "train_layers": 0})
    assert main(["finetune", str(config)]) == 0
    assert ("encoder, classifier new (the checkpoint's has other shapes: ['bias'] (2,) vs (3,)) from "
            in capsys.readouterr().out)
    (_, source, _), (_, tuned, _) = load_checkpoint(polarity), load_checkpoint(run_dir)
    assert tuned["classifier"]["kernel"].shape[-1] == 3
    kept = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), source["encoder"], tuned["encoder"])
    assert all(jax.tree.leaves({k: v for k, v in kept.items() if k != "pooler"}))  # the head: pooler, classifier


def test_question_answering_learns_the_answers_it_trained_on(tmp_path, minilm_converted):
    """Extractive QA on 160 SQuAD questions, two epochs, scored on 80 of them: the start/end head learns to point at
    the answers (on the 10,570-question copy of SQuAD dev one epoch gave F1 26 against 3 untrained; the 1,000 we
    have now repeat a paragraph less often, and one epoch gave F1 12), and the windows' n-best spans map back to
    the answer text. Unseen questions would not show it: on SQuAD's dev split, with data this small, an
    untrained head's long random spans score about as well as a trained one (F1 15 against 8);
    `bench/finetune_hf.py` compares generalisation with transformers."""
    config, run_dir = write(tmp_path, "squad", {
        "task": "question_answering", "init_from": str(minilm_converted), "train": "squad:train[:160]", "epochs": 2,
        "dev": "squad:train[:80]", "max_length": 128, "doc_stride": 32}, optim={**BASE["optim"], "peak_lr": 3.0e-4})
    finetune(config)
    summary = summary_of(run_dir)
    untrained = next(r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("split") == "eval")
    assert untrained["step"] == 0 and summary["dev"]["f1"] > max(untrained["f1"], summary["dev_baseline"]["f1"]) + 12
    assert summary["dev"]["exact_match"] > 10
    output = tmp_path / "answers.jsonl"
    assert main(["predict", str(run_dir), "--input", "squad:dev[:20]", "--output", str(output)]) == 0
    for line in read_jsonl(output):
        assert line["context"][line["start"]:line["end"]] == line["answer"]
        assert line["n_best"][0]["text"] == line["answer"]


@pytest.mark.parametrize("crf", [False, True])
def test_tagging_is_scored_by_seqeval(tmp_path, minilm_converted, crf):
    """Tagging on 160 WNUT sentences, scored on 48 of them: the entities it learns to find (F1 0.38 with softmax
    in 3 epochs, 0.57 with the CRF in 2; softmax in 2 finds 0.15) are scored as seqeval scores the written
    predictions. Unseen sentences would not show it: trained this little, it tags every word of WNUT's test split
    O, and any scorer gives that F1 0."""
    every_tag = sorted({t for split in ("train", "test") for r in read_jsonl(dataset_path("wnut16", split))
                        for t in r["tags"]})  # the first 160 sentences lack some types the test has
    config, run_dir = write(tmp_path, "wnut", {
        "task": "token_classification", "init_from": str(minilm_converted), "train": "wnut16:train[:160]",
        "test": "wnut16:train[:48]", "crf": crf, "labels": every_tag, "epochs": 2 if crf else 3},
        optim={**BASE["optim"], "peak_lr": 5.0e-4})
    finetune(config)
    summary = summary_of(run_dir)
    predicted = [line["tags"] for line in read_jsonl(run_dir / "test_predictions.jsonl")]
    gold = [r["tags"] for r in read_jsonl(dataset_path("wnut16", "train"))[:48]]
    assert [len(p) for p in predicted] == [len(g) for g in gold]
    assert summary["test"]["f1"] > 0.2
    assert summary["test"]["f1"] == pytest.approx(seqeval.metrics.f1_score(gold, predicted))
    assert summary["test"]["tag_accuracy"] > summary["test_baseline"]["tag_accuracy"]


def test_sentence_embedding_ranking_then_embed(tmp_path, minilm_converted):
    config, run_dir = write(tmp_path, "sbert", {
        "task": "sentence_embedding", "loss": "ranking", "init_from": str(minilm_converted),
        "train": "squad:train[:64]", "dev": "squad:dev[:64]", "max_length": 96, "epochs": 1,
        # a label that is text (the article's title), which ranking, reading none, once refused as a score
        "fields": {"text": "question", "text_pair": "context", "label": "title"}})
    finetune(config)
    summary = summary_of(run_dir)
    assert summary["dev"]["recall_at_1"] > 5 * summary["dev_baseline"]["recall_at_1"]
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("Which team won Super Bowl 50?\nThe Broncos won the game.\n")
    vectors = tmp_path / "vectors.npy"
    assert main(["embed", str(run_dir), "--input", str(sentences), "--output", str(vectors)]) == 0
    assert np.load(vectors).shape == (2, 384)


# ---------------------------------------------------------------- bad input: one line, before any compute

def bad_cases(tmp_path, minilm):
    unseen = tmp_path / "unseen.jsonl"
    unseen.write_text(json.dumps({"text": "fine", "label": "neutral"}) + "\n")
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(json.dumps({"sentence": "fine", "label": "positive"}) + "\n")
    off = tmp_path / "off.jsonl"
    off.write_text(json.dumps({"id": "q1", "question": "who?", "context": "Ann met Bob.",
                               "answers": [{"text": "Bob", "answer_start": 2}]}) + "\n")
    tags = tmp_path / "tags.jsonl"
    tags.write_text(json.dumps({"words": ["Ann", "met", "Bob"], "tags": ["B-person", "O"]}) + "\n")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"words": ["Ann", "met", "Bob"], "tags": ["B-person", "O", "X-person"]}) + "\n")
    classify = {"task": "sequence_classification", "init_from": str(minilm), "train": "polarity:train"}
    return {
        "label unseen in train": ({**classify, "dev": str(unseen)}, ["record 1 has label 'neutral'", "known: negative"]),
        "missing field": ({**classify, "train": str(renamed)}, [f"{renamed}:1: no field 'text'", "finetune.fields.text"]),
        "answer not in context": ({"task": "question_answering", "init_from": str(minilm), "train": str(off),
                                   "max_query_length": 16, "doc_stride": 16},
                                  ["answer 'Bob' at 2 is not in its context", "context[2:5] is 'n m'"]),
        "tags and words differ": ({"task": "token_classification", "init_from": str(minilm), "train": str(tags)},
                                  ["3 words but 2 tags"]),
        "tags that mix entities with others": ({"task": "token_classification", "init_from": str(minilm),
                                                "train": str(mixed)}, ["tag 'X-person' is neither O nor an entity"]),
        "head that does not fit": ({**classify, "task": "text_to_text"}, ["does not fit a bert model"]),
        "unknown task": ({**classify, "task": "summarise"}, ["finetune.task='summarise'", "question_answering"]),
        "no checkpoint": ({**classify, "init_from": str(tmp_path / "nothing")}, ["finetune.init_from"]),
        "a setting another head reads": ({**classify, "crf": True}, [
            "finetune.crf=true is read by token_classification only; sequence_classification would ignore it"]),
        # an OverflowError's traceback once the train step had compiled, and the run directory begun
        "more steps than a run counts": ({**classify, "epochs": 1e9}, ["finetune.epochs=1e+09 makes", "more than a run "
                                                                       "counts (2,147,483,647); give fewer epochs"]),
        "one label": ({**classify, "train": "polarity:train[:1]"}, ["finetune.train: every record has the label",
                                                                    "a classifier needs examples of two or more"]),
    }


@pytest.mark.parametrize("case", ["label unseen in train", "missing field", "answer not in context",
                                  "tags and words differ", "tags that mix entities with others",
                                  "head that does not fit", "unknown task", "no checkpoint",
                                  "a setting another head reads", "more steps than a run counts", "one label"])
def test_bad_input_is_one_line_before_compute(tmp_path, minilm_converted, capsys, case):
    finetune, expected = bad_cases(tmp_path, minilm_converted)[case]
    config, run_dir = write(tmp_path, "bad", finetune)
    assert main(["finetune", str(config)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("jaxlm finetune: error:") and "\n" not in error, error
    for text in expected:
        assert text in error, error
    assert not run_dir.exists()  # nothing written


def test_a_run_directory_nothing_can_be_written_in_is_named_before_compute(tmp_path, minilm_converted, capsys):
    """It was "[Errno 1] Operation not permitted: '/sys/finetune'", naming no setting."""
    config, _ = write(tmp_path, "unwritable", {"task": "sequence_classification", "init_from": str(minilm_converted),
                                               "train": "polarity:train"})
    assert main(["finetune", str(config), "train.run_dir=/sys/finetune"]) == 2
    assert capsys.readouterr().err == ("jaxlm finetune: error: train.run_dir=/sys/finetune: cannot write in /sys "
                                       "(Permission denied); choose a directory you can write to\n")


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, minilm_converted, capsys):
    import shutil
    from jaxlm.corpora.models import gpt2_tokenizer_dir
    mismatched = tmp_path / "mismatched"
    shutil.copytree(minilm_converted, mismatched)
    shutil.rmtree(mismatched / "tokenizer")
    shutil.copytree(gpt2_tokenizer_dir(), mismatched / "tokenizer")
    config, run_dir = write(tmp_path, "vocab", {"task": "sequence_classification", "init_from": str(mismatched),
                                                "train": "polarity:train"})
    assert main(["finetune", str(config)]) == 2
    assert "tokenizer and checkpoint do not match" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory):
    """A random small T5 (transformers) with the real botchan unigram SentencePiece model, converted."""
    import shutil

    import torch
    import transformers
    from jaxlm.corpora.models import sentencepiece_test_dir
    directory = tmp_path_factory.mktemp("t5")
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, feed_forward_proj="relu", tie_word_embeddings=True, pad_token_id=0,
                                   eos_token_id=1, decoder_start_token_id=0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(directory / "hf")
    shutil.copy(sentencepiece_test_dir() / "botchan_en_unigram_1000.model", directory / "hf" / "spiece.model")
    assert main(["convert", "from-hf", str(directory / "hf"), str(directory / "ckpt")]) == 0
    return directory / "ckpt"


def test_a_text_too_long_for_the_devices_memory_is_one_line(tmp_path, tiny_t5, capsys):
    """T5 numbers no positions, so nothing windows a long line: an 80 KB line's perplexity asked for 146 GB, and
    the evaluator ended in XLA's RESOURCE_EXHAUSTED traceback."""
    from jaxlm.corpora.registry import fetch_austen
    line = tmp_path / "long.txt"
    line.write_text(" ".join(fetch_austen().read_text().split())[:80_000] + "\n")
    capsys.readouterr()
    assert main(["eval", str(tiny_t5), "--tasks", f"ppl:{line}", "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert "jaxlm eval: error: 1 row(s) of up to " in err and " tokens need more memory than the device has " \
        "(RESOURCE_EXHAUSTED: " in err and err.endswith("give a smaller --batch-size, or shorter lines and texts\n")


def test_text_to_text_squad_beats_the_empty_answer(tmp_path, tiny_t5):
    """A T5 fine-tuned on 32 SQuAD questions cast as T5 casts them, its generated answers scored on the
    same questions: what this shows is that the loop learns and its generations are decoded and scored
    (a random T5 this small cannot generalise from 32 examples). Evaluated every tenth of its 30 epochs."""
    config, run_dir = write(tmp_path, "t5", {
        "task": "text_to_text", "init_from": str(tiny_t5), "train": "squad:train[:32]", "dev": "squad:train[:32]",
        "epochs": 30, "evals_per_epoch": 0.1, "max_length": 128, "max_target_length": 8},
        optim={**BASE["optim"], "peak_lr": 3.0e-3})
    finetune(config)
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("split") == "eval"] == [0, 20, 40, 60]
    summary = summary_of(run_dir)
    assert summary["metric"] == "f1" and summary["dev_baseline"]["f1"] == 0
    assert summary["dev"]["f1"] > 10
    output = tmp_path / "generated.jsonl"
    assert main(["predict", str(run_dir), "--input", "squad:train[:4]", "--output", str(output)]) == 0
    assert [set(line) for line in read_jsonl(output)] == [{"id", "question", "context", "text"}] * 4


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs" / "finetune").glob("*.yaml")
                                        if p.stem != "base"))
def test_every_finetune_config_plans(name, minilm_converted, tiny_t5):
    """Each config in configs/finetune reads, checks and encodes its real data (no compute), with its
    checkpoint replaced by a converted one of the same family."""
    from jaxlm.finetune import run
    path = ROOT / "configs" / "finetune" / f"{name}.yaml"
    init = tiny_t5 if "t5" in name else minilm_converted
    config, source = run.load(path, [], init_from=str(init))
    the_plan = run.plan(config, source)
    assert len(the_plan.rows["train"]) >= len(the_plan.records["train"]) > 0
    assert the_plan.total_steps >= the_plan.steps_per_epoch


@pytest.mark.parametrize("override, expected", [
    ("finetune.metric=bleu", r"^finetune.metric='bleu': sequence_classification reports accuracy, macro_f1$"),
    ("finetune.train_layers=7", r"^finetune.train_layers=7 exceeds the model's 6 layer groups \(ALBERT's shared layer "
                                r"is one\); give at most 6, or -1 to train every parameter$")])
def test_settings_the_model_or_task_cannot_take_fail_in_the_plan(override, expected, minilm_converted):
    """finetune.metric=bleu was refused only after compiling and the untrained model's dev evaluation, and
    train_layers beyond the model's layers was taken as all of them."""
    from jaxlm.finetune import run
    config, source = run.load(ROOT / "configs" / "finetune" / "polarity-minilm.yaml", [override],
                              init_from=str(minilm_converted))
    with pytest.raises(ConfigError, match=expected):
        run.plan(config, source)


def test_a_batch_larger_than_the_training_rows_holds_them_all_and_no_more(minilm_converted):
    """train.global_batch=100000 on 140 training rows stepped batches of 100000 rows, all but 140 of them padding
    (weight 0: the same steps at 700x the compute and memory)."""
    from jaxlm.finetune import run
    config, source = run.load(ROOT / "configs" / "finetune" / "polarity-minilm.yaml", ["train.global_batch=100000"],
                              init_from=str(minilm_converted))
    the_plan = run.plan(config, source)
    rows, shards = len(the_plan.rows["train"]), jax.device_count()
    assert the_plan.config.train.global_batch == -(-rows // shards) * shards < 100000
    assert the_plan.steps_per_epoch == 1


def choice_records(split: str, count: int, seed: int) -> list[dict]:
    """Multiple choice from real SQuAD questions: the question's answer among three answers of other
    questions, in a seeded order."""
    rng = np.random.default_rng(seed)
    questions = read_jsonl(dataset_path("squad", split))[:count]
    records = []
    for index, question in enumerate(questions):
        others = rng.choice([i for i in range(len(questions)) if i != index], 3, replace=False)
        choices = [question["answers"][0]["text"], *(questions[i]["answers"][0]["text"] for i in others)]
        order = rng.permutation(4)
        records.append({"context": question["question"], "choices": [choices[i] for i in order],
                        "label": int(np.flatnonzero(order == 0)[0])})
    return records


def test_multiple_choice_trains_and_predicts_the_chosen_option(tmp_path, minilm_converted):
    """One epoch of 128 questions picks 0.65 of the held-out answers (two: 0.71; chance 0.25)."""
    for split, count in (("train", 128), ("dev", 48)):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in choice_records(split, count, 0)))
    config, run_dir = write(tmp_path, "choice", {
        "task": "multiple_choice", "init_from": str(minilm_converted), "train": str(tmp_path / "train.jsonl"),
        "dev": str(tmp_path / "dev.jsonl"), "max_length": 48, "epochs": 1}, optim={**BASE["optim"], "peak_lr": 3.0e-4})
    finetune(config)
    summary = summary_of(run_dir)
    assert summary["dev"]["accuracy"] > 0.35 and summary["dev_baseline"]["accuracy"] < 0.35  # chance: 0.25
    output = tmp_path / "chosen.jsonl"
    assert main(["predict", str(run_dir), "--input", str(tmp_path / "dev.jsonl"), "--output", str(output)]) == 0
    lines = read_jsonl(output)
    assert len(lines) == 48 and all(0 <= line["choice"] < 4 and len(line["probabilities"]) == 4 for line in lines)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """A random small GPT-2 (transformers) with the real GPT-2 tokenizer, converted."""
    import shutil

    import torch
    import transformers
    from jaxlm.corpora.models import gpt2_tokenizer_dir
    directory = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory / "hf")
    for path in gpt2_tokenizer_dir().iterdir():
        shutil.copy(path, directory / "hf" / path.name)
    assert main(["convert", "from-hf", str(directory / "hf"), str(directory / "ckpt")]) == 0
    return directory / "ckpt"


def test_a_decoder_fine_tunes_on_prompts_and_classifies_from_its_last_token(tmp_path, tiny_gpt2):
    """Prompt/response pairs (polarity sentences and their label as the response) train with the loss
    on the response, and predictions are generated after each prompt; the same decoder classifies the
    sentences from its last token. A random decoder this small shows the path works, not a score."""
    for split, count in (("train", 64), ("dev", 16)):
        records = read_jsonl(dataset_path("polarity", split))[:count]
        (tmp_path / f"{split}.jsonl").write_text("".join(
            json.dumps({"prompt": f"Review: {r['text']}\nSentiment:", "response": f" {r['label']}"}) + "\n"
            for r in records))
    config, run_dir = write(tmp_path, "causal", {
        "task": "causal_lm", "init_from": str(tiny_gpt2), "train": str(tmp_path / "train.jsonl"),
        "dev": str(tmp_path / "dev.jsonl"), "max_length": 64, "max_target_length": 4, "epochs": 2})
    assert main(["finetune", str(config)]) == 0
    evaluations = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("split") == "eval"]
    assert {"rougeL", "rouge1", "rouge2"} <= set(evaluations[-1])
    losses = [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("split") == "train"]
    assert losses[-1] < losses[0]
    output = tmp_path / "responses.jsonl"
    assert main(["predict", str(run_dir), "--input", str(tmp_path / "dev.jsonl"), "--output", str(output)]) == 0
    assert [set(line) for line in read_jsonl(output)] == [{"prompt", "response"}] * 16

    config, run_dir = write(tmp_path, "decoder-classifier", {
        "task": "sequence_classification", "init_from": str(tiny_gpt2), "train": "polarity:train[:64]",
        "dev": "polarity:dev"})
    assert main(["finetune", str(config)]) == 0
    assert 0 <= summary_of(run_dir)["dev"]["accuracy"] <= 1


def test_a_decoder_head_needs_a_pad_token(tmp_path, tiny_gpt2, capsys):
    """The decoder with the real botchan SentencePiece model, which has no pad piece: refused in one line."""
    import shutil
    from jaxlm.data.tokenizers.load import tokenizer_path
    without_pad = tmp_path / "without-pad"
    shutil.copytree(tiny_gpt2, without_pad)
    shutil.rmtree(without_pad / "tokenizer")
    (without_pad / "tokenizer").mkdir()
    shutil.copy(tokenizer_path("botchan-unigram-1000"), without_pad / "tokenizer/spiece.model")
    config, run_dir = write(tmp_path, "no-pad", {"task": "sequence_classification", "init_from": str(without_pad),
                                                 "train": "polarity:train[:8]"})
    assert main(["finetune", str(config)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("jaxlm finetune: error:") and "\n" not in error, error
    assert "the tokenizer has no pad token" in error
    assert not run_dir.exists()


def test_a_frozen_body_leaves_the_pretrained_encoder_bit_identical(tmp_path, minilm_converted):
    """finetune.train_layers=0 (ULMFiT's frozen body) through the whole run: the checkpoint's encoder
    is the source's, only the head moved."""
    from jaxlm.convert.store import load_checkpoint
    config, run_dir = write(tmp_path, "frozen", {
        "task": "sequence_classification", "init_from": str(minilm_converted), "train": "polarity:train[:64]",
        "epochs": 1, "train_layers": 0, "schedule": "slanted_triangular"})
    assert main(["finetune", str(config)]) == 0
    _, source, _ = load_checkpoint(minilm_converted)
    _, tuned, _ = load_checkpoint(run_dir)
    flat = lambda tree: {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
    before, after = flat(source["encoder"]), flat(tuned["encoder"])
    moved = [name for name in before if "pooler" not in name and not np.array_equal(before[name], after[name])]
    assert not moved and not np.array_equal(before["['pooler']['kernel']"], after["['pooler']['kernel']"])
