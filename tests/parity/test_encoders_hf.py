"""Parity of jaxlm RoBERTa and DistilBERT (MaskedLM on the BERT encoder) with Hugging Face
(PyTorch, CPU, fp32) through jaxlm.convert.hf_encoders."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import Family, right_padded, torch_tensors  # noqa: E402
from jaxlm.convert import hf_encoders as enc  # noqa: E402
from jaxlm.models import MaskedLM, model_config  # noqa: E402
from jaxlm.nn.embed import learned_positions  # noqa: E402

ATOL = 1e-4
LENGTHS = np.array([16, 11, 7, 13])
ROBERTA = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               max_position_embeddings=66, type_vocab_size=1, hidden_act="gelu", layer_norm_eps=1e-5,
               pad_token_id=1, bos_token_id=0, eos_token_id=2)
DISTILBERT = dict(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64,
                  activation="gelu", pad_token_id=0)
FAMILIES = {
    "roberta": Family("RobertaForMaskedLM", "RobertaConfig", ROBERTA, enc.roberta_config_from_hf,
                      enc.roberta_params_from_hf, enc.roberta_params_to_hf),
    "distilbert": Family("DistilBertForMaskedLM", "DistilBertConfig", DISTILBERT, enc.distilbert_config_from_hf,
                         enc.distilbert_params_from_hf, enc.distilbert_params_to_hf),
}
# family -> (its tied copies, config fields its small config gives, a misshapen tensor and the error it raises)
EXPECTED = {
    "roberta": (enc.ROBERTA_TIED, dict(position_offset=2, pad_token_id=1, type_vocab_size=1),
                ("roberta.encoder.layer.1.attention.self.query.weight", (64, 32),
                 r"layer\.1\.attention\.self\.query\.weight.*\(64, 64\).*\(64, 32\)")),
    "distilbert": (enc.DISTILBERT_TIED, dict(type_vocab_size=0, num_layers=2),
                   ("distilbert.transformer.layer.0.ffn.lin1.weight", (128, 32),
                    r"layer\.0\.ffn\.lin1\.weight.*\(128, 64\).*\(128, 32\)")),
}


def padded_batch(pad: int):
    """Right-padded ids (pad id in the padding, never among the real tokens) and the real-token mask."""
    return right_padded(LENGTHS, 1000, pad, np.random.default_rng(0), low=5)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def encoder(request):
    """(name, family, random transformers model, our config for it)."""
    family = FAMILIES[request.param]
    model = family.random_model(noise_seed=1)
    return request.param, family, model, family.config_from_hf(model.config.to_dict(), dtype="float32")


# ---------------------------------------------------------------- RoBERTa and DistilBERT

def test_mlm_logits_match_transformers(encoder):
    name, family, model, config = encoder
    expected = EXPECTED[name][1]
    assert {field: getattr(config, field) for field in expected} == expected
    params = family.params_from_hf(torch_tensors(model), config, require_head=True)
    assert ("token_type" in params["encoder"]["embeddings"]) == (config.type_vocab_size > 0)
    assert "pooler" not in params["encoder"]
    ids, mask = padded_batch(config.pad_token_id)
    with torch.no_grad():
        theirs = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)))
    ours = MaskedLM(config).apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(mask),
                                  deterministic=True)
    assert ours.shape == theirs.logits.shape
    diff = float(np.abs(np.asarray(ours) - theirs.logits.numpy())[mask].max())
    print(f"random {family.model_cls.__name__} MLM logits max abs diff (all real positions): {diff:.3e}")
    assert diff < ATOL


def test_round_trip_is_exact(encoder):
    name, family, model, config = encoder
    tied = EXPECTED[name][0]
    tensors = torch_tensors(model)
    back = family.params_to_hf(family.params_from_hf(tensors, config), config)
    compared = {k for k in tensors if k not in tied and not k.endswith(("position_ids", "token_type_ids"))}
    assert compared <= set(back) and set(back) - compared <= set(tied)
    for key in compared:
        assert back[key].dtype == np.float32 and np.array_equal(back[key], tensors[key]), key
    for copy, source in tied.items():
        np.testing.assert_array_equal(back[copy], tensors[source])
    family.model_cls(model.config).load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


def test_wrong_shape_is_rejected_naming_the_parameter(encoder):
    name, family, model, config = encoder
    tensor, shape, message = EXPECTED[name][2]
    with pytest.raises(ValueError, match=message):
        family.params_from_hf({**torch_tensors(model), tensor: np.zeros(shape, np.float32)}, config)


def test_roberta_positions_follow_create_position_ids_from_input_ids():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    ids, _ = padded_batch(pad=1)
    theirs = RobertaEmbeddings.create_position_ids_from_input_ids(torch.from_numpy(ids), 1).numpy()
    config = enc.roberta_config_from_hf(ROBERTA)
    np.testing.assert_array_equal(np.asarray(learned_positions(jnp.asarray(ids), config)), theirs)
    bert = model_config("bert-tiny")
    np.testing.assert_array_equal(np.asarray(learned_positions(jnp.asarray(ids), bert)), np.arange(16)[None])


def test_roberta_config_rejects_other_families():
    with pytest.raises(ValueError, match="BertForMaskedLM"):
        enc.roberta_config_from_hf({**ROBERTA, "architectures": ["BertForMaskedLM"]})


@pytest.mark.parametrize("encoder", ["distilbert"], indirect=True)
def test_distilbert_unknown_activation_and_tensor_are_rejected(encoder):
    _, _, model, config = encoder
    with pytest.raises(ValueError, match="relu"):
        enc.distilbert_config_from_hf({**DISTILBERT, "activation": "relu"})
    with pytest.raises(ValueError, match="pre_classifier.weight"):
        enc.distilbert_params_from_hf(
            {**torch_tensors(model), "pre_classifier.weight": np.zeros((64, 64), np.float32)}, config)


def test_presets_build():
    roberta, distil = model_config("roberta-base"), model_config("distilbert-base")
    roberta.validate()
    distil.validate()
    assert (roberta.position_offset, roberta.vocab_size, distil.type_vocab_size) == (2, 50265, 0)
