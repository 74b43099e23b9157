"""ULMFiT's transformations on real gradients of a tiny BERT classifier: frozen groups bit-identical,
discriminative factors exact, gradual unfreezing from the top, the slanted triangular formula."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlm.finetune.optim import (discriminative_lr, gradual_unfreezing, layer_groups, slanted_triangular,
                                  train_top_groups, ulmfit)
from jaxlm.models.presets import model_config
from jaxlm.models.task_heads import SequenceClassifier

TINY = dict(hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64, max_position_embeddings=16,
            vocab_size=100, dtype="float32")


def classifier(scan: bool):
    config = model_config("bert-tiny", scan_layers=scan, **TINY)
    model = SequenceClassifier(config, num_labels=2)
    ids = jax.random.randint(jax.random.key(1), (4, 8), 5, 100)
    params = nn.unbox(model.init(jax.random.key(0), ids)["params"])

    def loss(p):
        logits = model.apply({"params": p}, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.array([0, 1, 1, 0])).mean()

    return params, loss


def per_group(tree, groups, fn):
    """{group: fn over the leaves (or scanned slices) of that group}."""
    out = {}
    for leaf, group in zip(jax.tree.leaves(tree), jax.tree.leaves(groups)):
        if np.ndim(group):
            for i, g in enumerate(group):
                out.setdefault(int(g), []).append(fn(np.asarray(leaf)[i]))
        else:
            out.setdefault(int(group), []).append(fn(np.asarray(leaf)))
    return out


def changed_groups(before, after, groups) -> set[int]:
    moved = per_group(jax.tree.map(lambda a, b: np.asarray(a) != np.asarray(b), before, after), groups, np.any)
    return {g for g, flags in moved.items() if any(flags)}


def run(params, loss, transform, steps=1):
    optimizer = optax.chain(optax.adamw(1e-2, weight_decay=0.1), transform)
    state = optimizer.init(params)
    history = [params]
    for _ in range(steps):
        updates, state = optimizer.update(jax.grad(loss)(params), state, params)
        params = optax.apply_updates(params, updates)
        history.append(params)
    return history


@pytest.mark.parametrize("scan", [False, True])
def test_groups_embeddings_layers_head(scan):
    params, _ = classifier(scan)
    groups, top = layer_groups(params)
    assert top == 4
    assert groups["encoder"]["embeddings"]["word"]["embedding"] == 0
    assert groups["classifier"]["kernel"] == top and groups["encoder"]["pooler"]["kernel"] == top
    layer = (np.asarray(groups["encoder"]["layers"]["attention"]["query"]["kernel"]) if scan
             else [groups["encoder"][f"layer_{i}"]["attention"]["query"]["kernel"] for i in range(3)])
    assert list(layer) == [1, 2, 3]


@pytest.mark.parametrize("scan", [False, True])
def test_freezing_keeps_lower_groups_bit_identical(scan):
    params, loss = classifier(scan)
    groups, top = layer_groups(params)
    after = run(params, loss, train_top_groups(params, 2), steps=3)[-1]  # head + the last layer
    assert changed_groups(params, after, groups) == {top, top - 1}
    after = run(params, loss, ulmfit(params, train_layers=0), steps=2)[-1]
    assert changed_groups(params, after, groups) == {top}


@pytest.mark.parametrize("scan", [False, True])
def test_discriminative_rates_scale_each_group_exactly(scan):
    params, loss = classifier(scan)
    groups, top = layer_groups(params)
    grads = jax.grad(loss)(params)
    plain, _ = optax.sgd(0.1).update(grads, optax.sgd(0.1).init(params))
    chain = optax.chain(optax.sgd(0.1), discriminative_lr(params, 0.5))
    scaled, _ = chain.update(grads, chain.init(params))
    for leaf_scaled, leaf_plain, group in zip(jax.tree.leaves(scaled), jax.tree.leaves(plain), jax.tree.leaves(groups)):
        factor = 0.5 ** (top - np.asarray(group, np.float32))
        expected = np.asarray(leaf_plain) * factor.reshape(factor.shape + (1,) * (np.ndim(leaf_plain) - factor.ndim))
        np.testing.assert_array_equal(np.asarray(leaf_scaled), expected.astype(np.float32))


def test_gradual_unfreezing_opens_one_group_per_stage_from_the_top():
    params, loss = classifier(False)
    groups, top = layer_groups(params)
    history = run(params, loss, gradual_unfreezing(params, 2), steps=6)
    opened = [changed_groups(history[s], history[s + 1], groups) for s in range(6)]
    assert opened == [{top}, {top}, {top, top - 1}, {top, top - 1}, {top, top - 1, top - 2}, {top, top - 1, top - 2}]


def test_slanted_triangular_is_ulmfit_equation_3():
    total, peak, cut_frac, ratio = 200, 0.01, 0.1, 32
    schedule = slanted_triangular(total, peak, cut_frac, ratio)
    cut = 20
    for t in (0, 5, 19, 20, 21, 100, 199, 200):
        p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
        assert float(schedule(t)) == pytest.approx(peak * (1 + p * (ratio - 1)) / ratio, rel=1e-6)
    values = [float(schedule(t)) for t in range(total + 1)]
    assert int(np.argmax(values)) == cut and values[0] == pytest.approx(peak / ratio)


def test_decoder_and_encoder_decoder_groups():
    from jaxlm import families
    from jaxlm.data.settings import DataConfig
    for preset, extra, layers in (("llama-tiny", {}, 4), ("t5-small", dict(num_layers=2, num_decoder_layers=2), 4)):
        config = model_config(preset, **extra)
        objective = families.make_objective(config, DataConfig(max_seq_length=16, max_predictions=2))
        params = nn.unbox(jax.eval_shape(objective.init, jax.random.key(0)))
        groups, top = layer_groups(params)
        assert top == layers + 1
        if preset == "t5-small":  # the encoder's layers below the decoder's
            assert groups["encoder"]["layer_1"]["mlp_norm"]["scale"] == 2
            assert groups["decoder"]["layer_0"]["mlp_norm"]["scale"] == 3
            assert groups["shared"]["embedding"] == 0


def test_bad_values_are_refused():
    params, _ = classifier(False)
    for kwargs in (dict(train_layers=-2), dict(layer_lr_decay=0.0), dict(layer_lr_decay=1.5), dict(unfreeze_every=-1)):
        with pytest.raises(ValueError, match="finetune"):
            ulmfit(params, **kwargs)
