"""SpanBERT: the span-boundary head reads only the boundaries and the offset; the body and MLM head are BERT's."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm import families
from jaxlm.convert import hf
from jaxlm.convert.layout import stack_layers
from jaxlm.data.settings import DataConfig
from jaxlm.models import model_config
from jaxlm.models.spanbert import SpanBertForPreTraining
from jaxlm.parallel.rules import LOGICAL_AXES

ATOL = 1e-4
VOCAB, HIDDEN, T = 300, 32, 16
CONFIG = model_config("spanbert-base", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=32, dtype="float32")
# Two targets per row: the first spans 3..5 (boundaries 2 and 6), the second 10..11 (boundaries 9 and 12).
PAIRS = np.array([[[2, 6], [2, 6], [2, 6], [9, 12]], [[2, 6], [9, 12], [9, 12], [2, 6]]])
OFFSETS = np.array([[0, 1, 2, 0], [2, 0, 1, 1]])
MASKED = PAIRS.mean(-1).astype(np.int32)


def inputs():
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, VOCAB, size=(2, T)))
    return (ids, jnp.zeros_like(ids), jnp.ones((2, T), bool), jnp.asarray(MASKED), jnp.asarray(PAIRS),
            jnp.asarray(OFFSETS))


@pytest.fixture(scope="module")
def initialised():
    model = SpanBertForPreTraining(CONFIG, max_span_length=10)
    return model, nn.unbox(model.init(jax.random.PRNGKey(0), *inputs()))["params"]


def sbo(model, params, hidden, pairs=PAIRS, offsets=OFFSETS):
    """The SBO head alone on given encoder states, with the model's tied word table."""
    head = lambda m, h, p, o: m.sbo(h, p, o, m.encoder.word_embeddings)
    return np.asarray(model.apply({"params": params}, hidden, jnp.asarray(pairs), jnp.asarray(offsets), method=head))


def test_shapes_and_dtypes(initialised):
    model, params = initialised
    mlm, sbo_logits = model.apply({"params": params}, *inputs())
    assert mlm.shape == sbo_logits.shape == (2, 4, VOCAB)
    assert mlm.dtype == sbo_logits.dtype == jnp.float32
    assert set(params) == {"encoder", "mlm", "sbo"} and "pooler" not in params["encoder"]
    assert stack_layers(params)["sbo"].keys() == params["sbo"].keys()
    assert params["sbo"]["position"]["embedding"].shape == (10, HIDDEN)
    assert params["sbo"]["dense1"]["kernel"].shape == (3 * HIDDEN, HIDDEN)


def test_sbo_logits_depend_only_on_the_boundaries_and_the_offset(initialised):
    model, params = initialised
    hidden = jax.random.normal(jax.random.PRNGKey(1), (2, T, HIDDEN))
    base = sbo(model, params, hidden)
    boundaries = np.zeros((2, T), bool)
    for row in range(2):
        boundaries[row, PAIRS[row].reshape(-1)] = True
    noise = jax.random.normal(jax.random.PRNGKey(2), hidden.shape)
    elsewhere = hidden + jnp.where(jnp.asarray(boundaries)[..., None], 0.0, noise)
    np.testing.assert_array_equal(sbo(model, params, elsewhere), base)

    left = hidden.at[0, 2].add(1.0)
    changed = np.abs(sbo(model, params, left) - base).max(-1) > 1e-3
    np.testing.assert_array_equal(changed, (PAIRS[..., 0] == 2) & (np.arange(2) == 0)[:, None])
    right = hidden.at[1, 12].add(1.0)
    changed = np.abs(sbo(model, params, right) - base).max(-1) > 1e-3
    np.testing.assert_array_equal(changed, (PAIRS[..., 1] == 12) & (np.arange(2) == 1)[:, None])

    shifted = np.where(np.arange(4) == 0, (OFFSETS + 1) % 3, OFFSETS)
    changed = np.abs(sbo(model, params, hidden, offsets=shifted) - base).max(-1) > 1e-3
    np.testing.assert_array_equal(changed, shifted != OFFSETS)


def test_every_parameter_has_logical_axis_names():
    boxed = jax.eval_shape(SpanBertForPreTraining(CONFIG).init, jax.random.PRNGKey(0), *inputs())["params"]
    is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
    leaves = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=is_box)[0]
    unnamed = ["/".join(p.key for p in path) for path, leaf in leaves
               if not is_box(leaf) or len(leaf.names) != leaf.value.ndim or not set(leaf.names) <= set(LOGICAL_AXES)]
    assert not unnamed
    specs = nn.get_partition_spec(boxed)["sbo"]
    assert tuple(specs["position"]["embedding"]) == ("relpos", "embed")
    assert tuple(specs["dense2"]["kernel"]) == ("embed", "embed_out") and tuple(specs["bias"]) == ("vocab",)


def test_jitted_gradient_is_finite(initialised):
    model, params = initialised
    ids, segments, mask, masked, pairs, offsets = inputs()
    targets = jnp.take_along_axis(ids, masked, axis=1)

    def loss(p):
        mlm, sbo_logits = model.apply({"params": p}, ids, segments, mask, masked, pairs, offsets,
                                      deterministic=False, rngs={"dropout": jax.random.PRNGKey(3)})
        nll = lambda logits: -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1).mean()
        return nll(mlm) + nll(sbo_logits)

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    reached = (grads["sbo"]["position"]["embedding"], grads["sbo"]["dense1"]["kernel"],
               grads["encoder"]["layer_0"]["mlp_norm"]["scale"])
    assert all(float(jnp.abs(g).max()) > 0 for g in reached)


def test_bert_checkpoint_body_and_mlm_head_load_unchanged(initialised):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=32, hidden_act="gelu")
    torch.manual_seed(0)
    bert = transformers.BertForPreTraining(transformers.BertConfig(**small, attn_implementation="eager"))
    with torch.no_grad():
        for p in bert.parameters():
            p.add_(0.05 * torch.randn_like(p))
    bert.eval()
    config = hf.bert_config_from_hf(bert.config.to_dict(), family="spanbert", dtype="float32")
    converted = hf.bert_params_from_hf({k: v.detach().numpy() for k, v in bert.state_dict().items()}, config,
                                       require_heads=True)
    model, fresh = SpanBertForPreTraining(config), initialised[1]
    body = {k: v for k, v in converted["encoder"].items() if k != "pooler"}
    shapes = lambda tree: jax.tree.map(np.shape, tree)
    assert shapes(fresh["encoder"]) == shapes(body) and shapes(fresh["mlm"]) == shapes(converted["mlm"])

    ids, segments, mask, masked, pairs, offsets = inputs()
    segments = segments.at[:, T // 2:].set(1)
    mask = mask.at[1, 13:].set(False)
    mlm, _ = model.apply({"params": {"encoder": body, "mlm": converted["mlm"], "sbo": fresh["sbo"]}},
                         ids, segments, mask, masked, pairs, offsets)
    with torch.no_grad():
        out = bert(input_ids=torch.from_numpy(np.array(ids)), token_type_ids=torch.from_numpy(np.array(segments)),
                   attention_mask=torch.from_numpy(np.asarray(mask).astype(np.int64)))
    theirs = np.take_along_axis(out.prediction_logits.numpy(), MASKED[..., None], axis=1)
    diff = float(np.abs(np.asarray(mlm) - theirs).max())
    print(f"SpanBERT MLM logits vs transformers BertForPreTraining max abs diff: {diff:.3e}")
    assert diff < ATOL


def test_the_offset_table_holds_data_max_span_offsets():
    """data.max_span sizes the SBO head's offset table; it was always 10, so longer spans' offsets were clipped."""
    for max_span in (10, 20):
        objective = families.get("spanbert").make_objective(CONFIG, DataConfig(max_seq_length=T, max_span=max_span))
        shapes = jax.eval_shape(lambda: objective.model.init(jax.random.PRNGKey(0), *inputs()))["params"]
        assert nn.unbox(shapes)["sbo"]["position"]["embedding"].shape[0] == max_span
