"""`jaxlm convert from-hf` then `to-hf` on small random Hugging Face models of each family: the same tensors
and the same outputs back, and clear errors on bad input that leave existing files alone."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import shutil
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from conftest import TINY, VOCAB_SIZE, run_cli  # noqa: E402
from jaxlm import config as config_lib  # noqa: E402
from jaxlm.cli import main  # noqa: E402
from jaxlm.convert import registry, store  # noqa: E402
from jaxlm.corpora.models import minilm_dir  # noqa: E402
from jaxlm.data.tokenizers.load import load_tokenizer  # noqa: E402
from jaxlm.models import BertForPreTraining, CausalLM  # noqa: E402
from jaxlm.train.checkpoint import restore_params  # noqa: E402
from jaxlm.train.loop import train  # noqa: E402

VOCAB = 1000
ATOL = 1e-5
SMALL = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64)
# family -> (transformers model class, config class, config fields, auto class, inputs kind)
FAMILIES = {
    "bert": ("BertForPreTraining", "BertConfig", SMALL, "AutoModelForPreTraining", "encoder"),
    "roberta": ("RobertaForMaskedLM", "RobertaConfig", {**SMALL, "max_position_embeddings": 66, "type_vocab_size": 1,
                                                        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
                "AutoModelForMaskedLM", "encoder"),
    "distilbert": ("DistilBertForMaskedLM", "DistilBertConfig",
                   dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64),
                   "AutoModelForMaskedLM", "encoder"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                                   bos_token_id=0, eos_token_id=0), "AutoModelForCausalLM", "decoder"),
    "llama": ("LlamaForCausalLM", "LlamaConfig", {**SMALL, "num_key_value_heads": 2, "rms_norm_eps": 1e-5},
              "AutoModelForCausalLM", "decoder"),
    "albert": ("AlbertForPreTraining", "AlbertConfig", {**SMALL, "embedding_size": 32}, "AutoModelForPreTraining",
               "encoder"),
    "t5": ("T5ForConditionalGeneration", "T5Config", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                         num_heads=4, decoder_start_token_id=0),
           "AutoModelForSeq2SeqLM", "seq2seq"),
    "bart": ("BartForConditionalGeneration", "BartConfig", dict(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64),
             "AutoModelForSeq2SeqLM", "seq2seq"),
}
BUFFERS = ("position_ids", "token_type_ids", "attn.bias", "attn.masked_bias", "inv_freq")


def inputs(kind: str) -> dict:
    """Right-padded random ids; seq2seq models also get decoder ids."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, VOCAB, size=(3, 12))
    mask = np.arange(12)[None, :] < np.array([12, 9, 5])[:, None]
    batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask.astype(np.int64))}
    if kind == "seq2seq":
        batch["decoder_input_ids"] = torch.from_numpy(rng.integers(3, VOCAB, size=(3, 7)))
    return batch


def outputs(model, kind: str) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(**inputs(kind))
    return {k: v.numpy() for k, v in out.items() if torch.is_tensor(v) and v.is_floating_point()}


def state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(directory) -> dict:
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def hf_model(family: str, directory, **overrides):
    """A small random model of `family` with every weight perturbed (biases and norms too), saved."""
    model_cls, config_cls, fields, _, _ = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**{**fields, **overrides}, attn_implementation="eager")
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """family -> (original model, HF dir, converted dir, to-hf dir), each through the real CLI."""
    root = tmp_path_factory.mktemp("convert")
    done = {}
    for family in FAMILIES:
        source, ckpt, back = root / f"{family}-hf", root / f"{family}-jaxlm", root / f"{family}-back"
        model = hf_model(family, source)
        if family == "bert":
            for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
                shutil.copy(minilm_dir() / name, source / name)
        assert main(["convert", "from-hf", str(source), str(ckpt)]) == 0
        assert main(["convert", "to-hf", str(ckpt), str(back)]) == 0
        done[family] = model, source, ckpt, back
    return done


def assert_same_tensors(model, directory) -> None:
    ours, theirs = safetensors_numpy.load_file(str(directory / "model.safetensors")), state(model)
    assert not [k for k in set(theirs) - set(ours) if not k.endswith(BUFFERS)]
    assert set(ours) <= set(theirs)
    for name, value in ours.items():
        assert value.dtype == np.float32 and value.shape == theirs[name].shape, name
        np.testing.assert_array_equal(value, theirs[name], err_msg=name)


def assert_same_outputs(model, directory, family: str) -> None:
    _, _, _, auto_class, kind = FAMILIES[family]
    loaded, info = getattr(transformers, auto_class).from_pretrained(
        str(directory), output_loading_info=True, attn_implementation="eager")
    assert type(loaded) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours, theirs = outputs(loaded.eval(), kind), outputs(model, kind)
    assert set(ours) == set(theirs) and ours
    for name in theirs:
        diff = float(np.abs(ours[name] - theirs[name]).max())
        print(f"{family} {name}: max abs diff {diff:.2e}")
        assert diff <= ATOL, name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_round_trip_gives_identical_tensors_and_outputs(converted, family):
    model, _, ckpt, back = converted[family]
    config, params, _ = store.load_checkpoint(ckpt)
    assert config.family == family and config.dtype == "float32" and not config.scan_layers
    hf_config = json.loads((back / "config.json").read_text())
    assert hf_config["model_type"] == family
    assert registry.family_for_hf(hf_config).converter("config_from_hf")(hf_config, dtype="float32") == config
    assert_same_tensors(model, back)
    assert_same_outputs(model, back, family)


def test_tokenizer_files_travel_both_ways(converted):
    _, source, ckpt, back = converted["bert"]
    names = ("vocab.txt", "tokenizer.json", "tokenizer_config.json")
    for name in names:
        assert (ckpt / "tokenizer" / name).read_bytes() == (source / name).read_bytes()
        assert (back / name).read_bytes() == (source / name).read_bytes()
    tokenizer = load_tokenizer(ckpt / "tokenizer")
    ids = tokenizer.encode("Hello, World!", add_special_tokens=True)
    assert ids[0] == 101 and ids[-1] == 102 and tokenizer.decode(ids) == "hello, world!"
    assert not (converted["gpt2"][2] / "tokenizer").exists()


def test_scan_layers_stores_stacked_params_and_round_trips(converted, tmp_path, capsys):
    model, source, _, _ = converted["llama"]
    code, out, _ = cli(capsys, "convert", "from-hf", source, tmp_path / "scan", "--scan-layers")
    assert code == 0 and "scan (stacked layers)" in out
    config, params, _ = store.load_checkpoint(tmp_path / "scan")
    assert config.scan_layers and "layer_0" not in params["decoder"]
    assert params["decoder"]["layers"]["attention"]["query"]["kernel"].shape == (2, 64, 4, 16)
    ids = jnp.zeros((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: nn.unbox(CausalLM(config).init(jax.random.key(0), ids)))["params"]
    assert jax.tree.map(np.shape, params) == jax.tree.map(lambda s: s.shape, shapes)
    looped = CausalLM(dataclasses.replace(config, scan_layers=False))
    loop_shapes = jax.eval_shape(lambda: nn.unbox(looped.init(jax.random.key(0), ids)))["params"]
    with pytest.raises(ValueError, match=r"stores its layers stacked \(model.scan_layers=true\) and this config one by "
                                         r"one \(model.scan_layers=false\): set model.scan_layers=true$"):
        restore_params(tmp_path / "scan", loop_shapes)  # train.init_from of a --scan-layers conversion, looping
    assert cli(capsys, "convert", "to-hf", tmp_path / "scan", tmp_path / "back")[0] == 0
    assert_same_tensors(model, tmp_path / "back")


def test_vocab_multiple_pads_the_tables_and_to_hf_strips_them(converted, tmp_path, capsys):
    model, source, _, _ = converted["gpt2"]
    assert cli(capsys, "convert", "from-hf", source, tmp_path / "padded", "--vocab-multiple", "128")[0] == 0
    config, params, _ = store.load_checkpoint(tmp_path / "padded")
    assert config.vocab_multiple == 128 and params["decoder"]["token"]["embedding"].shape == (config.padded_vocab_size, 64)
    assert config.padded_vocab_size % 128 == 0 and config.padded_vocab_size > config.vocab_size
    assert cli(capsys, "convert", "to-hf", tmp_path / "padded", tmp_path / "back")[0] == 0
    assert_same_tensors(model, tmp_path / "back")
    code, _, err = cli(capsys, "convert", "from-hf", source, tmp_path / "zero", "--vocab-multiple", "0")
    assert_one_error(code, err, "convert from-hf", "--vocab-multiple=0", "64 or 128")
    assert not (tmp_path / "zero").exists()


def test_converted_bert_restores_as_init_from(converted):
    _, _, ckpt, _ = converted["bert"]
    config, params, _ = store.load_checkpoint(ckpt)
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    ids = jnp.zeros((1, 4), jnp.int32)
    init = BertForPreTraining(config).init
    shapes = jax.eval_shape(lambda: nn.unbox(init(jax.random.key(0), ids, ids, ids == 0, ids)))
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), shapes["params"])
    restored = restore_params(ckpt, abstract)
    assert jax.tree.structure(restored) == jax.tree.structure(params)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_training_run_initialised_from_a_conversion_exports_the_same_weights(tmp_path, tiny_config, capsys):
    """A run with train.init_from=<converted BERT> and a zero learning rate keeps the weights; to-hf of the
    run directory gives back the original tensors."""
    model = hf_model("bert", tmp_path / "hf", vocab_size=VOCAB_SIZE, num_attention_heads=2, intermediate_size=256,
                     num_hidden_layers=TINY["model"]["num_layers"])
    assert cli(capsys, "convert", "from-hf", tmp_path / "hf", tmp_path / "init")[0] == 0
    config = tiny_config({"train": {"init_from": str(tmp_path / "init"), "steps": 1, "eval_batches": 1},
                          "optim": {"peak_lr": 0.0}})
    train(config_lib.load(config))
    output = "".join(capsys.readouterr())
    assert f"initialised from {tmp_path / 'init'}" in output and "leaving out" not in output  # the same depth
    checkpoints = tmp_path / "run" / "checkpoints"
    before = snapshot(checkpoints)
    for source, out in ((tmp_path / "run", checkpoints / "hf"), (checkpoints / "1", checkpoints / "2"),
                        (tmp_path / "run", checkpoints)):  # the folder itself: --overwrite would have deleted it
        code, _, err = cli(capsys, "convert", "to-hf", source, out, "--overwrite")
        assert_one_error(code, err, "convert to-hf", f"output {out} lies in {checkpoints}, where Orbax keeps")
    assert snapshot(checkpoints) == before
    assert cli(capsys, "convert", "to-hf", tmp_path / "run", tmp_path / "back")[0] == 0
    assert_same_tensors(model, tmp_path / "back")
    assert (tmp_path / "back" / "vocab.txt").is_file()

    sentences = ["The quick brown fox jumps over the lazy dog.", "Hello!", "Rain again today, said Mr. Darcy."]
    (tmp_path / "text.txt").write_text("\n".join(sentences) + "\n")
    assert cli(capsys, "embed", tmp_path / "run", "--input", tmp_path / "text.txt")[0] == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))  # as a user loads the export
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.bert(**batch).last_hidden_state.double().numpy()
    mask = batch["attention_mask"].numpy()[..., None]
    theirs, ours = (hidden * mask).sum(1) / mask.sum(1), np.load(tmp_path / "text.npy")
    assert ours.shape == (3, 64) and np.abs(ours - theirs).max() < 1e-5


def test_bare_encoder_exports_as_its_backbone(tmp_path, capsys):
    """all-MiniLM-L6-v2 has no pretraining heads: to-hf writes a BertModel that AutoModel loads whole."""
    assert cli(capsys, "convert", "from-hf", minilm_dir(), tmp_path / "mini")[0] == 0
    code, out, _ = cli(capsys, "convert", "to-hf", tmp_path / "mini", tmp_path / "back")
    assert code == 0 and "AutoModel.from_pretrained" in out
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["BertModel"]
    model, info = transformers.AutoModel.from_pretrained(str(tmp_path / "back"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    original = safetensors_numpy.load_file(str(minilm_dir() / "model.safetensors"))
    ours = safetensors_numpy.load_file(str(tmp_path / "back" / "model.safetensors"))
    for name, value in original.items():
        if not name.endswith(BUFFERS):
            np.testing.assert_array_equal(ours[f"bert.{name}"], value, err_msg=name)


# ---------------------------------------------------------------- bad input

def assert_one_error(code: int, err: str, command: str, *expected: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"jaxlm {command}: error: "), err
    for text in expected:
        assert text in lines[0], lines[0]


def test_from_hf_without_config_json(tmp_path, capsys, converted):
    source = tmp_path / "weights-only"
    source.mkdir()
    shutil.copy(converted["bert"][1] / "model.safetensors", source)
    code, _, err = cli(capsys, "convert", "from-hf", source, tmp_path / "out")
    assert_one_error(code, err, "convert from-hf", "no Hugging Face config.json", str(source / "config.json"))
    assert not (tmp_path / "out").exists()


def test_from_hf_unsupported_model_type_fails_before_reading_tensors(tmp_path, capsys):
    source = tmp_path / "mpnet"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "mpnet", "architectures": ["MPNetModel"]}))
    (source / "model.safetensors").write_text("not a tensor file: reading it would fail differently")
    code, _, err = cli(capsys, "convert", "from-hf", source, tmp_path / "out")
    assert_one_error(code, err, "convert from-hf", "model_type='mpnet'", "supported model types: bert, roberta",
                     "llama", "albert", "t5", "bart")
    assert not (tmp_path / "out").exists()


def test_from_hf_shapes_that_do_not_fit_config_json(tmp_path, capsys, converted):
    source = tmp_path / "bert-wrong"
    shutil.copytree(converted["bert"][1], source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an earlier conversion")
    before = snapshot(out)
    code, _, err = cli(capsys, "convert", "from-hf", source, out, "--overwrite")
    assert_one_error(code, err, "convert from-hf", "bert.encoder.layer.0.intermediate.dense.weight",
                     "(96, 64)", "(128, 64)")
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert-wrong", "out"]


def test_existing_output_is_refused_and_untouched(tmp_path, capsys, converted):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = snapshot(out)
    for args in (("from-hf", converted["gpt2"][1]), ("to-hf", converted["gpt2"][2])):
        code, _, err = cli(capsys, "convert", *args, out)
        assert_one_error(code, err, f"convert {args[0]}", f"{out} exists and is not empty", "--overwrite")
        assert snapshot(out) == before
    code, _, err = cli(capsys, "convert", "to-hf", converted["gpt2"][2], converted["gpt2"][2], "--overwrite")
    assert_one_error(code, err, "convert to-hf", "would replace the input")
    code, _, err = cli(capsys, "convert", "to-hf", converted["gpt2"][2], "/sys/gpt2")
    assert_one_error(code, err, "convert to-hf", "output /sys/gpt2: cannot write in /sys")
    assert cli(capsys, "convert", "from-hf", converted["gpt2"][1], out, "--overwrite")[0] == 0
    assert not (out / "keep.txt").exists() and store.load_checkpoint(out)[0].family == "gpt2"
    run = tmp_path / "run"  # --overwrite deleted a whole training run
    (run / "checkpoints" / "20").mkdir(parents=True)
    for args in (("from-hf", converted["gpt2"][1]), ("to-hf", converted["gpt2"][2])):
        code, _, err = cli(capsys, "convert", *args, run, "--overwrite")
        assert_one_error(code, err, f"convert {args[0]}", f"{run} is a run's directory (it holds checkpoints/), which "
                         "no output replaces, with --overwrite or without")
    assert (run / "checkpoints" / "20").is_dir()


def test_an_output_under_a_file_is_refused_before_converting(tmp_path, capsys, converted, monkeypatch):
    """The file in the way was found only when the converted output moved there, after the whole conversion."""
    afile = tmp_path / "afile"
    afile.write_text("mine")
    monkeypatch.setattr(registry, "from_hf", lambda *_, **__: pytest.fail("converted before refusing the output"))
    monkeypatch.setattr(store, "load_checkpoint", lambda *_: pytest.fail("loaded before refusing the output"))
    for args in (("from-hf", converted["gpt2"][1]), ("to-hf", converted["gpt2"][2])):
        code, _, err = cli(capsys, "convert", *args, afile / "sub" / "out")
        assert_one_error(code, err, f"convert {args[0]}", f"{afile} is a file where a directory is needed for the "
                         f"output {afile / 'sub' / 'out'}")
    assert afile.read_text() == "mine"


def test_to_hf_on_something_that_is_not_a_jaxlm_checkpoint(tmp_path, capsys, converted):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {converted["bert"][1]: ["is not a jaxlm checkpoint", "convert it first with `jaxlm convert from-hf`"],
             empty: ["is not a jaxlm checkpoint", "no Orbax checkpoint step"],
             tmp_path / "missing": ["no checkpoint directory at"]}
    for path, expected in cases.items():
        code, _, err = cli(capsys, "convert", "to-hf", path, tmp_path / "out")
        assert_one_error(code, err, "convert to-hf", str(path), *expected)
    assert not (tmp_path / "out").exists()


def test_from_hf_refuses_a_truncated_safetensors_file_and_a_binary_vocab(tmp_path, capsys, converted, monkeypatch):
    """Each named in one line, before anything is written: no output, no staging directory left beside it. A
    tokenizer.json its loader cannot read is refused before the weights are read (it was copied into the
    checkpoint, and refused by the first command that read it)."""
    cut = shutil.copytree(converted["gpt2"][1], tmp_path / "cut")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    code, _, err = cli(capsys, "convert", "from-hf", cut, tmp_path / "out")
    assert_one_error(code, err, "convert from-hf", f"{weights} could not be read as a safetensors file",
                     "truncated or damaged", "download or save the model again")
    binary = shutil.copytree(converted["bert"][1], tmp_path / "binary")
    (binary / "vocab.txt").write_bytes(bytes(range(128, 256)) * 8)
    code, _, err = cli(capsys, "convert", "from-hf", binary, tmp_path / "out")
    assert_one_error(code, err, "convert from-hf", f"{binary / 'vocab.txt'}:1: not UTF-8", "save the file as UTF-8")
    garbage = shutil.copytree(converted["bert"][1], tmp_path / "garbage")
    (garbage / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    monkeypatch.setattr(registry, "from_hf", lambda *_, **__: pytest.fail("read the weights first"))
    code, _, err = cli(capsys, "convert", "from-hf", garbage, tmp_path / "out")
    assert_one_error(code, err, "convert from-hf", f"{garbage / 'tokenizer.json'} is not a tokenizers JSON file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binary", "cut", "garbage"]


def test_from_hf_of_a_pytorch_checkpoint_without_torch_says_to_install_it(tmp_path, capsys, converted, monkeypatch):
    pytorch = shutil.copytree(converted["gpt2"][1], tmp_path / "pytorch")
    (pytorch / "model.safetensors").rename(pytorch / "pytorch_model.bin")
    monkeypatch.setitem(sys.modules, "torch", None)  # Python's way to make `import torch` raise ImportError
    code, _, err = cli(capsys, "convert", "from-hf", pytorch, tmp_path / "out")
    assert_one_error(code, err, "convert from-hf", f"{pytorch / 'pytorch_model.bin'} is a PyTorch checkpoint",
                     "install torch")
    assert not (tmp_path / "out").exists()


def damaged_copy(source, target, cut):
    """A copy of converted checkpoint `source` whose largest array data file keeps only `cut` of its bytes."""
    target = shutil.copytree(source, target)
    data = max((p for p in (target / "0" / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
               key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[:int(data.stat().st_size * cut)])
    return target


@pytest.mark.parametrize("cut", [0.5, 0.0], ids=["truncated", "emptied"])
def test_a_damaged_checkpoint_is_one_line_for_to_hf_and_generate(tmp_path, capsys, converted, cut):
    ckpt = damaged_copy(converted["gpt2"][2], tmp_path / "ckpt", cut)
    (ckpt / "tokenizer").mkdir()  # generate reads the tokenizer first; one no larger than the model's vocabulary
    (ckpt / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    expected = (f"{ckpt} step 0 could not be read: its parameters: array params.", "is not valid for value of size",
                "the checkpoint is damaged: convert or save it again")
    code, _, err = cli(capsys, "convert", "to-hf", ckpt, tmp_path / "out")
    assert_one_error(code, err, "convert to-hf", *expected)
    assert len(err.strip()) < 400 and "tensorstore_spec" not in err
    code, _, err = cli(capsys, "generate", ckpt, "--prompt", "hello", "--max-new-tokens", 2)
    assert_one_error(code, err, "generate", *expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_an_unreadable_step_metadata_file_is_one_warning(tmp_path, capsys, caplog, converted):
    """Orbax's step metadata (times) is not needed to read a step: it converts, with one warning where Orbax
    logged two ERROR lines."""
    ckpt = shutil.copytree(converted["gpt2"][2], tmp_path / "ckpt")
    metadata = ckpt / "0" / "_CHECKPOINT_METADATA"
    metadata.write_text("")
    assert cli(capsys, "convert", "to-hf", ckpt, tmp_path / "out")[0] == 0
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "_CHECKPOINT_METADATA" in r.getMessage()]
    assert said == [("WARNING", f"{metadata} cannot be read as JSON; it holds the step's times, which reading the "
                                "checkpoint does not need")]


def test_a_config_edited_to_other_sizes_is_named_before_the_model_runs(tmp_path, capsys, converted):
    """generate and embed, which read a checkpoint through load_checkpoint as to-hf does, applied the model and
    failed in Flax's ScopeParamShapeError traceback."""
    ckpt = tmp_path / "edited"
    shutil.copytree(converted["llama"][2], ckpt)
    stored = ckpt / "0" / "config" / "metadata"
    record = json.loads(stored.read_text())
    record["model"]["intermediate_size"] //= 2
    stored.write_text(json.dumps(record))
    said = f"{ckpt}: its parameters do not fit the model config stored with them"
    with pytest.raises(ValueError, match=re.escape(said)):
        store.load_checkpoint(ckpt)
    code, _, err = cli(capsys, "convert", "to-hf", ckpt, tmp_path / "back")
    assert_one_error(code, err, "convert to-hf", said, "decoder/layer_0/mlp/down/kernel is (128, 64), not (64, 64)",
                     "give the checkpoint the config it was written with")


def test_embed_refuses_decoders_missing_input_and_blank_lines(tmp_path, capsys, converted):
    text = tmp_path / "text.txt"
    text.write_text("one sentence\n\nanother\n")
    code, _, err = cli(capsys, "embed", converted["gpt2"][2], "--input", tmp_path / "nope.txt")
    assert_one_error(code, err, "embed", "input file", "nope.txt does not exist")
    code, _, err = cli(capsys, "embed", converted["gpt2"][2], "--input", text)
    assert_one_error(code, err, "embed", "blank lines (2)")
    text.write_text("one sentence\nanother\n")
    code, _, err = cli(capsys, "embed", converted["gpt2"][2], "--input", text)
    assert_one_error(code, err, "embed", "embed needs an encoder checkpoint", "holds a gpt2 model")
    code, _, err = cli(capsys, "embed", converted["bert"][3], "--input", text)
    assert_one_error(code, err, "embed", "is not a jaxlm checkpoint")
    code, _, err = cli(capsys, "embed", converted["bert"][2], "--input", text)
    assert_one_error(code, err, "embed", "has 30522 tokens but the checkpoint's model 1000",
                     "tokenizer and checkpoint do not match")
    code, _, err = cli(capsys, "embed", converted["bert"][2], "--input", text, "--max-length", 100)
    assert_one_error(code, err, "embed", "--max-length 100 must lie in [2, 64]")
    named_npy = tmp_path / "text.npy"  # whose default output is itself
    named_npy.write_text("one sentence\nanother\n")
    code, _, err = cli(capsys, "embed", converted["bert"][2], "--input", named_npy, "--overwrite")
    assert_one_error(code, err, "embed", "text.npy is the input file, which writing would replace")
    assert named_npy.read_text() == "one sentence\nanother\n"
    named_npy.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]


def test_real_cli_process_reports_errors_on_one_line(tmp_path):
    proc = run_cli("convert", "from-hf", tmp_path / "nothing", tmp_path / "out", devices=1, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"jaxlm convert from-hf: error: {tmp_path / 'nothing'}: no such file or directory, nor a packaged model "
        "(all-MiniLM-L6-v2)"]


def test_a_source_that_is_a_file_or_a_misspelt_packaged_name_is_named_as_such(tmp_path, capsys):
    """A misspelt packaged name was "no Hugging Face config.json at all-MiniLM-L6-v3/config.json", naming none of
    them; a weights file "no config.json at model.safetensors/config.json"."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    for command, source, said in (
            ("from-hf", "all-MiniLM-L6-v3", "all-MiniLM-L6-v3: no such file or directory, nor a packaged model "
                                            "(all-MiniLM-L6-v2)"),
            ("from-gguf", "smollm2-135M", "smollm2-135M: no such file or directory, nor a packaged model "
                                          "(SmolLM2-135M-Instruct)"),
            ("from-hf", weights, f"{weights} is a file; give the model's directory, which holds config.json")):
        code, _, err = cli(capsys, "convert", command, source, tmp_path / "out")
        assert_one_error(code, err, f"convert {command}", said)
    assert not (tmp_path / "out").exists()


def test_the_library_converts_a_packaged_model_by_its_name_as_the_command_does(tmp_path, monkeypatch):
    """`registry.from_hf("all-MiniLM-L6-v2")` looked for a directory of that name; the command resolved it."""
    config, params = registry.from_hf("all-MiniLM-L6-v2", dtype="float32")
    by_path, from_path = registry.from_hf(minilm_dir(), dtype="float32")
    assert config == by_path and jax.tree.all(jax.tree.map(np.array_equal, params, from_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "all-MiniLM-L6-v2").mkdir()  # a directory of that name is the user's, and read as theirs
    with pytest.raises(FileNotFoundError, match="no Hugging Face config.json at all-MiniLM-L6-v2/config.json"):
        registry.from_hf("all-MiniLM-L6-v2")
    with pytest.raises(FileNotFoundError, match=r"^smollm2: no such file or directory, nor a packaged model "
                                                r"\(SmolLM2-135M-Instruct\)$"):
        registry.from_gguf("smollm2")


@pytest.mark.parametrize("option, value, expected", [
    ("--temperature", "nan", "temperature=nan must be a number >= 0"),  # once generated token 0 over and over
    ("--seed", str(10 ** 20), f"seed={10 ** 20} must lie in [0, 2**31)"),  # an OverflowError's traceback
    ("--num-beams", str(10 ** 8), "num_beams=100000000 is too many for a vocabulary of"),  # a top_k int32 overflow
])
def test_generate_refuses_sampling_numbers_it_cannot_use(capsys, converted, option, value, expected):
    code, _, err = cli(capsys, "generate", converted["gpt2"][2], "--prompt", "hello", option, value)
    assert_one_error(code, err, "generate", expected)


@pytest.mark.parametrize("config, expected", [
    ([{"model_type": "gpt2"}], "config.json is not a JSON object of settings; give the config.json saved with the "
                               "model"),
    ({"model_type": "gpt2", "n_embd": "64"}, "config.json: n_embd='64' is a string; write the number without quotes"),
    ({"model_type": "bert", "layer_norm_eps": "1e-12"}, "config.json: layer_norm_eps='1e-12' is a string"),
    ({"model_type": "gpt2", "n_embd": None}, "config.json: a setting is not a number (unsupported operand"),
    ({"model_type": "bert", "num_hidden_layers": True}, "model.num_layers must be a number, got True"),
    ({"model_type": "gpt2", "n_embd": 64, "n_head": 4},
     "--vocab-multiple=100000000000 is larger than the vocabulary it pads (50,257 tokens); use a row multiple such as "
     "64 or 128"),
], ids=["a-list", "quoted-size", "quoted-rate", "null-size", "true-layers", "vocab-multiple"])
def test_from_hf_refuses_a_config_json_of_the_wrong_shape_before_reading_tensors(tmp_path, capsys, config, expected):
    """Each was a traceback (AttributeError, TypeError, or a MemoryError for 23 TiB of padding), or went on with
    "64" repeated as a string ("64646464") for GPT-2's inner size."""
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(config))
    (source / "model.safetensors").write_text("not a tensor file: reading it would fail differently")
    code, _, err = cli(capsys, "convert", "from-hf", source, tmp_path / "out", "--vocab-multiple", "100000000000")
    assert_one_error(code, err, "convert from-hf", expected)
    assert not (tmp_path / "out").exists()


def test_a_whole_float_size_in_config_json_becomes_an_integer():
    """n_embd=64.0 (JSON written by other tools) was kept a float, and Flax refused it as a shape mid-conversion."""
    config = {"model_type": "gpt2", "n_embd": 64.0, "n_layer": 2, "n_head": 4}
    converted = registry.family_for_hf(config).converter("config_from_hf")(config)
    assert (converted.hidden_size, converted.intermediate_size) == (64, 256)
    assert type(converted.hidden_size) is int and type(converted.intermediate_size) is int


def test_an_output_written_by_another_while_converting_is_kept(tmp_path):
    """A file put in the output directory during a conversion (or another conversion's output) was deleted when
    the staged output took its place, without --overwrite."""
    out = tmp_path / "out"
    with pytest.raises(FileExistsError, match=r"out exists and is not empty; pass --overwrite to replace it, or "
                                              r"choose another output directory \(it was written while this command "
                                              r"ran\)$"):
        with store.staged(out) as staging:
            (staging / "weights").write_text("ours")
            out.mkdir()
            (out / "notes.txt").write_text("theirs")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "notes.txt").read_text() == "theirs"
    with store.staged(out, overwrite=True) as staging:
        (staging / "weights").write_text("ours")
    assert [p.name for p in out.iterdir()] == ["weights"]


def test_an_output_written_by_another_after_the_last_check_is_kept(tmp_path, monkeypatch):
    """Another conversion's output that landed just after the last check was moved aside and deleted, without
    --overwrite (a moment later, the swap failed on it with OSError's 'Directory not empty', the staged copy left
    beside it)."""
    out, checks, check_output = tmp_path / "out", [], store.check_output

    def then_another_writes(path, overwrite=False):
        checked = check_output(path, overwrite)
        checks.append(path)
        if len(checks) == 2:
            out.mkdir()
            (out / "notes.txt").write_text("theirs")
        return checked

    monkeypatch.setattr(store, "check_output", then_another_writes)
    with pytest.raises(FileExistsError, match=r"out was written by another command while this one ran; run it "
                                              r"again, with --overwrite to replace that output, or choose another"):
        with store.staged(out) as staging:
            (staging / "weights").write_text("ours")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "notes.txt").read_text() == "theirs"


def test_a_full_disk_is_one_line_and_leaves_no_partial_output(tmp_path):
    """safetensors' "No space left on device" came out as its traceback (to-hf; Orbax's, from-hf, as three lines):
    here the kernel's own, from /dev/full."""
    out = tmp_path / "out"
    with pytest.raises(OSError, match=r"^no space left on the device to write .*out; free space or choose another "
                                      r"output directory$"):
        with store.staged(out) as staging:
            (staging / "weights").symlink_to("/dev/full")
            with open(staging / "weights", "wb") as stream:
                stream.write(bytes(1 << 16))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model_type, default", [("t5", 1), ("bart", 2), ("gpt2", -1), ("llama", -1)])
def test_an_eos_token_id_list_gives_its_first_and_an_empty_one_none(model_type, default):
    """T5's and BART's readers took eos_token_id=[] as an IndexError's traceback; the decoders' said none."""
    small = {"t5": {"d_model": 64, "d_kv": 16, "d_ff": 128, "num_heads": 4, "vocab_size": 100},
             "bart": {"d_model": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 100},
             "gpt2": {"n_embd": 64, "n_head": 4, "vocab_size": 100},
             "llama": {"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}}[model_type]

    def eos(value):
        config = {"model_type": model_type, **small, **({} if value is None else {"eos_token_id": value})}
        return registry.family_for_hf(config).converter("config_from_hf")(config).eos_token_id

    assert (eos([7, 9]), eos([]), eos(None)) == (7, -1, default)
    with pytest.raises(ValueError, match=r"^model.eos_token_id must be a number, got 'x'"):
        eos("x")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowing, as Python says it
def test_ctrl_c_that_jax_garbage_collection_hook_swallows_still_keeps_the_earlier_output(tmp_path):
    """Python's KeyboardInterrupt, raised where JAX's gc callback runs, is printed as "Exception ignored" and lost:
    the conversion went on and replaced the earlier output though Ctrl-C had been pressed."""
    import gc
    import signal

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an earlier conversion")

    def interrupt_in_gc(phase, info):
        if phase == "start":
            gc.callbacks.remove(interrupt_in_gc)
            signal.raise_signal(signal.SIGINT)

    # Ctrl-C's handler as in a terminal, even where the suite runs as a background job (SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with store.staged(out, overwrite=True) as staging:
                (staging / "new.txt").write_text("half a conversion")
                gc.callbacks.append(interrupt_in_gc)
                gc.collect()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert snapshot(out) == {pathlib.Path("keep.txt"): b"an earlier conversion"}


def test_the_readers_of_text_say_how_to_give_a_converted_checkpoint_its_tokenizer(tmp_path, capsys, converted):
    """A model converted from a directory of weights alone has no tokenizer: embed said only that, generate
    "convert it with one"; each now names the files a conversion takes it from."""
    encoder = shutil.copytree(converted["bert"][2], tmp_path / "bert")
    shutil.rmtree(encoder / store.TOKENIZER_DIR)
    decoder = converted["gpt2"][2]
    assert not (decoder / store.TOKENIZER_DIR).exists()
    (tmp_path / "lines.txt").write_text("a line of text\n")
    fix = "convert the model again from a directory that also holds its tokenizer files (tokenizer.json, vocab.txt"
    for command, args, stopped in [("embed", [encoder, "--input", tmp_path / "lines.txt", "--output",
                                              tmp_path / "e.npy"], "the sentences cannot become ids"),
                                   ("generate", [decoder, "--prompt", "Once"], "the prompts cannot become ids"),
                                   ("eval", [decoder, "--tasks", f"ppl:{tmp_path / 'lines.txt'}", "--out",
                                             tmp_path / "eval"], "text cannot become ids")]:
        code, _, err = cli(capsys, command, *args)
        assert_one_error(code, err, command, "has no tokenizer/ directory, so " + stopped, fix)
