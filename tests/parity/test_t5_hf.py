"""Parity of jaxlm T5 v1.0/v1.1 with Hugging Face T5ForConditionalGeneration, through jaxlm.convert.hf_t5."""
from __future__ import annotations

import dataclasses
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hf_models import random_model, right_padded, torch_tensors  # noqa: E402
from jaxlm.convert import hf_t5  # noqa: E402
from jaxlm.models import model_config  # noqa: E402
from jaxlm.models.t5 import T5ForConditionalGeneration, relative_position_bucket  # noqa: E402

ATOL = 1e-4
VOCAB = 500
SMALL = dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=3,
             relative_attention_num_buckets=16, relative_attention_max_distance=20, dropout_rate=0.1,
             pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
VARIANTS = {  # name: (feed_forward_proj, tie_word_embeddings, num_heads, scan_layers for cached decoding)
    "v1.0-h4": ("relu", True, 4, False),
    "v1.1-h4": ("gated-gelu", False, 4, False),
    "v1.1-h3": ("gated-gelu", False, 3, True),
}
LENGTHS = np.array([14, 9, 3, 11])  # encoder tokens per row, right-padded to 14
DEC_LENGTHS = np.array([10, 6, 10, 2])  # decoder tokens per row, right-padded to 10


def own_head(model):
    """transformers always ties lm_head to shared; a v1.1 checkpoint has its own (fan-in scaled) head."""
    model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach() * SMALL["d_model"] ** -0.5)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request):
    projection, tied, heads, _ = VARIANTS[request.param]
    hf_config = transformers.T5Config(**SMALL, num_heads=heads, feed_forward_proj=projection,
                                      tie_word_embeddings=tied, attn_implementation="eager")
    model = random_model(transformers.T5ForConditionalGeneration, hf_config, before_noise=None if tied else own_head)
    config = hf_t5.t5_config_from_hf(model.config.to_dict(), dtype="float32")
    assert config.tie_embeddings == tied and config.head_dim * config.num_heads == 16 * heads
    return request.param, model, config


def batch(seed=0):
    rng = np.random.default_rng(seed)
    ids, enc_mask = right_padded(LENGTHS, VOCAB, 0, rng, low=2)
    dec, dec_mask = right_padded(DEC_LENGTHS, VOCAB, 0, rng, low=2)
    dec[:, 0] = 0
    return ids, enc_mask, dec, dec_mask


def torch_logits(model, ids, mask, dec, dec_mask) -> np.ndarray:
    def t(x):
        return torch.from_numpy(np.asarray(x, np.int64))

    with torch.no_grad():
        return model(input_ids=t(ids), attention_mask=t(mask), decoder_input_ids=t(dec),
                     decoder_attention_mask=t(dec_mask)).logits.numpy()


def our_logits(config, params, ids, mask, dec, dec_mask) -> np.ndarray:
    return np.asarray(jitted_apply(config)({"params": params}, *map(jnp.asarray, (ids, dec, mask, dec_mask))))


@functools.lru_cache
def jitted_apply(config):
    return jax.jit(T5ForConditionalGeneration(config).apply)


def test_relative_position_buckets_match_transformers():
    relative = np.arange(-300, 301)[None, :]
    attention = transformers.models.t5.modeling_t5.T5Attention
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (16, 20), (8, 8)):
            ours = np.asarray(relative_position_bucket(jnp.asarray(relative), bidirectional, buckets, distance))
            theirs = attention._relative_position_bucket(torch.from_numpy(relative), bidirectional, buckets, distance)
            np.testing.assert_array_equal(ours, theirs.numpy())


@pytest.mark.parametrize("layout", ["loop", "scan_remat"])
def test_padded_logits_match_transformers(variant, layout):
    name, model, config = variant
    if layout == "scan_remat":
        config = dataclasses.replace(config, scan_layers=True, remat="full")
    params = hf_t5.t5_params_from_hf(torch_tensors(model), config)
    assert ("layers" in params["encoder"]) == ("layers" in params["decoder"]) == config.scan_layers
    ids, mask, dec, dec_mask = batch()
    ours = our_logits(config, params, ids, mask, dec, dec_mask)
    diff = np.abs(ours - torch_logits(model, ids, mask, dec, dec_mask))[dec_mask].max()
    print(f"T5 {name} {layout} padded logits max abs diff: {diff:.3e}")
    assert diff < ATOL


@pytest.mark.parametrize("scan", [False, True])
def test_round_trip_is_exact(variant, scan):
    _, model, config = variant
    config = dataclasses.replace(config, scan_layers=scan)
    tensors = torch_tensors(model)
    assert {"lm_head.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"} <= set(tensors)
    back = hf_t5.t5_params_to_hf(hf_t5.t5_params_from_hf(tensors, config), config)
    assert set(back) == set(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == np.float32 and np.array_equal(back[key], value), key


def test_saved_checkpoint_loads_in_transformers(variant, tmp_path):
    name, model, config = variant
    params = hf_t5.t5_params_from_hf(torch_tensors(model), config)
    safetensors_numpy.save_file(hf_t5.t5_params_to_hf(params, config), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_t5.t5_config_to_hf(config)))
    assert hf_t5.t5_config_from_hf(transformers.AutoConfig.from_pretrained(tmp_path).to_dict(),
                                   dtype="float32") == config
    loaded, info = transformers.T5ForConditionalGeneration.from_pretrained(
        tmp_path, output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids, mask, dec, dec_mask = batch(seed=1)
    ours = our_logits(config, params, ids, mask, dec, dec_mask)
    diff = np.abs(ours - torch_logits(loaded.eval(), ids, mask, dec, dec_mask))[dec_mask].max()
    print(f"T5 {name} saved-and-reloaded logits max abs diff: {diff:.3e}")
    assert diff < ATOL


def test_cached_decoding_matches_full_decoder(variant):
    name, model, config = variant
    scan = VARIANTS[name][3]
    config = dataclasses.replace(config, scan_layers=scan)
    params = hf_t5.t5_params_from_hf(torch_tensors(model), config)
    net = T5ForConditionalGeneration(config)
    ids, mask, dec, _ = batch(seed=2)
    ids, mask, dec = map(jnp.asarray, (ids, mask, dec))
    batch_size, length = dec.shape

    @jax.jit
    def start():
        states = net.apply({"params": params}, ids, mask, method="encode")
        full = net.apply({"params": params}, dec, states, mask, method="decode")
        _, variables = net.apply({"params": params}, jnp.zeros((batch_size, length + 3), jnp.int32), states, mask,
                                 decode=True, method="decode", mutable=["cache"])
        return states, full, variables

    states, full, variables = start()

    @jax.jit
    def step(cache, tokens, positions):
        return net.apply({"params": params, "cache": cache}, tokens, states, mask, decoder_positions=positions,
                         decode=True, method="decode", mutable=["cache"])

    cache, pieces = variables["cache"], []
    for start, stop in [(0, 3)] + [(t, t + 1) for t in range(3, length)]:  # a 3-token prefill, then one by one
        positions = jnp.broadcast_to(jnp.arange(start, stop), (batch_size, stop - start))
        logits, variables = step(cache, dec[:, start:stop], positions)
        cache = variables["cache"]
        pieces.append(np.asarray(logits))
    diff = np.abs(np.concatenate(pieces, axis=1) - full).max()
    print(f"T5 {name} {'scan' if scan else 'loop'} cached vs full decoder logits max abs diff: {diff:.3e}")
    assert diff < 1e-5


def test_jitted_grad_is_finite():
    config = model_config("t5-small", vocab_size=VOCAB, hidden_size=64, num_layers=2, num_decoder_layers=3,
                          num_heads=3, head_size=16, intermediate_size=128, activation="geglu", tie_embeddings=False,
                          dtype="float32", scan_layers=True, remat="full")
    net = T5ForConditionalGeneration(config)
    ids, mask, dec, dec_mask = map(jnp.asarray, batch(seed=3))
    params = jax.jit(lambda: nn.unbox(net.init(jax.random.key(0, impl="rbg"), ids[:1], dec[:1]))["params"])()

    @jax.jit
    def loss_and_grad(params):
        def loss_fn(params):
            logits = net.apply({"params": params}, ids, dec, mask, dec_mask, deterministic=False,
                               rngs={"dropout": jax.random.key(1, impl="rbg")})  # rbg: threefry compiles slowly
            losses = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], dec[:, 1:])
            return (losses * dec_mask[:, 1:]).sum() / dec_mask[:, 1:].sum()
        return jax.value_and_grad(loss_fn)(params)

    loss, grads = loss_and_grad(params)
    assert np.isfinite(float(loss))
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    for stack in ("encoder", "decoder"):
        assert float(jnp.abs(grads[stack]["relative_bias"]["embedding"]).sum()) > 0


# ---------------------------------------------------------------- bad input

def test_other_architectures_and_projections_are_rejected_by_name():
    with pytest.raises(ValueError, match="BartForConditionalGeneration"):
        hf_t5.t5_config_from_hf({"model_type": "bart", "architectures": ["BartForConditionalGeneration"]})
    with pytest.raises(ValueError, match="'mt5'"):
        hf_t5.t5_config_from_hf({**SMALL, "model_type": "mt5"})
    with pytest.raises(ValueError, match="'gated-silu'"):
        hf_t5.t5_config_from_hf({**SMALL, "model_type": "t5", "feed_forward_proj": "gated-silu"})


def test_missing_unknown_and_misshapen_tensors_are_rejected_by_name(variant):
    _, model, config = variant
    tensors = torch_tensors(model)
    dropped = "decoder.block.1.layer.1.EncDecAttention.k.weight"
    with pytest.raises(ValueError, match=dropped.replace(".", r"\.")):
        hf_t5.t5_params_from_hf({k: v for k, v in tensors.items() if k != dropped}, config)
    with pytest.raises(ValueError, match=r"classifier\.weight"):
        hf_t5.t5_params_from_hf({**tensors, "classifier.weight": np.zeros((2, 64), np.float32)}, config)
    inner = config.num_heads * config.head_dim
    wrong = "encoder.block.0.layer.0.SelfAttention.q.weight"
    with pytest.raises(ValueError, match=rf"{wrong.replace('.', '[.]')}.*\({inner}, 64\).*\(32, 64\)"):
        hf_t5.t5_params_from_hf({**tensors, wrong: np.zeros((32, 64), np.float32)}, config)


def test_embedding_copies_must_agree(variant):
    _, model, config = variant
    tensors = torch_tensors(model)
    changed = {**tensors, "decoder.embed_tokens.weight": tensors["shared.weight"] + 1}
    with pytest.raises(ValueError, match=r"decoder\.embed_tokens\.weight differs"):
        hf_t5.t5_params_from_hf(changed, config)
    headless = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    params = hf_t5.t5_params_from_hf(headless, config)  # transformers ties a missing head to shared
    if not config.tie_embeddings:
        np.testing.assert_array_equal(params["lm_head"], tensors["shared.weight"].T)
        with pytest.raises(ValueError, match=r"lm_head\.weight differs"):
            hf_t5.t5_params_from_hf(tensors, dataclasses.replace(config, tie_embeddings=True))
