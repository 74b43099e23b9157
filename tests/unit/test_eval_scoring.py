"""The scoring engine's contract on parameter trees a caller holds, and the items it refuses."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.eval import Item, loglikelihoods
from jaxlm.models import BertForPreTraining, CausalLM, model_config


def test_an_encoders_full_pretraining_tree_scores_and_one_without_its_head_is_refused():
    config = model_config("bert-tiny", vocab_size=200, max_position_embeddings=32, dtype="float32")
    ids = jnp.zeros((1, 8), jnp.int32)
    params = nn.unbox(BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids > -1,
                                                      jnp.zeros((1, 1), jnp.int32)))["params"]
    items = [Item((101,), (7, 8, 9), (102,)), Item((101, 5), (6,), (102,))]
    scores = loglikelihoods(config, params, items, mask_id=103)
    assert scores.shape == (2,) and np.all(np.isfinite(scores)) and np.all(scores < 0)
    with pytest.raises(ValueError, match="lack mlm"):
        loglikelihoods(config, {k: v for k, v in params.items() if k != "mlm"}, items, mask_id=103)
    with pytest.raises(ValueError, match="mask token"):
        loglikelihoods(config, params, items)


def test_a_decoder_item_needs_context_and_room():
    config = model_config("llama-tiny", vocab_size=100, max_position_embeddings=16, dtype="float32")
    params = nn.unbox(CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
    with pytest.raises(ValueError, match="no context"):
        loglikelihoods(config, params, [Item((), (5, 6, 7))])
    with pytest.raises(ValueError, match="needs 17 positions, more than the model's 16"):
        loglikelihoods(config, params, [Item((1,), tuple(range(2, 19)))])
    long_context = loglikelihoods(config, params, [Item(tuple(range(1, 40)), (5, 6))])
    assert np.isfinite(long_context).all()  # the context is cut from the left


def test_an_encoder_context_too_long_keeps_its_first_token_and_loses_what_follows():
    config = model_config("bert-tiny", vocab_size=200, max_position_embeddings=16, dtype="float32")
    ids = jnp.zeros((1, 8), jnp.int32)
    params = nn.unbox(BertForPreTraining(config).init(jax.random.key(0), ids, ids, ids > -1,
                                                      jnp.zeros((1, 1), jnp.int32)))["params"]
    context = (101, *range(10, 40))
    long, cut = Item(context, (7, 8), (102,)), Item((101, *range(27, 40)), (7, 8), (102,))
    scores = loglikelihoods(config, params, [long, cut], mask_id=103)
    assert scores[0] == pytest.approx(scores[1], rel=1e-6)
    with pytest.raises(ValueError, match="needs 17 positions, more than the model's 16"):
        loglikelihoods(config, params, [Item((101,), tuple(range(10, 25)), (102,))], mask_id=103)
