"""The weighted cross-entropy against optax's: sums, accuracy and gradients; the causal LM's chunked logits
against its whole logits: the same loss and gradients in less memory."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlm import families
from jaxlm.data.settings import DataConfig
from jaxlm.models.presets import model_config
from jaxlm.objectives.losses import weighted_cross_entropy


def test_weighted_cross_entropy_and_its_gradient_equal_optax():
    keys = jax.random.split(jax.random.key(0), 3)
    logits = (jax.random.normal(keys[0], (4, 16, 1000)) * 3).astype(jnp.bfloat16)
    labels = jax.random.randint(keys[1], (4, 16), 0, 1000)
    weights = jax.random.bernoulli(keys[2], 0.7, (4, 16)).astype(jnp.float32)

    def ours(logits):
        return weighted_cross_entropy(logits, labels, weights)[0]

    def reference(logits):
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
        return jnp.sum(per_token * weights)

    np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.grad(ours)(logits), np.float32),
                               np.asarray(jax.grad(reference)(logits), np.float32), rtol=1e-2, atol=1e-6)
    _, correct, count = weighted_cross_entropy(logits, labels, weights)
    assert count == weights.sum()
    assert correct == jnp.sum((jnp.argmax(logits, -1) == labels) * weights)


def causal_objective(chunks: int, length: int = 32):
    """A small GPT-2 whose head dominates: a 2,048-token vocabulary on 32-wide states."""
    config = model_config("gpt2-small", vocab_size=2048, hidden_size=32, num_heads=2,
                                 intermediate_size=64, num_layers=1, dtype="float32", hidden_dropout=0.0,
                                 attention_dropout=0.0, logits_chunks=chunks)
    return families.make_objective(config, DataConfig(max_seq_length=length))


def test_chunked_logits_give_the_whole_logits_loss_and_gradients():
    whole, chunked = causal_objective(0), causal_objective(4)
    params = whole.init(jax.random.key(0))
    batch = whole.synthetic_batch(3, seed=1)
    batch["target_weights"][:, -5:] = 0.0

    def stats_and_grads(objective):
        loss_and_grads = jax.jit(jax.value_and_grad(objective.loss, has_aux=True))
        (loss, stats), grads = loss_and_grads(params, batch, jax.random.key(2))
        return loss, stats, grads

    (loss, stats, grads), (chunked_loss, chunked_stats, chunked_grads) = map(stats_and_grads, (whole, chunked))
    np.testing.assert_allclose(chunked_loss, loss, rtol=1e-6)
    assert chunked_stats.keys() == stats.keys()
    for name in stats:
        np.testing.assert_allclose(chunked_stats[name], stats[name], rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(chunked_grads), jax.tree_util.tree_leaves(grads)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))


def test_chunked_logits_need_less_memory_in_the_compiled_step():
    def temp_bytes(objective):
        params = objective.init(jax.random.key(0))
        batch = objective.synthetic_batch(8)
        step = jax.jit(jax.grad(lambda p: objective.loss(p, batch, jax.random.key(1))[0]))
        return step.lower(params).compile().memory_analysis().temp_size_in_bytes

    whole, chunked = temp_bytes(causal_objective(0, 256)), temp_bytes(causal_objective(8, 256))
    logits = 8 * 256 * 2048 * 4
    assert whole > 2 * logits and chunked < whole - logits, (whole, chunked)
