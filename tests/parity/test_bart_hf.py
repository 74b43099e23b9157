"""Parity of jaxlm BART with Hugging Face BartForConditionalGeneration (PyTorch, CPU, fp32) through
jaxlm.convert.hf_bart: logits, both layer layouts, conversion both ways, cached decoding, bad input."""
from __future__ import annotations

import functools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hf_models import random_model, right_padded, torch_tensors  # noqa: E402
from jaxlm.convert import hf_bart  # noqa: E402
from jaxlm.models.bart import BartForConditionalGeneration, shift_tokens_right  # noqa: E402
from jaxlm.models.presets import model_config  # noqa: E402

ATOL = 1e-4
VOCAB, PAD, START = 500, 1, 2
BART = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
            pad_token_id=PAD, bos_token_id=0, eos_token_id=2, decoder_start_token_id=START, forced_eos_token_id=2)
SOURCE_LENGTHS = np.array([16, 11, 7, 13])
TARGET_LENGTH = 10
LAYOUTS = {"loop": {}, "scan": dict(scan_layers=True, remat="full")}


@pytest.fixture(scope="module")
def hf_model():
    model = random_model(transformers.BartForConditionalGeneration,
                         transformers.BartConfig(**BART, attn_implementation="eager"))
    with torch.no_grad():  # a buffer, not a parameter: the noise above leaves it at zero
        model.final_logits_bias.copy_(0.1 * torch.randn_like(model.final_logits_bias))
    return model


@pytest.fixture(scope="module")
def batch():
    """Right-padded source ids and mask, labels, and decoder inputs shifted from them."""
    rng = np.random.default_rng(0)
    ids, mask = right_padded(SOURCE_LENGTHS, VOCAB, PAD, rng, low=3)
    labels = rng.integers(3, VOCAB, size=(len(SOURCE_LENGTHS), TARGET_LENGTH))
    return ids, mask, labels, shift_tokens_right(labels, PAD, START)


def config_for(hf_model, layout: str = "loop"):
    return hf_bart.bart_config_from_hf(hf_model.config.to_dict(), dtype="float32", **LAYOUTS[layout])


def torch_logits(model, ids, mask, decoder_ids, decoder_mask=None) -> np.ndarray:
    as_torch = lambda x: None if x is None else torch.from_numpy(np.asarray(x, np.int64))
    with torch.no_grad():
        out = model(input_ids=as_torch(ids), attention_mask=as_torch(mask), decoder_input_ids=as_torch(decoder_ids),
                    decoder_attention_mask=as_torch(decoder_mask))
    return out.logits.numpy()


@functools.cache
def jitted_apply(config):
    return jax.jit(BartForConditionalGeneration(config).apply)


def our_logits(config, params, ids, mask, decoder_ids, decoder_mask=None) -> np.ndarray:
    if decoder_mask is None:
        decoder_mask = np.ones(np.shape(decoder_ids), bool)
    return np.asarray(jitted_apply(config)({"params": params}, ids, decoder_ids, mask, decoder_mask))


# ---------------------------------------------------------------- logits

@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_logits_match_transformers(hf_model, batch, layout):
    ids, mask, _, decoder_ids = batch
    config = config_for(hf_model, layout)
    params = hf_bart.bart_params_from_hf(torch_tensors(hf_model), config)
    assert ("layers" in params["decoder"]) == (layout == "scan")
    ours = our_logits(config, params, ids, mask, decoder_ids)
    theirs = torch_logits(hf_model, ids, mask, decoder_ids)
    assert ours.shape == theirs.shape == (len(ids), TARGET_LENGTH, VOCAB) and ours.dtype == np.float32
    diff = float(np.abs(ours - theirs).max())
    print(f"random BART ({layout}) logits max abs diff, right-padded sources: {diff:.3e}")
    assert diff < ATOL

    decoder_mask = np.arange(TARGET_LENGTH)[None, :] < np.array([10, 6, 8, 3])[:, None]
    ours = our_logits(config, params, ids, mask, decoder_ids, decoder_mask)
    theirs = torch_logits(hf_model, ids, mask, decoder_ids, decoder_mask)
    diff = float(np.abs(ours - theirs)[decoder_mask].max())
    print(f"random BART ({layout}) logits max abs diff, right-padded targets (real positions): {diff:.3e}")
    assert diff < ATOL


def test_shift_tokens_right_matches_transformers(batch):
    from transformers.models.bart.modeling_bart import shift_tokens_right as theirs

    labels = batch[2].copy()
    labels[:, -3:] = -100
    expected = theirs(torch.from_numpy(labels), PAD, START).numpy()
    np.testing.assert_array_equal(shift_tokens_right(labels, PAD, START), expected)
    np.testing.assert_array_equal(np.asarray(shift_tokens_right(jnp.asarray(labels), PAD, START)), expected)


# ---------------------------------------------------------------- conversion both ways

@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_round_trip_is_exact(hf_model, layout):
    config = config_for(hf_model, layout)
    tensors = torch_tensors(hf_model)
    back = hf_bart.bart_params_to_hf(hf_bart.bart_params_from_hf(tensors, config), config)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == np.float32 and np.array_equal(back[name], value), name


def test_saved_checkpoint_loads_in_transformers(hf_model, batch, tmp_path):
    ids, mask, _, decoder_ids = batch
    config = config_for(hf_model, "scan")
    params = hf_bart.bart_params_from_hf(torch_tensors(hf_model), config)
    safetensors_numpy.save_file(hf_bart.bart_params_to_hf(params, config), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_bart.bart_config_to_hf(config)))

    loaded, info = transformers.BartForConditionalGeneration.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert isinstance(transformers.AutoConfig.from_pretrained(tmp_path), transformers.BartConfig)
    theirs = torch_logits(loaded.eval(), ids, mask, decoder_ids)
    ours = our_logits(config, params, ids, mask, decoder_ids)
    diff_torch = float(np.abs(theirs - torch_logits(hf_model, ids, mask, decoder_ids)).max())
    diff = float(np.abs(ours - theirs).max())
    print(f"reloaded BART: torch vs original {diff_torch:.3e}, jaxlm vs reloaded {diff:.3e}")
    assert diff_torch == 0.0 and diff < ATOL

    reloaded_config, reloaded = hf_bart.load_hf_bart(tmp_path, dtype="float32", **LAYOUTS["scan"])
    assert reloaded_config == config
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(reloaded), jax.tree.leaves(params)))


def test_configs_convert_both_ways(hf_model):
    config = config_for(hf_model)
    assert (config.max_position_embeddings, config.position_offset, config.decoder_layers) == (66, 2, 3)
    assert hf_bart.bart_config_from_hf(hf_bart.bart_config_to_hf(config), dtype="float32") == config
    base = dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
                encoder_ffn_dim=3072, decoder_ffn_dim=3072, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
                architectures=["BartForConditionalGeneration"], model_type="bart")
    assert hf_bart.bart_config_from_hf(base) == model_config("bart-base")


# ---------------------------------------------------------------- cached decoding

@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_incremental_decoding_matches_full_decoder(hf_model, batch, layout):
    ids, mask, _, decoder_ids = batch
    config = config_for(hf_model, layout)
    params = hf_bart.bart_params_from_hf(torch_tensors(hf_model), config)
    model = BartForConditionalGeneration(config)

    @jax.jit
    def prepare():
        states = model.apply({"params": params}, ids, mask, method="encode")
        full = model.apply({"params": params}, decoder_ids, states, mask, method="decode")
        _, cache = model.apply({"params": params}, jnp.zeros((len(ids), TARGET_LENGTH + 3), jnp.int32), states, mask,
                               decode=True, method="decode", mutable=["cache"])
        return states, full, cache

    states, full, cache = prepare()

    @jax.jit
    def step(cache, token, position):
        return model.apply({"params": params, **cache}, token, states, mask, position, decode=True,
                           method="decode", mutable=["cache"])

    steps = []
    for t in range(TARGET_LENGTH):
        logits, cache = step(cache, decoder_ids[:, t:t + 1], np.full((len(ids), 1), t))
        steps.append(logits)
    diff = float(jnp.abs(jnp.concatenate(steps, axis=1) - full).max())
    print(f"BART ({layout}) cached one-token decoding vs full decoder, max abs diff: {diff:.3e}")
    assert diff < 1e-5
    with pytest.raises(ValueError, match="decoder_positions"):
        model.apply({"params": params, **cache}, decoder_ids[:, :1], states, mask, decode=True, method="decode",
                    mutable=["cache"])


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("change, message", [
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "T5ForConditionalGeneration"),
    ({"model_type": "mbart", "architectures": ["MBartForConditionalGeneration"]}, "MBartForConditionalGeneration"),
    ({"normalize_before": True, "add_final_layer_norm": True}, "normalize_before"),
    ({"add_final_layer_norm": True}, "add_final_layer_norm"),
    ({"scale_embedding": True}, "scale_embedding"),
    ({"activation_function": "relu"}, "'relu'"),
    ({"decoder_ffn_dim": 256}, "decoder_ffn_dim=256"),
])
def test_unsupported_configs_are_rejected_by_name(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        hf_bart.bart_config_from_hf({**BART, "model_type": "bart", **change})


def test_other_architecture_checkpoint_is_rejected_before_reading_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
                                                      "d_model": 64}))
    with pytest.raises(ValueError, match="'T5ForConditionalGeneration' is not a Bart model"):
        hf_bart.load_hf_bart(tmp_path)


def test_bad_tensors_are_rejected_by_name(hf_model):
    config = config_for(hf_model)
    tensors = torch_tensors(hf_model)
    dropped = "model.decoder.layers.2.encoder_attn.v_proj.bias"
    with pytest.raises(ValueError, match=r"1 missing: " + re.escape(dropped)):
        hf_bart.bart_params_from_hf({k: v for k, v in tensors.items() if k != dropped}, config)
    wrong = "model.encoder.layers.1.fc1.weight"
    with pytest.raises(ValueError, match=re.escape(wrong) + r".*expected \(128, 64\), got \(128, 32\); config.json "
                                         r"does not describe these weights: convert the directory where the model"):
        hf_bart.bart_params_from_hf({**tensors, wrong: np.zeros((128, 32), np.float32)}, config)
    with pytest.raises(ValueError, match=r"unexpected.*classification_head\.dense\.weight"):
        hf_bart.bart_params_from_hf({**tensors, "classification_head.dense.weight": np.zeros((64, 64), np.float32)},
                                    config)
    with pytest.raises(ValueError, match=r"lm_head\.weight differs from model\.shared\.weight"):
        hf_bart.bart_params_from_hf({**tensors, "lm_head.weight": tensors["lm_head.weight"] + 1.0}, config)
    with pytest.raises(ValueError, match=r"input_ids has length 70.*max_position_embeddings=66"):
        BartForConditionalGeneration(config).init(jax.random.key(0), np.ones((1, 70), np.int32),
                                                  np.ones((1, 4), np.int32))


def test_bare_model_names_load_without_head_or_bias(hf_model):
    config = config_for(hf_model)
    tensors = {k.removeprefix("model."): v for k, v in torch_tensors(hf_model).items()
               if k not in ("lm_head.weight", "final_logits_bias")}
    params = hf_bart.bart_params_from_hf(tensors, config)
    assert not params["final_logits_bias"].any()
    np.testing.assert_array_equal(params["shared"]["embedding"], tensors["shared.weight"])


# ---------------------------------------------------------------- gradient

def test_jitted_gradient_is_finite_and_descends(hf_model, batch):
    ids, mask, labels, decoder_ids = batch
    config = config_for(hf_model, "scan")
    params = hf_bart.bart_params_from_hf(torch_tensors(hf_model), config)
    model = BartForConditionalGeneration(config)

    def loss_fn(params):
        logits = model.apply({"params": params}, ids, decoder_ids, mask)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(params):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        return loss, grads, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    loss, grads, updated = step(params)
    after, _, _ = step(updated)
    print(f"BART jitted grad: loss {float(loss):.4f} -> {float(after):.4f} after one SGD step")
    assert np.isfinite(float(loss)) and all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    assert float(jnp.abs(grads["final_logits_bias"]).max()) > 0 and float(after) < float(loss)
