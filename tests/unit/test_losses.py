"""The weighted cross-entropy against optax's: sums, accuracy and gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

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
