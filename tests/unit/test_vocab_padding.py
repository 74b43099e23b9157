"""model.vocab_multiple: token tables, output projections and their biases padded to a multiple of rows give
the unpadded model's outputs, loss and gradients; conversion pads and strips the rows (Hugging Face files
have none); a tensor-parallel mesh can then split a vocabulary that does not divide."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import outputs_loss_and_gradients
from jaxlm import config as config_lib
from jaxlm import families
from jaxlm.config import ConfigError
from jaxlm.convert.names import flatten
from jaxlm.convert.registry import padded_vocab, to_hf, vocab_axes
from jaxlm.data.settings import DataConfig
from jaxlm.models.presets import PRESETS, model_config
from jaxlm.train.loop import build

VOCAB, MULTIPLE, ROWS = 250, 64, 256
DATA = DataConfig(max_seq_length=16, max_predictions=3)
CASES = {"bert": {}, "albert": {"embedding_size": 16}, "spanbert": {}, "gpt2": {}, "gpt2-chunked": {"logits_chunks": 4},
         "llama-untied": {"tie_embeddings": False}, "t5-untied": {"tie_embeddings": False}, "bart": {}}


def tiny(case: str):
    family = case.split("-")[0]
    preset = next(p for p, c in PRESETS.items() if c.family == family)
    return model_config(preset, vocab_size=VOCAB, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1,
                        num_kv_heads=0, dtype="float32", hidden_dropout=0.0, attention_dropout=0.0,
                        activation_dropout=0.0, **CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_padded_tables_give_the_same_outputs_loss_and_gradients(case):
    config = tiny(case)
    params = nn.unbox(families.make_objective(config, DATA).init(jax.random.key(0)))
    padded_config, padded_params = padded_vocab(config, params, MULTIPLE)
    assert padded_config.padded_vocab_size == ROWS and config.padded_vocab_size == VOCAB
    fresh = nn.unbox(jax.eval_shape(families.make_objective(padded_config, DATA).init, jax.random.key(0)))
    assert jax.tree.map(np.shape, padded_params) == jax.tree.map(np.shape, fresh)

    axes = vocab_axes(config)
    assert axes and all(np.shape(dict(flatten(padded_params))[p])[a] == ROWS for p, a in axes.items())
    batch = families.make_objective(config, DATA).synthetic_batch(2, seed=0)
    outputs, loss, grads = outputs_loss_and_gradients(config, DATA, params, batch)
    padded_outputs, padded_loss, padded_grads = outputs_loss_and_gradients(padded_config, DATA, padded_params, batch)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), outputs, padded_outputs)
    np.testing.assert_allclose(loss, padded_loss, rtol=1e-6)
    for path, grad in grads.items():
        padded = np.asarray(padded_grads[path])
        if path in axes:  # the padding rows take no gradient
            real = np.take(padded, np.arange(VOCAB), axis=axes[path])
            assert not np.take(padded, np.arange(VOCAB, ROWS), axis=axes[path]).any(), path
            padded = real
        np.testing.assert_allclose(grad, padded, rtol=1e-5, atol=1e-7, err_msg=path)

    stripped_config, stripped = padded_vocab(padded_config, padded_params, 1)
    assert stripped_config == config
    jax.tree.map(np.testing.assert_array_equal, stripped, params)
    if families.get(config.family).converters:  # Hugging Face tensors have the vocabulary's rows only
        hf_config, tensors, _ = to_hf(padded_config, padded_params)
        assert hf_config == to_hf(config, params)[0]
        for name, tensor in to_hf(config, params)[1].items():
            np.testing.assert_array_equal(tensors[name], tensor, err_msg=name)


def test_a_tensor_parallel_mesh_splits_a_padded_vocabulary():
    mesh = ["mesh.rules=fsdp_tp", "mesh.data=1", "mesh.fsdp=2", "mesh.tensor=4", "model.num_heads=4"]
    with pytest.raises(ConfigError, match=r"30522 along 'vocab'.*set model.vocab_multiple=128"):
        build(config_lib.load("configs/bert-tiny.yaml", mesh))
    setup = build(config_lib.load("configs/bert-tiny.yaml", [*mesh, "model.vocab_multiple=128"]))
    table = setup.shardings.params["encoder"]["embeddings"]["word"]["embedding"]
    # 30,522 rows padded to 239 x 128, split 4 ways over tensor; the width 2 ways over fsdp
    assert table.shard_shape((30592, 128)) == (30592 // 4, 128 // 2)


def test_a_multiple_below_one_is_refused():
    with pytest.raises(ConfigError, match="model.vocab_multiple=0"):
        config_lib.load("configs/bert-tiny.yaml", ["model.vocab_multiple=0"])
