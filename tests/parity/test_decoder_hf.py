"""Parity of jaxlm decoders with Hugging Face GPT-2 and Llama (PyTorch, CPU, fp32) through
jaxlm.convert.hf_decoder, and a sharded gradient through each on the 8 simulated devices."""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import DECODERS, GPT2, LLAMA, VOCAB, torch_tensors  # noqa: E402
from jaxlm import families  # noqa: E402
from jaxlm.convert import hf_decoder, registry  # noqa: E402
from jaxlm.models import CausalLM, model_config  # noqa: E402
from jaxlm.parallel.rules import rules_for  # noqa: E402

ATOL = 1e-4


@pytest.fixture(scope="module", params=sorted(DECODERS))
def family(request):
    decoder = DECODERS[request.param]
    model = decoder.random_model(noise=0.05)
    config = decoder.config_from_hf(model.config.to_dict(), dtype="float32")
    return request.param, model, config, decoder.params_from_hf, decoder.params_to_hf


def random_ids(batch=4, length=16, seed=0):
    return np.random.default_rng(seed).integers(1, VOCAB, size=(batch, length))


def torch_logits(model, ids, mask=None) -> np.ndarray:
    with torch.no_grad():
        mask = None if mask is None else torch.from_numpy(mask.astype(np.int64))
        return model(input_ids=torch.from_numpy(ids), attention_mask=mask).logits.numpy()


def test_logits_match_transformers(family):
    name, model, config, from_hf, _ = family
    params = from_hf(torch_tensors(model), config)
    ids = random_ids()
    ours = np.asarray(CausalLM(config).apply({"params": params}, jnp.asarray(ids)))
    diff = np.abs(ours - torch_logits(model, ids)).max()
    print(f"random {name} logits max abs diff: {diff:.3e}")
    assert diff < ATOL


def test_right_padded_batch_matches_on_real_tokens(family):
    name, model, config, from_hf, _ = family
    params = from_hf(torch_tensors(model), config)
    ids, lengths = random_ids(seed=1), np.array([16, 9, 4, 12])
    mask = np.arange(16)[None, :] < lengths[:, None]
    ours = np.asarray(CausalLM(config).apply({"params": params}, jnp.asarray(ids), padding_mask=jnp.asarray(mask)))
    diff = np.abs(ours - torch_logits(model, ids, mask))[mask].max()
    print(f"random {name} right-padded logits max abs diff: {diff:.3e}")
    assert diff < ATOL


def test_packed_documents_match_each_document_alone(family):
    name, model, config, from_hf, _ = family
    params = from_hf(torch_tensors(model), config)
    ids = random_ids(batch=1, length=16, seed=2)
    segments = np.repeat([[0, 1, 2]], [6, 7, 3], axis=1)
    ours = np.asarray(CausalLM(config).apply({"params": params}, jnp.asarray(ids), segment_ids=jnp.asarray(segments)))
    theirs = np.concatenate([torch_logits(model, ids[:, segments[0] == s]) for s in range(3)], axis=1)
    diff = np.abs(ours - theirs).max()
    print(f"random {name} packed-document logits max abs diff: {diff:.3e}")
    assert diff < ATOL


def test_cross_document_attention_reads_a_packed_row_as_one_sequence(family):
    """model.cross_document_attention: a packed row as GPT-2 trained on it, Hugging Face's logits for the whole row,
    padding still kept out."""
    name, model, config, from_hf, _ = family
    config = dataclasses.replace(config, cross_document_attention=True)
    params = from_hf(torch_tensors(model), config)
    ids = random_ids(batch=1, length=16, seed=2)
    segments = np.repeat([[1, 2, 3, 0]], [6, 5, 3, 2], axis=1)
    ours = np.asarray(CausalLM(config).apply({"params": params}, jnp.asarray(ids), segment_ids=jnp.asarray(segments),
                                             padding_mask=jnp.asarray(segments > 0)))
    real = segments > 0
    diff = np.abs(ours - torch_logits(model, ids, real))[real].max()
    print(f"random {name} cross-document logits max abs diff: {diff:.3e}")
    assert diff < ATOL


def test_round_trip_is_exact(family):
    _, model, config, from_hf, to_hf = family
    tensors = torch_tensors(model)
    back = to_hf(from_hf(tensors, config), config)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == np.float32 and np.array_equal(back[name], value), name
    type(model)(model.config).load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


def test_saved_checkpoint_loads_by_model_type(family, tmp_path):
    _, model, config, _, _ = family
    model.save_pretrained(tmp_path)
    loaded_config, params = hf_decoder.load_hf_decoder(tmp_path, dtype="float32")
    assert loaded_config == config
    ids = random_ids(batch=2, length=8, seed=3)
    ours = np.asarray(CausalLM(config).apply({"params": params}, jnp.asarray(ids)))
    assert np.abs(ours - torch_logits(model, ids)).max() < ATOL


# ---------------------------------------------------------------- bad input

WRONG = {
    "gpt2": ("transformer.h.1.attn.c_attn.weight", r"transformer\.h\.1\.attn\.c_attn\.weight.*\(64, 192\).*\(64, 96\)"),
    "llama": ("model.layers.1.self_attn.k_proj.weight", r"layers\.1\.self_attn\.k_proj\.weight.*\(32, 64\).*\(64, 64\)"),
}


def test_wrong_shape_is_rejected_naming_the_parameter(family):
    name, model, config, from_hf, _ = family
    tensors = torch_tensors(model)
    tensor, message = WRONG[name]
    tensors[tensor] = np.zeros((64, 96) if name == "gpt2" else (64, 64), np.float32)
    with pytest.raises(ValueError, match=message):
        from_hf(tensors, config)


def test_unknown_and_missing_tensors_are_rejected(family):
    _, model, config, from_hf, _ = family
    tensors = torch_tensors(model)
    with pytest.raises(ValueError, match="score.weight"):
        from_hf({**tensors, "score.weight": np.zeros((2, 64), np.float32)}, config)
    dropped = next(k for k in tensors if ".mlp." in k)
    with pytest.raises(ValueError, match=dropped.replace(".", r"\.")):
        from_hf({k: v for k, v in tensors.items() if k != dropped}, config)


def test_unsupported_configs_are_rejected_by_name():
    with pytest.raises(ValueError, match="LlamaForCausalLM.*not a GPT2 model"):
        hf_decoder.gpt2_config_from_hf({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    with pytest.raises(ValueError, match="'gelu'"):
        hf_decoder.gpt2_config_from_hf({**GPT2, "model_type": "gpt2", "activation_function": "gelu"})
    with pytest.raises(ValueError, match="'llama3'"):
        hf_decoder.llama_config_from_hf({**LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}})


# ---------------------------------------------------------------- sharded gradient

@pytest.mark.parametrize("preset", ["gpt2-small", "llama-tiny"])
def test_jitted_grad_on_eight_devices_is_finite_and_descends(preset):
    config = model_config(preset, vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4,
                          intermediate_size=128, max_position_embeddings=64)
    model, rules = CausalLM(config), rules_for("fsdp_tp")
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
    ids = jnp.asarray(random_ids(batch=8, length=32, seed=4), jnp.int32)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), ids[:1]))
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
        variables = jax.jit(lambda: model.init(jax.random.key(0), ids[:1]), out_shardings=shardings)()
        params = nn.unbox(variables)["params"]
        ids = jax.device_put(ids, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))

        def loss_fn(params, ids, rng):
            logits = model.apply({"params": params}, ids, deterministic=False, rngs={"dropout": rng})
            return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:]).mean()

        @jax.jit
        def step(params, ids):
            loss, grads = jax.value_and_grad(loss_fn)(params, ids, jax.random.key(1))
            return loss, grads, jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)

        loss, grads, updated = step(params, ids)
        after, _, _ = step(updated, ids)
    assert np.isfinite(float(loss)) and abs(float(loss) - np.log(VOCAB)) < 1.0
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))
    assert float(after) < float(loss)
    kernel = params["decoder"]["layer_0"]["attention"]["query"]["kernel"]
    assert tuple(kernel.sharding.spec)[:2] == ("fsdp", "tensor")


def test_an_import_with_padded_tables_gives_the_same_logits_and_exports_the_same_tensors(family, tmp_path):
    name, model, _, _, _ = family
    model.save_pretrained(tmp_path)
    config, params = registry.from_hf(tmp_path, vocab_multiple=128, dtype="float32")
    assert config.vocab_size == VOCAB and config.padded_vocab_size == 1024
    ids = random_ids(seed=2)
    ours = np.asarray(CausalLM(config).apply({"params": params}, jnp.asarray(ids)))
    assert ours.shape[-1] == VOCAB and np.abs(ours - torch_logits(model, ids)).max() < ATOL
    _, tensors, _ = registry.to_hf(config, params)
    source = torch_tensors(model)
    assert len(tensors.keys() & source.keys()) > 10
    for tensor_name in tensors.keys() & source.keys():
        np.testing.assert_array_equal(tensors[tensor_name], source[tensor_name], err_msg=f"{name} {tensor_name}")


@pytest.mark.parametrize("eos", [-1, 7])
@pytest.mark.parametrize("preset", ["gpt2-small", "llama-tiny"])
def test_an_exported_config_names_its_own_end_of_text_or_none(preset, eos, tmp_path, caplog):
    """A 1000-token decoder without an end-of-text id was exported with none written, and transformers took its own
    default (GPT-2's 50256, outside this vocabulary: a warning, and generation stopping on no token); GPT-2 begins
    text with its end-of-text token too."""
    import json
    config = model_config(preset, vocab_size=1000, eos_token_id=eos)
    hf_config = families.get(config.family).converter("config_to_hf")(config)
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    loaded = transformers.AutoConfig.from_pretrained(tmp_path)
    expected = None if eos < 0 else eos
    assert loaded.eos_token_id == expected and "outside" not in caplog.text and "within the vocabulary" not in caplog.text
    # GPT-2 begins text with its end-of-text token; our Llama rows begin with none (transformers' default was 1)
    assert loaded.bos_token_id == (expected if preset == "gpt2-small" else None)


def test_a_llama_keeps_its_beginning_of_text_id_from_hf_to_hf():
    """A Llama converted from transformers and back lost its bos_token_id: transformers then took its default, 1."""
    hf_config = {**LLAMA, "bos_token_id": 5, "eos_token_id": 6}
    config = hf_decoder.llama_config_from_hf(hf_config)
    assert (config.bos_token_id, config.eos_token_id) == (5, 6)
    assert hf_decoder.llama_config_to_hf(config)["bos_token_id"] == 5
    assert hf_decoder.llama_config_from_hf({**hf_config, "bos_token_id": None}).bos_token_id == -1
