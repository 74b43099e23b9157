"""Parity of jaxlm ALBERT with Hugging Face AlbertForPreTraining (PyTorch, CPU, fp32) via jaxlm.convert.hf_albert."""
from __future__ import annotations

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hf_models import random_model, right_padded, torch_tensors  # noqa: E402
from jaxlm.convert import hf_albert as alb  # noqa: E402
from jaxlm.convert.layout import stack_layers  # noqa: E402
from jaxlm.models.albert import AlbertEncoder, AlbertForPreTraining  # noqa: E402
from jaxlm.parallel.rules import LOGICAL_AXES  # noqa: E402

ATOL = 1e-4
LENGTHS = np.array([16, 11, 7, 13])
SMALL = dict(vocab_size=500, embedding_size=32, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu_new")
POSITIONS = np.array([[0, 3, 15], [1, 5, 10], [2, 4, 6], [0, 7, 12]])


@pytest.fixture(scope="module")
def albert():
    return random_model(transformers.AlbertForPreTraining,
                        transformers.AlbertConfig(**SMALL, attn_implementation="eager"), noise_seed=1)


@pytest.fixture(scope="module")
def converted(albert):
    config = alb.albert_config_from_hf(albert.config.to_dict(), dtype="float32")
    return config, alb.albert_params_from_hf(torch_tensors(albert), config, require_heads=True)


def padded_batch():
    """Right-padded ids (0 in the padding), two token types per row, and the real-token mask."""
    ids, mask = right_padded(LENGTHS, SMALL["vocab_size"], 0, np.random.default_rng(0), low=5)
    segments = ((np.arange(16)[None, :] >= LENGTHS[:, None] // 2) & mask).astype(np.int64)
    return ids, segments, mask


def theirs(model):
    ids, segments, mask = padded_batch()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                    attention_mask=torch.from_numpy(mask.astype(np.int64)))
    return np.take_along_axis(out.prediction_logits.numpy(), POSITIONS[..., None], axis=1), out.sop_logits.numpy()


def ours(config, params):
    ids, segments, mask = padded_batch()
    mlm, sop = AlbertForPreTraining(config).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask), jnp.asarray(POSITIONS))
    assert mlm.dtype == sop.dtype == jnp.float32
    return np.asarray(mlm), np.asarray(sop)


def _diffs(model, config, params, name: str) -> tuple[float, float]:
    (their_mlm, their_sop), (our_mlm, our_sop) = theirs(model), ours(config, params)
    assert our_mlm.shape == their_mlm.shape == (4, 3, SMALL["vocab_size"]) and our_sop.shape == (4, 2)
    mlm, sop = float(np.abs(our_mlm - their_mlm).max()), float(np.abs(our_sop - their_sop).max())
    print(f"random AlbertForPreTraining ({name}) max abs diff: MLM logits {mlm:.3e}, SOP logits {sop:.3e}")
    return mlm, sop


# ---------------------------------------------------------------- parity

def test_pretraining_logits_match_transformers(albert, converted):
    config, params = converted
    assert (config.embedding_size, config.activation, config.num_layers) == (32, "gelu_tanh", 3)
    assert "layer_0" not in params["encoder"]
    assert params["encoder"]["embeddings"]["word"]["embedding"].shape == (500, 32)
    assert max(_diffs(albert, config, params, "loop")) < ATOL


@pytest.mark.parametrize("remat, scan", [("full", False), ("full", True), ("dots", True)])
def test_remat_and_scan_keep_the_tree_and_the_logits(albert, converted, remat, scan):
    config, params = converted
    variant = dataclasses.replace(config, remat=remat, scan_layers=scan)
    ids = jnp.zeros((1, 4), jnp.int32)
    tree = lambda c: jax.tree.map(lambda x: x.shape, jax.eval_shape(
        lambda: nn.unbox(AlbertForPreTraining(c).init(jax.random.PRNGKey(0), ids, ids, ids == 0, ids))))
    assert tree(variant) == tree(config)
    layout = stack_layers(params) if scan else params  # what jaxlm.convert.registry.scan_layout hands over
    assert max(_diffs(albert, variant, layout, f"remat={remat}, scan_layers={scan}")) < ATOL


def test_every_parameter_has_logical_axis_names():
    config = alb.albert_config_from_hf(SMALL)
    ids = jnp.zeros((1, 4), jnp.int32)
    boxed = jax.eval_shape(AlbertForPreTraining(config).init, jax.random.PRNGKey(0), ids, ids, ids == 0, ids)
    leaves = jax.tree.leaves(boxed["params"], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert all(isinstance(leaf, nn.LogicallyPartitioned) and len(leaf.names) == leaf.value.ndim
               and set(leaf.names) <= set(LOGICAL_AXES) for leaf in leaves)
    specs = nn.get_partition_spec(boxed)["params"]
    assert tuple(specs["encoder"]["embeddings"]["word"]["embedding"]) == ("vocab", "factor")
    assert tuple(specs["encoder"]["embeddings"]["norm"]["scale"]) == ("factor",)
    assert tuple(specs["encoder"]["projection"]["kernel"]) == ("factor", "embed")
    assert tuple(specs["mlm"]["norm"]["scale"]) == ("factor",)


def test_encoder_without_heads_matches_albert_model(albert):
    """An AlbertModel state dict (no `albert.` prefix, no heads) loads; the pooler matches HF's."""
    base = {k.removeprefix("albert."): v for k, v in torch_tensors(albert).items() if k.startswith("albert.")}
    config = alb.albert_config_from_hf(albert.config.to_dict(), dtype="float32")
    params = alb.albert_params_from_hf(base, config)
    assert set(params) == {"encoder"} and "pooler" in params["encoder"]
    with pytest.raises(ValueError, match="no mlm or sop head"):
        alb.albert_params_from_hf(base, config, require_heads=True)
    ids, segments, mask = padded_batch()
    with torch.no_grad():
        out = albert.albert(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                            attention_mask=torch.from_numpy(mask.astype(np.int64)))
    hidden, pooled = AlbertEncoder(config).apply({"params": params["encoder"]}, jnp.asarray(ids),
                                                 jnp.asarray(segments), jnp.asarray(mask))
    assert np.abs(np.asarray(hidden) - out.last_hidden_state.numpy())[mask].max() < ATOL
    assert np.abs(np.asarray(pooled) - out.pooler_output.numpy()).max() < ATOL


# ---------------------------------------------------------------- round trips

def test_round_trip_is_exact(albert, converted):
    config, params = converted
    tensors, back = torch_tensors(albert), alb.albert_params_to_hf(params, config)
    compared = {k for k in tensors if k not in alb.TIED and not k.endswith(("position_ids", "token_type_ids"))}
    assert compared <= set(back) and set(back) - compared == set(alb.TIED)
    for name in compared:
        assert back[name].dtype == np.float32 and np.array_equal(back[name], tensors[name]), name
    for copy, source in alb.TIED.items():
        np.testing.assert_array_equal(back[copy], tensors[source])


def test_to_hf_loads_in_transformers_with_the_same_logits(albert, converted, tmp_path):
    config, params = converted
    hf_config = alb.albert_config_to_hf(config)
    assert alb.albert_config_from_hf(hf_config, dtype="float32") == config
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    safetensors_numpy.save_file(alb.albert_params_to_hf(params, config), str(tmp_path / "model.safetensors"),
                                metadata={"format": "pt"})
    reloaded, info = transformers.AlbertForPreTraining.from_pretrained(
        str(tmp_path), output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    reloaded.eval()
    (mlm, sop), (ref_mlm, ref_sop) = theirs(reloaded), theirs(albert)
    assert np.array_equal(mlm, ref_mlm) and np.array_equal(sop, ref_sop)


# ---------------------------------------------------------------- bad input

def test_other_architecture_is_rejected_by_name():
    with pytest.raises(ValueError, match="BertForPreTraining"):
        alb.albert_config_from_hf({**SMALL, "architectures": ["BertForPreTraining"], "model_type": "bert"})
    with pytest.raises(ValueError, match="hidden_act='swish'"):
        alb.albert_config_from_hf({**SMALL, "hidden_act": "swish"})


@pytest.mark.parametrize("key", ["num_hidden_groups", "inner_group_num"])
def test_layer_groups_are_rejected_by_name(key):
    with pytest.raises(ValueError, match=f"{key}=2"):
        alb.albert_config_from_hf({**SMALL, key: 2})


def test_missing_wrong_shaped_and_unknown_tensors_are_rejected_by_name(albert, converted):
    config, _ = converted
    tensors = torch_tensors(albert)
    name = "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight"
    with pytest.raises(ValueError, match=rf"{name}.*\(128, 64\).*\(128, 32\)"):
        alb.albert_params_from_hf({**tensors, name: np.zeros((128, 32), np.float32)}, config)
    projection = "albert.encoder.embedding_hidden_mapping_in.weight"
    with pytest.raises(ValueError, match=projection):
        alb.albert_params_from_hf({k: v for k, v in tensors.items() if k != projection}, config)
    with pytest.raises(ValueError, match="sop_classifier.classifier.bias"):
        alb.albert_params_from_hf({k: v for k, v in tensors.items() if k != "sop_classifier.classifier.bias"},
                                  config)
    with pytest.raises(ValueError, match="albert_layer_groups.1.albert_layers.0.ffn.weight"):
        alb.albert_params_from_hf({**tensors, name.replace("groups.0", "groups.1"): tensors[name]}, config)
    with pytest.raises(ValueError, match="predictions.decoder.bias differs"):
        alb.albert_params_from_hf({**tensors, "predictions.decoder.bias": tensors["predictions.bias"] + 1}, config)


# ---------------------------------------------------------------- gradient

def test_jitted_gradient_is_finite(converted):
    config, params = converted
    config = dataclasses.replace(config, hidden_dropout=0.1, attention_dropout=0.1, remat="full")
    ids, segments, mask = (jnp.asarray(a) for a in padded_batch())
    model = AlbertForPreTraining(config)

    def loss(p):
        mlm, sop = model.apply({"params": p}, ids, segments, mask, jnp.asarray(POSITIONS), deterministic=False,
                               rngs={"dropout": jax.random.PRNGKey(3)})
        targets = jnp.take_along_axis(ids, jnp.asarray(POSITIONS), axis=1)
        mlm_loss = -jnp.take_along_axis(jax.nn.log_softmax(mlm), targets[..., None], axis=-1).mean()
        return mlm_loss - jax.nn.log_softmax(sop)[:, 0].mean()

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    leaves = jax.tree.leaves(grads)
    assert np.isfinite(float(value)) and all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert float(jnp.abs(grads["encoder"]["layer"]["mlp"]["intermediate"]["kernel"]).max()) > 0
