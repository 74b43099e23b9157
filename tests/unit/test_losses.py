"""The weighted cross-entropy against optax's: sums, accuracy and gradients; its one-read statistics against
logsumexp and argmax; the causal LM's chunked logits against its whole logits: the same loss and gradients in
less memory."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlm import families
from jaxlm.data.settings import DataConfig
from jaxlm.models.presets import model_config
from jaxlm.objectives import losses
from jaxlm.objectives.losses import softmax_statistics, weighted_cross_entropy
from jaxlm.train import hlo_cost


@pytest.fixture(params=["cpu", "gpu"])
def built_for(request, monkeypatch):
    """The loss as built for a CPU (two passes) and for a GPU (`softmax_statistics`, one read), both run here."""
    monkeypatch.setattr(losses, "target_platform", lambda: request.param)
    return request.param


def test_weighted_cross_entropy_and_its_gradient_equal_optax(built_for):
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


def test_softmax_statistics_in_one_read_equal_logsumexp_and_the_first_argmax():
    keys = jax.random.split(jax.random.key(3), 2)
    logits = jax.random.normal(keys[0], (6, 5000)) * 20
    logits = logits.at[0, 7].set(1e3).at[0, 4000].set(1e3)  # a tie: the first index wins, as in jnp.argmax
    logits = logits.at[1, :4000].set(-jnp.inf)  # masked entries
    logits = logits.at[2].set(-3.0)  # a constant row
    logits = logits.at[3].add(-1e4)  # far from 0
    log_z, best = jax.jit(softmax_statistics)(logits)
    np.testing.assert_allclose(log_z, jax.nn.logsumexp(logits, axis=-1), rtol=1e-6)
    np.testing.assert_array_equal(best, jnp.argmax(logits, axis=-1))
    assert best[0] == 7 and best[2] == 0


def test_the_weights_gradient_equals_optax(built_for):
    keys = jax.random.split(jax.random.key(4), 3)
    logits = jax.random.normal(keys[0], (8, 300)) * 3
    labels = jax.random.randint(keys[1], (8,), 0, 300)
    weights = jax.random.uniform(keys[2], (8,))

    def ours(weights):
        loss, _, count = weighted_cross_entropy(logits, labels, weights)
        return loss / count

    def reference(weights):
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return jnp.sum(per_token * weights) / jnp.sum(weights)

    np.testing.assert_allclose(jax.grad(ours)(weights), jax.grad(reference)(weights), rtol=1e-5, atol=1e-7)


def test_the_loss_built_for_a_gpu_reads_the_logits_once_and_its_gradient_once_more(monkeypatch):
    """The compiled kernels' bytes (`hlo_cost`, of XLA's CPU fusions of the GPU's formulation): the forward pass
    one read of the logits, where logsumexp, the label's logit and argmax took five; with the gradient, one read
    and one write more."""
    monkeypatch.setattr(losses, "target_platform", lambda: "gpu")
    logits, labels, weights = jnp.zeros((512, 4096)), jnp.zeros((512,), jnp.int32), jnp.ones((512,))

    def moved(fn) -> float:
        kernels = hlo_cost.kernels(jax.jit(fn).lower(logits).compile().as_text())
        return sum(k["bytes"] for k in kernels) / logits.nbytes

    assert moved(lambda x: weighted_cross_entropy(x, labels, weights)) < 1.05
    assert moved(jax.grad(lambda x: weighted_cross_entropy(x, labels, weights)[0])) < 3.05


def test_labels_outside_the_vocabulary_with_no_weight_add_nothing(built_for):
    logits = jax.random.normal(jax.random.key(5), (4, 50))
    labels, weights = jnp.array([3, -100, 50, -1]), jnp.array([1.0, 0.0, 0.0, 0.0])
    loss, correct, count = weighted_cross_entropy(logits, labels, weights)
    expected = optax.softmax_cross_entropy_with_integer_labels(logits[:1], labels[:1])[0]
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert count == 1 and correct == (jnp.argmax(logits[0]) == 3)
    gradient = jax.grad(lambda x: weighted_cross_entropy(x, labels, weights)[0])(logits)
    assert np.isfinite(gradient).all() and not np.asarray(gradient[1:]).any()
