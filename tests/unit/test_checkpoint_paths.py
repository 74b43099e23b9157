"""One resolver for checkpoint paths: a run directory, its checkpoints/ directory, one step directory
and a converted checkpoint all open the same way, for `train.init_from` and for reading."""
import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest
import transformers

from jaxlm import config as config_lib
from jaxlm.convert import store
from jaxlm.corpora.models import bert_vocab_path
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer
from jaxlm.eval.sources import open_source
from jaxlm.models.presets import model_config
from jaxlm.train import checkpoint
from jaxlm.train.loop import left_out

CONFIG = model_config("bert-tiny", vocab_size=64, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)


def params(value: float) -> dict:
    return {"encoder": {"kernel": np.full((2, 3), value, np.float32)}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory with committed steps 10 and 20 (their params filled with 10.0 and 20.0)."""
    run = tmp_path_factory.mktemp("run")
    mngr = checkpoint.manager(run / "checkpoints", keep=5, async_save=False)
    for step in (10, 20):
        checkpoint.save(mngr, step, {"params": params(float(step))}, {"step": step},
                        {"model": dataclasses.asdict(CONFIG)})
    mngr.wait_until_finished()
    mngr.close()
    return run


def abstract() -> dict:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params(0.0))


@pytest.mark.parametrize("form, step", [("run", 20), ("checkpoints", 20), ("checkpoints/10", 10)])
def test_every_form_of_a_run_path_resolves_to_its_step(run_dir, form, step):
    path = run_dir if form == "run" else run_dir / form
    with checkpoint.open_checkpoint(path) as (mngr, found):
        assert found == step and mngr.directory == (run_dir / "checkpoints").absolute()
    restored = checkpoint.restore_params(path, abstract())
    assert float(restored["encoder"]["kernel"][0, 0]) == step
    config, loaded, _ = store.load_checkpoint(path)
    assert config == CONFIG and float(loaded["encoder"]["kernel"][0, 0]) == step


def test_a_converted_checkpoint_resolves_to_step_0(tmp_path):
    out = store.save_converted(tmp_path / "converted", CONFIG, params(3.0))
    with checkpoint.open_checkpoint(out) as (_, step):
        assert step == 0
    assert float(checkpoint.restore_params(out, abstract())["encoder"]["kernel"][0, 0]) == 3.0
    assert float(store.load_checkpoint(out)[1]["encoder"]["kernel"][0, 0]) == 3.0


def test_what_init_from_leaves_out_of_a_deeper_checkpoint_is_named(run_dir, tmp_path):
    """A checkpoint with a second layer and a head that this model lacks: its parameters are restored, the
    others named in the "initialised from" line; the run's own shape leaves nothing out."""
    deeper = {**params(5.0), "layer_1": {"kernel": np.ones((3, 3), np.float32), "bias": np.ones(3, np.float32)},
              "nsp": {"kernel": np.ones((3, 2), np.float32)}}
    out = store.save_converted(tmp_path / "deeper", CONFIG, deeper)
    assert float(checkpoint.restore_params(out, abstract())["encoder"]["kernel"][0, 0]) == 5.0
    assert checkpoint.params_left_out(out, abstract()) == ["['layer_1']['bias']", "['layer_1']['kernel']",
                                                           "['nsp']['kernel']"]
    assert left_out(str(out), abstract(), listed=2) == (
        ", leaving out 3 of its parameters that this model does not have: ['layer_1']['bias'], ['layer_1']['kernel'] "
        "and 1 more (a shallower model, or another objective's heads?)")
    assert checkpoint.params_left_out(run_dir, abstract()) == [] and left_out(str(run_dir), abstract()) == ""


def test_an_explicit_step_wins_and_empty_or_missing_paths_are_refused(run_dir, tmp_path):
    assert float(checkpoint.restore_params(run_dir, abstract(), step=10)["encoder"]["kernel"][0, 0]) == 10
    with pytest.raises(FileNotFoundError, match="no checkpoint directory at"):
        checkpoint.resolve(tmp_path / "absent")
    (tmp_path / "afile").write_text("")  # was "no checkpoint directory at", as if nothing were there
    with pytest.raises(NotADirectoryError, match="afile is a file; a checkpoint is a directory: a run's"):
        checkpoint.resolve(tmp_path / "afile")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="train.init_from=.*no checkpoint found there"):
        checkpoint.restore_params(tmp_path / "empty", abstract())
    with pytest.raises(ValueError, match="is not a jaxlm checkpoint: it holds no Orbax checkpoint step"):
        store.load_checkpoint(tmp_path / "empty")


def test_another_models_checkpoint_is_named_as_one_without_orbax_notices(run_dir, tmp_path, caplog):
    """A GPT-2 run given to a BERT config listed six parameter names of 200 characters each; opening a checkpoint
    to read logged three absl warnings about the read-only manager it asked for."""
    decoder = store.save_converted(tmp_path / "decoder", CONFIG, {"decoder": {"kernel": np.ones((2, 3), np.float32)},
                                                                  "lm_head": {"bias": np.ones(3, np.float32)}})
    with pytest.raises(ValueError, match=r"^train.init_from=.*decoder: the checkpoint holds another model \(decoder, "
                                         r"lm_head; this config: encoder\), none of whose parameters this config "
                                         r"has: a run of another model family or objective\?"):
        checkpoint.restore_params(decoder, abstract())
    checkpoint.quiet_failed_writes()  # as `jaxlm` does first
    caplog.clear()
    with caplog.at_level("WARNING", logger="absl"), checkpoint.open_checkpoint(run_dir):
        pass
    assert not [r for r in caplog.records if "read only" in r.getMessage() or "read_only" in r.getMessage()]


def run_with_tokenizer(directory, data: dict, model: dict):
    """A run directory whose one checkpoint records a run config with these data and model settings, as a
    training run records its own."""
    run = config_lib.from_dict({"model": {"preset": "bert-tiny", **model}, "data": data,
                                "train": {"run_dir": str(directory)}})
    mngr = checkpoint.manager(directory / "checkpoints", keep=1, async_save=False)
    checkpoint.save(mngr, 1, {"params": params(1.0)}, {"step": 1}, config_lib.to_dict(run))
    mngr.wait_until_finished()
    mngr.close()
    return directory


def test_a_runs_tokenizer_reads_text_as_its_training_did(tmp_path):
    """`jaxlm embed`, `generate` and `convert to-hf` read a run's text with its data.lowercase and data.sentinels:
    a WordPiece vocabulary under a name of its own kept cased, and T5's SentencePiece with its sentinels."""
    vocab = tmp_path / "my-vocab.txt"
    shutil.copyfile(bert_vocab_path(), vocab)
    cased = run_with_tokenizer(tmp_path / "cased", {"vocab": str(vocab), "lowercase": False}, {"vocab_size": 30522})
    _, tokenizer = store.checkpoint_config(cased)
    text = "Emma Woodhouse, handsome, clever, and rich."
    ids = tokenizer.load().encode(text)
    assert ids == WordPieceTokenizer(vocab, lowercase=False).encode(text) != WordPieceTokenizer(vocab).encode(text)
    store.write_hf_tokenizer(tokenizer, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert theirs(text, add_special_tokens=False)["input_ids"] == ids

    spiece = {"vocab": "botchan-unigram-1000", "sentinels": 20}
    t5 = run_with_tokenizer(tmp_path / "t5", spiece, {"preset": "t5-small", "vocab_size": 1020})
    tokenizer = store.checkpoint_config(t5)[1]
    assert tokenizer.load().vocab_size == 1020
    store.write_hf_tokenizer(tokenizer, tmp_path / "t5-hf", "t5_chunks")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "t5-hf"))
    assert len(theirs) == 1020 and theirs.convert_tokens_to_ids("<extra_id_0>") == 1019
    ids = tokenizer.load().encode(text)
    assert theirs(text, add_special_tokens=False)["input_ids"] == ids
    assert theirs(text)["input_ids"] == [*ids, theirs.eos_token_id]  # T5's inputs end with </s>, as span corruption's
    assert tokenizer.load().encode(text, add_special_tokens=True) == [*ids, theirs.eos_token_id]  # generate's prompts


def test_a_tokenizer_that_is_not_the_models_is_refused(tmp_path, monkeypatch):
    """A run's relative data.vocab, read where `generate` ran, found another model's vocabulary: BERT's
    30,522 tokens for a GPT-2 run generated "[unused257]" three times, and `to-hf` exported it."""
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(bert_vocab_path(), tmp_path / "vocab.txt")
    run = run_with_tokenizer(tmp_path / "gpt", {"vocab": "vocab.txt"}, {"preset": "gpt2-small"})
    _, tokenizer = store.checkpoint_config(run)
    with pytest.raises(ValueError, match=r"^the tokenizer at vocab.txt has 30522 tokens but the checkpoint's model "
                                         r"50257: tokenizer and checkpoint do not match"):
        tokenizer.load()
    larger = dataclasses.replace(tokenizer, model_vocab=30000, exact=False)  # a converted checkpoint's
    with pytest.raises(ValueError, match="has 30522 tokens but the checkpoint's model 30000"):
        larger.load()
    assert dataclasses.replace(larger, model_vocab=30528).load().vocab_size == 30522  # a padded vocabulary


def test_a_checkpoint_whose_config_records_no_model_is_refused_by_every_reader(tmp_path):
    """`convert to-hf`, `generate` and `embed` (the store) and `eval` and `predict` (the sources) read the same
    config item and refuse one without a model config, or a step without the item, in a line that names the
    checkpoint and what is expected there."""
    mngr = checkpoint.manager(tmp_path / "run" / "checkpoints", keep=1, async_save=False)
    checkpoint.save(mngr, 1, {"params": params(1.0)}, {"step": 1}, {"train": {"steps": 1}})
    mngr.wait_until_finished()
    mngr.close()
    with checkpoint.open_checkpoint(tmp_path / "run") as (opened, step):
        assert checkpoint.stored_config(opened, step) is None
    with pytest.raises(ValueError, match=r"run is not a jaxlm checkpoint: its config item has no model"):
        store.checkpoint_config(tmp_path / "run")
    with pytest.raises(ValueError, match=r"run is not a jaxlm checkpoint: step 1 records no model config; expected"):
        open_source(tmp_path / "run", [])
    (tmp_path / "bare" / "checkpoints" / "1" / "state").mkdir(parents=True)  # a step without its config item
    with pytest.raises(ValueError, match=r"bare is not a jaxlm checkpoint: step 1 has no config or state item"):
        store.checkpoint_config(tmp_path / "bare")
    with pytest.raises(ValueError, match=r"bare is not a jaxlm checkpoint: step 1 has no readable config \('Item "
                                         r"\"config\" was not found.*; expected a directory written by"):
        open_source(tmp_path / "bare", [])


def test_eval_refuses_a_heldout_task_of_no_batches(tmp_path):
    """`jaxlm eval RUN train.eval_batches=0` wrote an empty results.jsonl and named three files it had not made."""
    from jaxlm.eval import sweep  # the sweep's module loads the scorers: only this test needs it

    run = run_with_tokenizer(tmp_path / "run", {"vocab": str(bert_vocab_path())}, {})
    with pytest.raises(config_lib.ConfigError, match=r"^train.eval_batches=0: the heldout task reads that many "
                                                     r"batches; give 1 or more, or other --tasks$"):
        sweep.plan([str(run)], ["heldout"], out=str(tmp_path / "eval"), overrides=["train.eval_batches=0"])
    assert not (tmp_path / "eval").exists()
