"""jaxlm.sentence_embedding.embed's host-side checks: what the encoder would read as NaN is refused first."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.models import model_config
from jaxlm.sentence_embedding import encoder_states, embed, encoder_module


def tiny_encoder():
    config = model_config("bert-tiny", vocab_size=100, hidden_size=32, num_heads=2, intermediate_size=64,
                          num_layers=1, max_position_embeddings=16, dtype="float32")
    ids = jnp.zeros((1, 4), jnp.int32)
    network = encoder_module(config)  # its encoder alone, as embed reads it
    return config, nn.unbox(network.init(jax.random.key(0), ids, ids > -1, method=encoder_states))["params"]


@pytest.mark.parametrize(("sentences", "expected"), [
    ([[2, 5, 3], [2, 100, 3]], "sentence 1, token 1: token id 100 is outside the model's vocabulary"),
    ([[2, -1, 3]], "sentence 0, token 1: token id -1 is outside the model's vocabulary"),
    ([[2, 3], []], "sentence 1 has no tokens; every sentence needs at least one"),
    ([], "no sentences to embed"),  # was max()'s "arg is an empty sequence"
])
def test_ids_the_encoder_cannot_read_are_named_before_any_compute(sentences, expected):
    """An id past the vocabulary gave an all-NaN vector, where generate and eval refuse it."""
    config, params = tiny_encoder()
    with pytest.raises(ValueError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        embed(config, params, sentences)
    assert np.isfinite(embed(config, params, [[2, 5, 3], [2, 99, 3]])).all()
