"""Parity of jaxlm BERT with Hugging Face BERT (PyTorch, CPU, fp32) through jaxlm.convert.hf."""
from __future__ import annotations

import fractions
import json

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import minilm_tokenizer, minilm_transformers, random_model, right_padded, torch_tensors  # noqa: E402
from jaxlm.convert import hf  # noqa: E402
from jaxlm.corpora.models import minilm_dir  # noqa: E402
from jaxlm.models.encoder import BertEncoder  # noqa: E402
from jaxlm.models.heads import BertForPreTraining  # noqa: E402

ATOL = 1e-4
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "JAX transforms numerical Python functions.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Why?",
    "Sentence embeddings map text of any length to one fixed-size vector that captures its meaning.",
    "Rain again today.",
]
SMALL = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=128, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu")


def mean_pool_normalised(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    mask = mask[..., None].astype(np.float64)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


# ---------------------------------------------------------------- all-MiniLM-L6-v2

@pytest.fixture(scope="module")
def minilm():
    path = minilm_dir()
    config, params = hf.load_hf_bert(path, dtype="float32")
    batch = minilm_tokenizer()(SENTENCES, padding=True, return_tensors="np")
    return path, config, params, batch, minilm_transformers()


def test_minilm_config_and_groups(minilm):
    _, config, params, _, _ = minilm
    assert (config.hidden_size, config.num_layers, config.num_heads) == (384, 6, 12)
    assert config.dtype == "float32"
    assert hf.missing_groups(params, config) == ["mlm", "nsp"]
    assert "pooler" in params["encoder"]


def test_minilm_requires_heads_when_asked(minilm):
    path, config, _, _, _ = minilm
    with pytest.raises(ValueError, match="no mlm or nsp head"):
        hf.bert_params_from_hf(hf.read_tensors(path), config, require_heads=True)


def test_minilm_hidden_states_and_embeddings_match_transformers(minilm):
    _, config, params, batch, torch_model = minilm
    ids, segments, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    assert (ids[:, 0] == 101).all() and len(set(mask.sum(1))) > 4
    with torch.no_grad():
        out = torch_model(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                          attention_mask=torch.from_numpy(mask))
    theirs, theirs_pooled = out.last_hidden_state.numpy(), out.pooler_output.numpy()
    ours, ours_pooled = BertEncoder(config).apply(
        {"params": params["encoder"]}, jnp.asarray(ids), jnp.asarray(segments),
        jnp.asarray(mask.astype(bool)), deterministic=True)
    ours = np.asarray(ours)
    real = mask.astype(bool)
    diff = np.abs(ours - theirs)[real].max()
    print(f"all-MiniLM-L6-v2 last hidden state max abs diff: {diff:.3e}")
    assert diff < ATOL
    pooled_diff = np.abs(np.asarray(ours_pooled) - theirs_pooled).max()
    print(f"all-MiniLM-L6-v2 pooler max abs diff: {pooled_diff:.3e}")
    assert pooled_diff < ATOL
    cosine = (mean_pool_normalised(ours, mask) * mean_pool_normalised(theirs, mask)).sum(-1)
    print(f"all-MiniLM-L6-v2 sentence embedding min cosine: {cosine.min():.8f}")
    assert cosine.min() >= 0.99999


# ---------------------------------------------------------------- random BertForPreTraining

@pytest.fixture(scope="module")
def small_hf():
    return random_model(transformers.BertForPreTraining, transformers.BertConfig(**SMALL))


@pytest.fixture
def small_dir(small_hf, tmp_path):
    small_hf.save_pretrained(tmp_path)
    return tmp_path


def small_batch():
    lengths = np.array([16, 11, 7, 13])
    ids, mask = right_padded(lengths, SMALL["vocab_size"], 0, np.random.default_rng(0), low=5)
    segments = ((np.arange(16)[None, :] >= lengths[:, None] // 2) & mask).astype(np.int64)
    positions = np.array([[0, 3, 15], [1, 5, 10], [2, 4, 6], [0, 7, 12]])
    return ids, segments, mask, positions


def test_small_pretraining_logits_match_transformers(small_hf, small_dir):
    config, params = hf.load_hf_bert(small_dir, dtype="float32", require_heads=True)
    ids, segments, mask, positions = small_batch()
    with torch.no_grad():
        out = small_hf(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(segments),
                       attention_mask=torch.from_numpy(mask.astype(np.int64)))
    theirs_mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
    ours_mlm, ours_nsp = BertForPreTraining(config).apply(
        {"params": params}, jnp.asarray(ids), jnp.asarray(segments), jnp.asarray(mask),
        jnp.asarray(positions), deterministic=True)
    mlm_diff = np.abs(np.asarray(ours_mlm) - theirs_mlm).max()
    nsp_diff = np.abs(np.asarray(ours_nsp) - out.seq_relationship_logits.numpy()).max()
    print(f"random BertForPreTraining MLM logits max abs diff: {mlm_diff:.3e}, NSP: {nsp_diff:.3e}")
    assert mlm_diff < ATOL and nsp_diff < ATOL


def test_round_trip_is_exact(small_hf):
    tensors = torch_tensors(small_hf)
    config = hf.bert_config_from_hf(small_hf.config.to_dict(), dtype="float32")
    back = hf.bert_params_to_hf(hf.bert_params_from_hf(tensors, config), config)
    tied = {hf.TIED_DECODER, hf.TIED_DECODER_BIAS}
    compared = {k for k in tensors if k not in tied and not k.endswith(("position_ids", "token_type_ids"))}
    assert compared <= set(back) and set(back) - compared == tied
    for name in compared:
        assert back[name].dtype == np.float32 and np.array_equal(back[name], tensors[name]), name
    np.testing.assert_array_equal(back[hf.TIED_DECODER], tensors["bert.embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(back[hf.TIED_DECODER_BIAS], tensors["cls.predictions.bias"])
    reloaded = transformers.BertForPreTraining(small_hf.config)
    reloaded.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


def test_names_without_bert_prefix_and_old_layer_norm_names(small_hf):
    tensors = torch_tensors(small_hf)
    config = hf.bert_config_from_hf(small_hf.config.to_dict(), dtype="float32")
    renamed = {k.removeprefix("bert.").replace("LayerNorm.weight", "LayerNorm.gamma"): v
               for k, v in tensors.items()}
    a, b = hf.bert_params_from_hf(tensors, config), hf.bert_params_from_hf(renamed, config)
    for (path, x), (_, y) in zip(hf.flatten(a), hf.flatten(b)):
        np.testing.assert_array_equal(x, y, err_msg=path)


def test_fill_missing_completes_an_encoder_only_tree(small_hf):
    tensors = {k: v for k, v in torch_tensors(small_hf).items() if k.startswith("bert.")}
    config = hf.bert_config_from_hf(small_hf.config.to_dict(), dtype="float32")
    params = hf.bert_params_from_hf(tensors, config)
    assert hf.missing_groups(params, config) == ["mlm", "nsp"]
    defaults = hf.unflatten({p: np.zeros(s, np.float32) for p, s in hf.expected_shapes(config).items()})
    full = hf.fill_missing(params, defaults)
    assert hf.missing_groups(full, config) == []
    np.testing.assert_array_equal(full["encoder"]["embeddings"]["word"]["embedding"],
                                  tensors["bert.embeddings.word_embeddings.weight"])


# ---------------------------------------------------------------- bad input

def test_other_architecture_is_rejected_by_name(tmp_path):
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2,
            "vocab_size": 1000, "activation_function": "gelu_new"}
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*only BERT is supported so far"):
        hf.load_hf_bert(tmp_path)
    with pytest.raises(ValueError, match="RobertaModel"):
        hf.bert_config_from_hf({"architectures": ["RobertaModel"], **SMALL})


def test_unsupported_activation_is_rejected_by_name():
    with pytest.raises(ValueError, match="gelu_new"):
        hf.bert_config_from_hf({**SMALL, "model_type": "bert", "hidden_act": "gelu_new"})


def test_wrong_shape_is_rejected_naming_the_parameter(small_hf):
    tensors = torch_tensors(small_hf)
    config = hf.bert_config_from_hf(small_hf.config.to_dict(), dtype="float32")
    name = "bert.encoder.layer.1.attention.self.query.weight"
    tensors[name] = np.zeros((64, 32), np.float32)
    with pytest.raises(ValueError, match=r"layer\.1\.attention\.self\.query\.weight.*\(64, 64\).*\(64, 32\)"):
        hf.bert_params_from_hf(tensors, config)


def test_unknown_and_partial_tensors_are_rejected(small_hf):
    config = hf.bert_config_from_hf(small_hf.config.to_dict(), dtype="float32")
    tensors = torch_tensors(small_hf)
    with pytest.raises(ValueError, match="classifier.weight"):
        hf.bert_params_from_hf({**tensors, "classifier.weight": np.zeros((2, 64), np.float32)}, config)
    del tensors["cls.seq_relationship.bias"]
    with pytest.raises(ValueError, match="cls.seq_relationship.bias"):
        hf.bert_params_from_hf(tensors, config)


def test_missing_checkpoint_names_what_was_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        hf.read_tensors(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match=r"safetensors or pytorch_model\.bin"):
        hf.read_tensors(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load_hf_bert(tmp_path)


def test_pytorch_bin_checkpoint_is_read(small_hf, tmp_path):
    """A file of tensors is read; one that also holds another object, or is no PyTorch file at all, is named (the
    second was said to hold objects besides tensors)."""
    tensors = torch_tensors(small_hf)
    torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, tmp_path / "pytorch_model.bin")
    read = hf.read_tensors(tmp_path)
    assert set(read) == set(tensors)
    assert all(np.array_equal(read[k], tensors[k]) for k in tensors)
    path = tmp_path / "pytorch_model.bin"
    torch.save({"weight": torch.zeros(2), "a fraction": fractions.Fraction(1, 3)}, path)
    with pytest.raises(ValueError, match=r"holds objects besides tensors, which torch's safe loader"):
        hf.read_tensors(tmp_path)
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"could not be read as a PyTorch checkpoint file \(.*; 1024 bytes\): it is "
                                         r"truncated or damaged"):
        hf.read_tensors(tmp_path)
