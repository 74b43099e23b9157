"""Sizes, rates, shares, dtypes and empty paths out of range are refused before anything is built, in one line
that names the key: model sizes, dropouts and dtypes, the optimiser's rates and decays, the train and bench sections'
counts, the data's counts and shares (the same check for `jaxlm.data.prepare.prepare`), the finetune section's
counts."""
import dataclasses
import pathlib
import re

import numpy as np
import pytest

from jaxlm import config as config_lib
from jaxlm.config import ConfigError, FinetuneConfig
from jaxlm.corpora.text import check_output_file
from jaxlm.data.prepare import prepare
from jaxlm.data.settings import ABOVE_ZERO, MINIMUMS, SHARES
from jaxlm.finetune.predict import predict
from jaxlm.finetune.run import (POSITIVE_SETTINGS, SETTINGS_OR_ZERO, check_own_settings, check_settings,
                               prepare_run_dir)
from jaxlm.finetune.tasks import TASKS
from jaxlm.models.config import DROPOUTS, POSITIVE_SIZES, SIZES_OR_ZERO, TransformerConfig
from jaxlm.models.presets import PRESETS, model_config

BERT_TINY = pathlib.Path(__file__).parents[2] / "configs" / "bert-tiny.yaml"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_is_valid(preset):
    model_config(preset).validate()


@pytest.mark.parametrize(("field", "value", "expected"), [
    *((name, 0, f"model.{name}=0 must be positive") for name in POSITIVE_SIZES),
    ("num_layers", -1, "model.num_layers=-1 must be positive"),
    *((name, -1, f"model.{name}=-1 must be 0 or positive") for name in SIZES_OR_ZERO),
    *((name, value, f"model.{name}={value} must lie in [0, 1)") for name in DROPOUTS for value in (1.0, -0.1)),
    ("dtype", "float17", "model.dtype='float17'; choose one of ('float32', 'bfloat16', 'float16')"),  # a traceback
    ("param_dtype", "int8", "model.param_dtype='int8'; choose one of"),
    *((name, value, f"model.{name}={value} must be above 0") for name in ("layer_norm_eps", "rope_theta")
      for value in (0, -1)),  # NaN losses at step 1
    # beyond the table: a converted T5 with decoder_start_token_id=99999 scored perplexity nan
    *((name, 30522, f"model.{name}=30522 must lie in [0, model.vocab_size=30522), an id of the vocabulary")
      for name in ("pad_token_id", "decoder_start_token_id")),
    *((name, -2, f"model.{name}=-2 must lie in [-1, model.vocab_size=30522), an id of the vocabulary (-1: none)")
      for name in ("eos_token_id", "bos_token_id")),
])
def test_a_model_size_or_dropout_out_of_range_is_named(field, value, expected):
    # num_heads=0 once reached `hidden_size % num_heads` first: a ZeroDivisionError's traceback
    with pytest.raises(ValueError) as refused:
        model_config("bert-base", **{field: value}).validate()
    assert str(refused.value).startswith(expected)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"num_heads": 0}, "model.num_heads=0 must be positive"),
    ({"attention_kernel": "fast"}, "model.attention_kernel='fast'; choose one of ('xla', 'cudnn', 'flash', 'splash')"),
    ({"hidden_size": 30, "num_heads": 4}, "model.hidden_size=30 is not divisible by model.num_heads=4"),
    ({"family": "bret"}, "model.family='bret'; choose one of bert, roberta, distilbert, albert, spanbert, gpt2, "
                         "llama, t5, bart"),
    # these built, then failed inside the network's init (a broadcast of 64 against 128; range() of a float), or
    # trained with the string "no" as true
    ({"embedding_size": 64}, "model.embedding_size=64 narrows the token embeddings of albert; the bert family's are "
                             "hidden_size wide: leave it at 0"),
    ({"num_layers": 2.5}, "model.num_layers=2.5 must be an int"),
    ({"vocab_size": "1000"}, "model.vocab_size='1000' must be an int"),
    ({"tie_embeddings": "no"}, "model.tie_embeddings='no' must be a bool"),
])
def test_model_config_validates_its_overrides(overrides, expected):
    """The library's `model_config` once returned these, and the network failed later inside Flax (num_heads=0 as
    a ZeroDivisionError)."""
    with pytest.raises(ValueError) as refused:
        model_config("bert-tiny", **overrides)
    assert str(refused.value) == expected


def test_model_config_takes_numpy_scalars_as_the_numbers_they_hold():
    """A size read from an array (np.int64) was refused as "must be an int"; it is stored as the Python value, which
    JSON and hashing take."""
    config = model_config("bert-tiny", num_layers=np.int64(3), layer_norm_eps=np.float32(1e-6), hidden_dropout=0,
                          tie_embeddings=np.bool_(False))
    assert (type(config.num_layers), type(config.layer_norm_eps), type(config.hidden_dropout)) == (int, float, float)
    assert (config.num_layers, config.tie_embeddings) == (3, False) and abs(config.layer_norm_eps - 1e-6) < 1e-12
    with pytest.raises(ValueError, match=r"^model.num_layers=2.5 must be an int$"):
        model_config("bert-tiny", num_layers=np.float64(2.5))


@pytest.mark.parametrize(("build", "expected"), [
    # BERT built from this one ran a 99-wide attention (3 heads of 33) under a 100-wide model
    (lambda: TransformerConfig(vocab_size=100, hidden_size=100, num_heads=3),
     "model.hidden_size=100 is not divisible by model.num_heads=3"),
    (lambda: dataclasses.replace(model_config("llama-tiny"), dtype="fp32"),  # NumPy's "data type not understood"
     "model.dtype='fp32'; choose one of ('float32', 'bfloat16', 'float16')"),
    (lambda: dataclasses.replace(model_config("bert-tiny"), activation="silu"),  # a KeyError inside the network
     "model.activation='silu'; choose one of ('gelu', 'gelu_tanh', 'relu', 'swiglu', 'geglu')"),
    (lambda: TransformerConfig(hidden_size="128"), "model.hidden_size='128' must be an int"),
])
def test_a_config_built_directly_or_replaced_is_checked_as_it_is_built(build, expected):
    """The library's own constructor and `dataclasses.replace` check as `model_config` does: a network never meets a
    config it fails inside, or silently runs as another network."""
    with pytest.raises(ValueError) as refused:
        build()
    assert str(refused.value) == expected
    assert TransformerConfig(rope_theta=500000).rope_theta == 500000.0  # an int for a float field is its float


def test_a_family_reads_only_its_kinds_of_positions():
    """A Llama given T5's relative positions ran with none at all, and a T5 given learned ones kept its bias."""
    with pytest.raises(ValueError, match="the llama family's network reads 'learned' or 'rope' positions only"):
        model_config("llama-tiny", position_embedding="relative")
    with pytest.raises(ValueError, match="the t5 family's network reads 'relative' positions only"):
        model_config("t5-small", position_embedding="learned")
    with pytest.raises(ValueError, match="the bart family's network reads 'learned' positions only; choose it$"):
        model_config("bart-base", position_embedding="rope")  # its cached decoding would read the wrong positions
    assert model_config("llama-tiny", position_embedding="learned").position_embedding == "learned"
    assert model_config("bert-tiny", position_embedding="rope").position_embedding == "rope"  # on top of learned


@pytest.mark.parametrize(("buckets", "distance"), [(0, 128), (2, 128), (32, 16), (32, 0)])
def test_relative_positions_without_room_for_their_buckets_are_named(buckets, distance):
    """0 buckets was a traceback from inside the network; a max distance of 0 or half the buckets, "math domain
    error" alone."""
    with pytest.raises(ValueError) as refused:
        model_config("t5-small", relative_buckets=buckets, relative_max_distance=distance)
    assert str(refused.value) == (f"model.relative_buckets={buckets} and model.relative_max_distance={distance}: T5's "
                                  "relative positions need 4 buckets or more and a max distance above half the "
                                  "buckets (T5: 32 and 128)")
    model_config("t5-small", relative_buckets=4, relative_max_distance=3)


# each share's interval, written out rather than rebuilt as the check builds it, and its refused edges
INTERVALS = {"mask_prob": ("(0, 1]", [0]), "short_seq_prob": ("[0, 1]", []), "span_p": ("(0, 1]", [0]),
             "noise_density": ("(0, 1)", [0, 1]), "mask_ratio": ("[0, 1]", []), "valid_fraction": ("(0, 1)", [0, 1])}
SHARE_CASES = [(name, value, f"data.{name}={value:g} must lie in {INTERVALS[name][0]}")
               for name, _, _ in SHARES for value in (-0.1, 1.5, *INTERVALS[name][1])]


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("optim.grad_accum", 0, "optim.grad_accum=0 must be positive"),  # once a ZeroDivisionError
    *((f"optim.{name}", -1, f"optim.{name}=-1 must be 0 or more")
      for name in ("peak_lr", "end_lr", "warmup_steps", "weight_decay", "clip_norm")),
    *(("optim.eps", value, f"optim.eps={value} must be above 0: Adam divides") for value in (0, -1)),  # NaN at step 1
    *((f"optim.{name}", value, f"optim.{name}={value:g} must lie in [0, 1)") for name in ("b1", "b2")
      for value in (1.0, -0.1)),
    ("train.keep_checkpoints", 0, "train.keep_checkpoints must be positive, got 0"),
    ("train.eval_batches", -1, "train.eval_batches must be 0 (no held-out evaluation) or more, got -1"),
    ("train.time_limit_minutes", -1, "train.time_limit_minutes=-1 must be 0 (no limit) or more"),
    ("train.seed", -1, "train.seed=-1 must be 0 or more"),  # a fine-tune once compiled and trained, then failed
    ("train.run_dir", None, "train.run_dir is empty"),  # `train.run_dir=` once trained into a directory 'None'
    ("data.corpus", None, "data.corpus is empty"),
    *(("data.prepared_dir", value, "data.prepared_dir is empty; name the directory") for value in ("", None)),
    ("bench.steps", 0, "bench.steps=0 must be positive"),  # once a ZeroDivisionError
    ("bench.warmup", -1, "bench.warmup=-1 must be 0 or more"),  # once an UnboundLocalError
    ("bench.peak_flops_per_device", -1, "bench.peak_flops_per_device=-1 must be 0 or more"),
    *((f"data.{name}", least - 1, f"data.{name}={least - 1} must be {least} or more")
      for name, (least, _) in MINIMUMS.items()),
    *((f"data.{name}", value, f"data.{name}={value} must be above 0") for name in ABOVE_ZERO for value in (0, -1)),
    *((f"data.{name}", value, expected) for name, value, expected in SHARE_CASES),
])
def test_an_optimiser_train_or_data_value_out_of_range_is_named(key, value, expected):
    section, name = key.split(".")
    with pytest.raises(ConfigError) as refused:
        config_lib.from_dict({"model": {"preset": "bert-tiny"}, section: {name: value}})
    assert str(refused.value).startswith(expected)


@pytest.mark.parametrize(("setting", "value", "expected"), [
    ("mean_span_length", 0, "data.mean_span_length=0 must be 1 or more"),  # once a ZeroDivisionError's traceback
    ("valid_fraction", 0, "data.valid_fraction=0 must lie in (0, 1)"),  # once prepared data no run could read
])
def test_prepare_refuses_what_the_config_refuses(setting, value, expected, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence.\n\nAnother document.\n")
    with pytest.raises(ValueError) as refused:
        prepare([corpus], tmp_path / "prepared", tokenizer=None, **{setting: value})
    assert str(refused.value).startswith(expected)
    assert not (tmp_path / "prepared").exists()


def classifier_config(**settings):
    """A sequence classifier's fine-tune config with `settings` in its finetune section."""
    finetune = {"task": "sequence_classification", "init_from": "run", "train": "polarity:train", **settings}
    return config_lib.from_dict({"model": {"preset": "bert-tiny"}, "finetune": finetune})


@pytest.mark.parametrize(("name", "value", "expected"), [
    *((name, 0, "must be positive, got 0") for name in POSITIVE_SETTINGS),
    *((name, -1, "must be 0 or more, got -1") for name in SETTINGS_OR_ZERO),
])
def test_a_finetune_count_out_of_range_is_named(name, value, expected):
    """A negative doc_stride left gaps between question-answering windows, max_query_length=0 dropped the
    question, a negative early_stopping stopped at the first evaluation that did not improve."""
    with pytest.raises(ConfigError) as refused:
        check_settings(classifier_config(**{name: value}))
    assert str(refused.value) == f"finetune.{name} {expected}"


def test_a_max_length_too_short_for_the_special_tokens_is_named():
    """finetune.max_length=1 (and predict's 0, 1 or -4) ended in numpy's "could not broadcast" message."""
    with pytest.raises(ConfigError, match=r"^finetune.max_length=7 leaves no room for the special tokens and some "
                                          r"text; give 8 or more$"):
        check_settings(classifier_config(max_length=7))
    check_settings(classifier_config(max_length=8))


def test_an_unknown_pooling_is_named_as_a_finetune_setting_before_the_run_directory_is_written():
    with pytest.raises(ConfigError, match=r"^finetune.pooling='bogus'; choose one of pooler, first_dense_tanh, "):
        check_settings(classifier_config(pooling="bogus"))
    check_settings(classifier_config(pooling="mean"))


def test_question_answering_windows_hold_the_stride_after_the_longest_question():
    """Checked against max_query_length, the longest question kept: against each question's own length, a
    trained model refused a long question at `jaxlm predict` (and the defaults, 128 and 128, any question)."""
    qa = {"task": "question_answering", "train": "squad:train"}
    check_settings(classifier_config(**qa, max_length=128, doc_stride=60))
    with pytest.raises(ConfigError, match=r"^finetune.doc_stride=61 must be smaller than the context tokens a window "
                                          r"holds after the longest question \(61 = max_length 128 - max_query_length "
                                          r"64 - 3 special tokens\)"):
        check_settings(classifier_config(**qa, max_length=128, doc_stride=61))


def test_predict_refuses_what_the_head_was_trained_with():
    """`jaxlm predict RUN finetune.labels=[1,0]` once renamed the classes, finetune.crf=false dropped the CRF."""
    for override in ("finetune.labels=[1,0]", "finetune.crf=false", "finetune.pooling=mean"):
        with pytest.raises(ConfigError, match=rf"^finetune.{override.split('=')[0][9:]} is what the checkpoint was "
                                              "fine-tuned with"):
            predict("no-run", "polarity:test", "out.jsonl", overrides=[override])


def test_predict_and_eval_refuse_overrides_they_do_not_read():
    """`predict RUN train.global_batch=3` and `eval RUN optim.peak_lr=1` were accepted and changed nothing."""
    from jaxlm.eval import sweep  # the sweep's module loads the scorers: only this test needs it

    with pytest.raises(ConfigError, match=r"^the train.\* overrides change nothing: this command reads only the "
                                          r"model, mesh, data, finetune settings; remove them$"):
        predict("no-run", "polarity:test", "out.jsonl", overrides=["train.global_batch=3"])
    with pytest.raises(ConfigError, match=r"^the optim.\* overrides change nothing: this command reads only the "
                                          r"model, mesh, distributed, data, train settings; remove them$"):
        sweep.plan(["no-run"], ["heldout"], overrides=["optim.peak_lr=1"])


def test_predict_and_eval_name_a_misspelt_section_or_key_as_unknown():
    """A misspelt finetune key was "what the checkpoint was fine-tuned with", a misspelt section's overrides "change
    nothing"."""
    from jaxlm.eval import sweep

    cases = {"finetune.max_lenght=5": r"^unknown key\(s\) finetune.max_lenght; valid keys in finetune: task, ",
             "modle.dtype=bfloat16": r"^unknown section\(s\) \['modle'\]; valid sections: model, data, ",
             "data.max_seq_lenght=3": r"^unknown key\(s\) data.max_seq_lenght; valid keys in data: corpus, "}
    for override, said in cases.items():
        with pytest.raises(ConfigError, match=said):
            predict("no-run", "polarity:test", "out.jsonl", overrides=[override])
    with pytest.raises(ConfigError, match=r"^unknown section\(s\) \['trian'\]; valid sections: "):
        sweep.plan(["no-run"], ["heldout"], overrides=["trian.global_batch=8"])
    with pytest.raises(ConfigError, match=r"^unknown key\(s\) train.global_bach; valid keys in train: "):
        sweep.plan(["no-run"], ["heldout"], overrides=["train.global_bach=8"])


def test_predict_refuses_to_write_over_its_input(tmp_path):
    """`--output` naming the `--input` file, with --overwrite, once replaced the records with their predictions."""
    records = tmp_path / "records.jsonl"
    records.write_text('{"text": "a"}\n')
    for spec in (str(records), f"{records}[:1]"):
        with pytest.raises(ValueError, match=r"records.jsonl is the --input file, which writing would replace"):
            predict("no-run", spec, records, overwrite=True)
    assert records.read_text() == '{"text": "a"}\n'


def test_sentence_pairs_are_checked_as_their_loss_reads_them():
    """loss=ranking reads no label, so one that is text is no error; cosine's is a score, and a pair without one
    was once found only when the rows were built."""
    task, pair = TASKS["sentence_embedding"], {"text": "a", "text_pair": "b"}
    ranking, cosine = (FinetuneConfig(task="sentence_embedding", loss=loss) for loss in ("ranking", "cosine"))
    task.check([{**pair, "label": "entailment"}, pair], (), "train", ranking)
    with pytest.raises(ValueError, match=r"^train: record 1 has label 'entailment', not the number a score is$"):
        task.check([{**pair, "label": "entailment"}], (), "train", cosine)
    with pytest.raises(ValueError, match=r"^train: record 2 has no label, the score it is trained on"):
        task.check([{**pair, "label": 0.5}, pair], (), "train", cosine)


def test_text_to_text_records_need_a_target_and_predict_records_a_source():
    """A forgotten finetune.fields.target once trained on empty targets, and a record without a source was a
    KeyError in `jaxlm predict`."""
    task = TASKS["text_to_text"]
    with pytest.raises(ValueError, match=r"^dev: record 2 has no target text \(fields: source\); name it with "
                                         r"finetune.fields.target"):
        task.check([{"source": "a", "target": "b"}, {"source": "c"}], (), "dev", FinetuneConfig())
    task.check_inputs([{"source": "c"}], (), "--input")
    with pytest.raises(ValueError, match=r"^--input: record 1 has neither a source text nor a question"):
        task.check_inputs([{"text": "c"}], (), "--input")
    with pytest.raises(ValueError, match=r"^--input: record 1 has 3 choices, the training data 4"):
        TASKS["multiple_choice"].check_inputs([{"context": "c", "choices": ["a", "b", "c"]}], tuple("0123"), "--input")


@pytest.mark.parametrize(("name", "value"), [("train_layers", -2), ("layer_lr_decay", 0), ("unfreeze_every", -1)])
def test_a_ulmfit_setting_out_of_range_is_named_whether_or_not_ulmfit_runs(name, value):
    """train_layers=-2 and unfreeze_every=-1 once fine-tuned every layer from the start, silently."""
    with pytest.raises(ValueError, match=rf"^finetune\.{name}={value}"):
        check_settings(classifier_config(**{name: value}))


# a value other than the default for each setting that only some heads read
OWN_VALUES = {"regression": True, "pooling": "mean", "crf": True, "max_span_length": 4, "doc_stride": 64,
              "max_query_length": 32, "max_answer_length": 10, "n_best": 5, "loss": "cosine", "prefix": "summarize: ",
              "num_beams": 4, "max_target_length": 16}


def test_every_head_takes_its_own_settings_and_refuses_the_others():
    """finetune.crf=true on a sequence classifier, or finetune.loss on anything but sentence_embedding, was
    ignored without a word."""
    assert {name for task in TASKS.values() for name in task.own_settings} == set(OWN_VALUES)
    for task in TASKS.values():
        for name, value in OWN_VALUES.items():
            settings = FinetuneConfig(task=task.name, **{name: value})
            if name in task.own_settings:
                check_own_settings(settings)
                continue
            with pytest.raises(ConfigError, match=rf"^finetune\.{name}=.* is read by .*{task.name} would ignore it"):
                check_own_settings(settings)


def test_the_edges_that_mean_something_are_accepted():
    """A zero learning rate (a run that keeps its initial weights), no evaluation, no warm-up, no clipping,
    and BART's masking ratio of 0 (permutation alone)."""
    config_lib.from_dict({"model": {"preset": "bert-tiny"}, "optim": {"peak_lr": 0, "warmup_steps": 0, "clip_norm": 0},
                          "train": {"eval_batches": 0}, "data": {"mask_ratio": 0, "short_seq_prob": 0}})


def test_off_and_no_are_words_and_true_and_false_the_booleans(tmp_path):
    """YAML 1.1 read `train.compile_cache: off` as false, and the run cached its programs in a directory named
    False; a boolean setting takes true or false alone (yes and no were booleans too)."""
    path = tmp_path / "run.yaml"
    path.write_text(f"include: {BERT_TINY}\ntrain:\n  compile_cache: off\n")
    assert config_lib.load(path, []).train.compile_cache == "off"
    assert config_lib.load(path, ["train.compile_cache=off"]).train.compile_cache == "off"
    assert config_lib.load(path, ["data.lowercase=False"]).data.lowercase is False
    with pytest.raises(ConfigError, match=r"data.lowercase must be true or false, got 'no'"):
        config_lib.load(path, ["data.lowercase=no"])


@pytest.mark.parametrize("tree", [{"model": [1, 2]}, {"train": 3}, {"model": {"preset": "bert-tiny"}, "data": "x"}])
def test_a_section_that_is_not_a_mapping_is_named(tree):
    """`model: [1, 2]` in a YAML config was a TypeError's traceback."""
    name, value = next((k, v) for k, v in tree.items() if not isinstance(v, dict))
    with pytest.raises(ConfigError, match=rf"^section {name} must be a mapping of its keys to values .*got "
                                          + re.escape(repr(value))):
        config_lib.from_dict(tree)


def test_a_key_given_twice_and_a_config_that_sets_nothing_are_refused(tmp_path):
    """A second `train:` section silently replaced the first (its run_dir lost, a fresh run in runs/default), and a
    file of comments trained every default."""
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"include: {BERT_TINY}\ntrain:\n  run_dir: mine\nmodel: {{}}\ntrain:\n  steps: 3\n")
    with pytest.raises(ConfigError, match=re.escape(f"{twice}:5: 'train' is given twice in one mapping (first on "
                                                    "line 2), and YAML would keep only the last; merge the two")):
        config_lib.load(twice)
    with pytest.raises(ConfigError, match="override 'train={steps: 3, steps: 4}': 'steps' is given twice"):
        config_lib.load(BERT_TINY, ["train={steps: 3, steps: 4}"])
    with pytest.raises(ConfigError, match=re.escape("override 'train.steps=[1': expected ',' or ']', but got")):
        config_lib.load(BERT_TINY, ["train.steps=[1"])  # once a YAML parser's traceback
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match=re.escape(f"{empty} sets nothing, nor do overrides; a config names")):
        config_lib.load(empty)
    assert config_lib.load(empty, ["model.preset=bert-tiny"]).model.hidden_size == 128  # the overrides set it
    merged = tmp_path / "merged.yaml"  # YAML's merge key, overridden by a key of the same name: not given twice
    merged.write_text(f"include: {BERT_TINY}\ncommon: &common\n  steps: 3\ntrain:\n  <<: *common\n  steps: 4\n")
    assert config_lib.file_tree(merged)["train"] == {"steps": 4}
    unhashable = tmp_path / "unhashable.yaml"
    unhashable.write_text("? [a]\n: 1\n")
    with pytest.raises(ConfigError, match="unhashable.yaml:1: found unhashable key"):
        config_lib.load(unhashable)


def test_a_bad_include_is_named_with_the_file_that_includes_it(tmp_path):
    """An include that loops was a RecursionError's traceback, a list a TypeError's; a missing one did not say
    which file named it."""
    (tmp_path / "a.yaml").write_text("include: b.yaml\n")
    (tmp_path / "b.yaml").write_text("include: a.yaml\n")
    (tmp_path / "list.yaml").write_text("include: [a.yaml]\n")
    (tmp_path / "missing.yaml").write_text("include: nope.yaml\n")
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"{b}: include: a.yaml makes a loop ({a} -> {b} -> {a})")):
        config_lib.load(a)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'list.yaml'}: include: must name one config file")):
        config_lib.load(tmp_path / "list.yaml")
    with pytest.raises(FileNotFoundError, match=re.escape(f"{tmp_path / 'missing.yaml'}: include: "
                                                          f"{tmp_path / 'nope.yaml'} does not exist")):
        config_lib.load(tmp_path / "missing.yaml")


@pytest.mark.parametrize("override, expected", [
    ("optim.peak_lr=.nan", "optim.peak_lr must be a finite number, got nan"),  # once trained a step, then stopped
    ("finetune.epochs=.nan", "finetune.epochs must be a finite number, got nan"),  # Python's own message
    ("train.steps=3000000000", "train.steps=3000000000 is too large: a whole number here must lie within "
                               "±2147483647"),  # an OverflowError's traceback inside optax, after the run folder
    ("train.seed=1e30", "train.seed=1000000000000000019884624838656 is too large"),
    ("train.run_dir=[a, b]", "train.run_dir takes one value, got ['a', 'b']"),  # a folder named "['a', 'b']"
    ("data.corpus=[[a]]", "data.corpus must be a list of names, got [['a']]"),  # an AttributeError's traceback
    ("model.preset=", "model.preset is empty; name one of bert-tiny, "),  # trained a 768-wide default model
    ("model.cross_document_attention=true", "model.cross_document_attention=true is for decoders on packed rows"),
    # accepted until a run was distributed
    ("distributed.num_processes=-2", "distributed.num_processes=-2 must be 0 or more (0: from the cluster)"),
    ("distributed.process_id=-5", "distributed.process_id=-5 must be -1 or more (-1: from the cluster)"),
    ("distributed.local_device_count=-1", "distributed.local_device_count=-1 must be 0 or more"),
    ("distributed.init_timeout_s=0", "distributed.init_timeout_s=0 must be above 0: seconds to wait"),
    ("distributed.barrier_timeout_s=-3", "distributed.barrier_timeout_s=-3 must be above 0"),
    ("distributed.enabled=maybe", "distributed.enabled='maybe'; choose auto, true or false"),
])
def test_numbers_and_text_a_setting_cannot_take_are_named(override, expected):
    with pytest.raises(ConfigError) as refused:
        config_lib.load(BERT_TINY, [override])
    assert str(refused.value).startswith(expected)


def test_cross_document_attention_is_a_decoders_setting():
    for config in ("gpt2-tiny.yaml", "llama-tiny.yaml"):
        loaded = config_lib.load(BERT_TINY.parent / config, ["model.cross_document_attention=true"])
        assert loaded.model.cross_document_attention


def test_a_boolean_where_text_is_read_is_read_as_yaml_writes_it():
    """`distributed.enabled=true`, as documented, was read as the text 'True' and refused."""
    loaded = config_lib.load(BERT_TINY, ["distributed.enabled=true", "data.corpus=[demo:austen, 5]",
                                         "finetune.labels=[0, 1]"])
    assert loaded.distributed.enabled == "true"
    assert loaded.data.corpus == ("demo:austen", "5") and loaded.finetune.labels == ("0", "1")


def test_an_output_file_inside_a_file_is_named_as_such(tmp_path):
    """predict said the directory "does not exist" when it was a file."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileNotFoundError, match=re.escape(f"directory {tmp_path / 'afile'} is a file")):
        check_output_file(tmp_path / "afile" / "p.jsonl", overwrite=False)
    with pytest.raises(FileNotFoundError, match=re.escape(f"directory {tmp_path / 'afile'} is a file")):
        check_output_file(tmp_path / "afile" / "p.jsonl", overwrite=False, makes_parents=True)
    check_output_file(tmp_path / "new" / "p.jsonl", overwrite=False, makes_parents=True)
    with pytest.raises(FileNotFoundError, match=re.escape(f"directory {tmp_path / 'new'} does not exist; create it, "
                                                          "or name a file in a directory that exists")):
        check_output_file(tmp_path / "new" / "p.jsonl", overwrite=False)


def test_an_output_where_nothing_can_be_written_is_refused_before_the_work():
    """tokenizer train and embed did all their work, then failed on a temporary file's name. sysfs takes no new
    files, from root either."""
    for path, makes_parents in ((pathlib.Path("/sys/v.txt"), False), (pathlib.Path("/sys/a/b/v.txt"), True)):
        with pytest.raises(PermissionError, match=re.escape(f"--output {path}: cannot write in /sys (")):
            check_output_file(path, overwrite=False, makes_parents=makes_parents)


def test_a_fine_tune_into_a_directory_with_checkpoints_is_refused(tmp_path):
    """A pretraining run's directory was said to hold "a fine-tune's checkpoints", and a finished fine-tune's own
    "checkpoints (of another run)"."""
    (tmp_path / "checkpoints" / "20").mkdir(parents=True)
    config = classifier_config()
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, run_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match=re.escape(f"train.run_dir={tmp_path} already holds checkpoints, of an "
                                                    "earlier fine-tune or another run; a fine-tune starts in an empty "
                                                    "directory of its own (it does not resume)")):
        prepare_run_dir(config, source=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]


def test_a_file_where_a_directory_is_needed_is_named(tmp_path, capsys):
    """`data.prepared_dir=FILE/sub` said "[Errno 17] File exists: 'FILE'"."""
    from jaxlm.cli import main  # the whole CLI: only this test runs it

    (tmp_path / "afile").write_text("x")
    assert main(["prepare", str(BERT_TINY), f"data.prepared_dir={tmp_path / 'afile' / 'sub'}"]) == 2
    assert capsys.readouterr().err == (f"jaxlm prepare: error: {tmp_path / 'afile'} is a file where a directory is "
                                       "needed; move it or choose another path\n")
    assert (tmp_path / "afile").read_text() == "x"
