"""Parity of jaxlm RoBERTa and DistilBERT (MaskedLM on the BERT encoder) with Hugging Face
(PyTorch, CPU, fp32) through jaxlm.convert.hf_encoders."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

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


def torch_tensors(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def perturbed(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def padded_batch(pad: int):
    """Right-padded ids (pad id in the padding, never among the real tokens) and the real-token mask."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(len(LENGTHS), 16))
    mask = np.arange(16)[None, :] < LENGTHS[:, None]
    return np.where(mask, ids, pad), mask


@pytest.fixture(scope="module")
def roberta():
    torch.manual_seed(0)
    return perturbed(transformers.RobertaForMaskedLM(
        transformers.RobertaConfig(**ROBERTA, attn_implementation="eager")))


@pytest.fixture(scope="module")
def distilbert():
    torch.manual_seed(0)
    return perturbed(transformers.DistilBertForMaskedLM(
        transformers.DistilBertConfig(**DISTILBERT, attn_implementation="eager")))


def _logits_diff(model, config, params, pad: int, name: str) -> float:
    ids, mask = padded_batch(pad)
    with torch.no_grad():
        theirs = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)))
    ours = MaskedLM(config).apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(mask),
                                  deterministic=True)
    assert ours.shape == theirs.logits.shape
    diff = float(np.abs(np.asarray(ours) - theirs.logits.numpy())[mask].max())
    print(f"random {name} MLM logits max abs diff (all real positions): {diff:.3e}")
    return diff


def _assert_round_trip(model, back, tied: dict[str, str], family_cls):
    tensors = torch_tensors(model)
    compared = {k for k in tensors if k not in tied and not k.endswith(("position_ids", "token_type_ids"))}
    assert compared <= set(back) and set(back) - compared <= set(tied)
    for name in compared:
        assert back[name].dtype == np.float32 and np.array_equal(back[name], tensors[name]), name
    for copy, source in tied.items():
        np.testing.assert_array_equal(back[copy], tensors[source])
    family_cls(model.config).load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


# ---------------------------------------------------------------- RoBERTa

def test_roberta_positions_follow_create_position_ids_from_input_ids():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    ids, _ = padded_batch(pad=1)
    theirs = RobertaEmbeddings.create_position_ids_from_input_ids(torch.from_numpy(ids), 1).numpy()
    config = enc.roberta_config_from_hf(ROBERTA)
    np.testing.assert_array_equal(np.asarray(learned_positions(jnp.asarray(ids), config)), theirs)
    bert = model_config("bert-tiny")
    np.testing.assert_array_equal(np.asarray(learned_positions(jnp.asarray(ids), bert)), np.arange(16)[None])


def test_roberta_mlm_logits_match_transformers(roberta):
    config = enc.roberta_config_from_hf(roberta.config.to_dict(), dtype="float32")
    assert (config.position_offset, config.pad_token_id, config.type_vocab_size) == (2, 1, 1)
    params = enc.roberta_params_from_hf(torch_tensors(roberta), config, require_head=True)
    assert "pooler" not in params["encoder"]
    assert _logits_diff(roberta, config, params, pad=1, name="RobertaForMaskedLM") < ATOL


def test_roberta_round_trip_is_exact(roberta):
    config = enc.roberta_config_from_hf(roberta.config.to_dict(), dtype="float32")
    back = enc.roberta_params_to_hf(enc.roberta_params_from_hf(torch_tensors(roberta), config), config)
    _assert_round_trip(roberta, back, enc.ROBERTA_TIED, transformers.RobertaForMaskedLM)


def test_roberta_wrong_shape_is_rejected_naming_the_parameter(roberta):
    tensors = torch_tensors(roberta)
    config = enc.roberta_config_from_hf(roberta.config.to_dict(), dtype="float32")
    tensors["roberta.encoder.layer.1.attention.self.query.weight"] = np.zeros((64, 32), np.float32)
    with pytest.raises(ValueError, match=r"layer\.1\.attention\.self\.query\.weight.*\(64, 64\).*\(64, 32\)"):
        enc.roberta_params_from_hf(tensors, config)


def test_roberta_config_rejects_other_families():
    with pytest.raises(ValueError, match="BertForMaskedLM"):
        enc.roberta_config_from_hf({**ROBERTA, "architectures": ["BertForMaskedLM"]})


# ---------------------------------------------------------------- DistilBERT

def test_distilbert_mlm_logits_match_transformers(distilbert):
    config = enc.distilbert_config_from_hf(distilbert.config.to_dict(), dtype="float32")
    assert config.type_vocab_size == 0 and config.num_layers == 2
    params = enc.distilbert_params_from_hf(torch_tensors(distilbert), config, require_head=True)
    assert "token_type" not in params["encoder"]["embeddings"] and "pooler" not in params["encoder"]
    assert _logits_diff(distilbert, config, params, pad=0, name="DistilBertForMaskedLM") < ATOL


def test_distilbert_round_trip_is_exact(distilbert):
    config = enc.distilbert_config_from_hf(distilbert.config.to_dict(), dtype="float32")
    back = enc.distilbert_params_to_hf(enc.distilbert_params_from_hf(torch_tensors(distilbert), config), config)
    _assert_round_trip(distilbert, back, enc.DISTILBERT_TIED, transformers.DistilBertForMaskedLM)


def test_distilbert_wrong_shape_is_rejected_naming_the_parameter(distilbert):
    tensors = torch_tensors(distilbert)
    config = enc.distilbert_config_from_hf(distilbert.config.to_dict(), dtype="float32")
    tensors["distilbert.transformer.layer.0.ffn.lin1.weight"] = np.zeros((128, 32), np.float32)
    with pytest.raises(ValueError, match=r"layer\.0\.ffn\.lin1\.weight.*\(128, 64\).*\(128, 32\)"):
        enc.distilbert_params_from_hf(tensors, config)


def test_distilbert_unknown_activation_and_tensor_are_rejected(distilbert):
    with pytest.raises(ValueError, match="relu"):
        enc.distilbert_config_from_hf({**DISTILBERT, "activation": "relu"})
    config = enc.distilbert_config_from_hf(distilbert.config.to_dict(), dtype="float32")
    with pytest.raises(ValueError, match="pre_classifier.weight"):
        enc.distilbert_params_from_hf(
            {**torch_tensors(distilbert), "pre_classifier.weight": np.zeros((64, 64), np.float32)}, config)


def test_presets_build():
    roberta, distil = model_config("roberta-base"), model_config("distilbert-base")
    roberta.validate()
    distil.validate()
    assert (roberta.position_offset, roberta.vocab_size, distil.type_vocab_size) == (2, 50265, 0)
