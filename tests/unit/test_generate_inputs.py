"""jaxlm.generate's host-side checks and defaults: token ids outside the vocabulary are refused before any
compute, and a mesh given without rules runs under the default rules."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.generate import generate_causal, generate_seq2seq
from jaxlm.models import CausalLM, T5ForConditionalGeneration, model_config
from jaxlm.parallel.rules import MESH_AXES

SIZES = dict(vocab_size=100, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=1, dtype="float32")


def tiny_decoder():
    model = CausalLM(model_config("llama-tiny", num_kv_heads=0, max_position_embeddings=32, **SIZES))
    return model, nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]


@pytest.mark.parametrize(("ids", "mask", "expected"), [
    ([[1, 5, 7], [3, 100, 2]], None, "prompt 1, token 1: token id 100"),
    ([[1, -1, 7]], None, "prompt 0, token 1: token id -1"),
    ([[1, 5, 7], [500, 2, 3]], [[1, 1, 1], [0, 1, 1]], None),  # a padded slot holds anything
])
def test_an_id_outside_the_vocabulary_is_named_before_any_compute(ids, mask, expected):
    """JAX's embedding gather clamps such an id to the last row, and generation went on from another token."""
    model, params = tiny_decoder()
    if expected is None:
        assert generate_causal(model, params, np.array(ids), mask, max_new_tokens=2).tokens.shape == (2, 2)
        return
    with pytest.raises(ValueError) as refused:
        generate_causal(model, params, np.array(ids), mask, max_new_tokens=2)
    assert str(refused.value) == f"{expected} is outside the model's vocabulary (model.vocab_size=100: ids 0 to 99)"


def test_an_encoder_decoder_input_outside_the_vocabulary_is_named():
    model = T5ForConditionalGeneration(model_config("t5-small", head_size=16, **SIZES))
    with pytest.raises(ValueError, match=r"^prompt 0, token 2: token id 128 is outside the model's vocabulary"):
        generate_seq2seq(model, {}, np.array([[4, 5, 128]]), max_new_tokens=2)


def test_a_mesh_without_rules_generates_what_no_mesh_does():
    """A mesh given without rules once failed inside Flax ("Unknown axis rule specification type")."""
    model, params = tiny_decoder()
    ids = np.array([[1, 5, 7, 9], [3, 4, 2, 8]])
    alone = generate_causal(model, params, ids, max_new_tokens=4)
    one_device = jax.make_mesh((1, 1, 1), MESH_AXES, devices=jax.devices()[:1])
    on_mesh = generate_causal(model, params, ids, max_new_tokens=4, mesh=one_device)
    np.testing.assert_array_equal(on_mesh.tokens, alone.tokens)
    np.testing.assert_array_equal(on_mesh.lengths, alone.lengths)
