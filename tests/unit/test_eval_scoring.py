"""The scoring engine's contract on parameter trees a caller holds, and the items it refuses."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.corpora.models import gpt2_tokenizer_dir
from jaxlm.data.tokenizers.load import load_tokenizer
from jaxlm.eval import Item, loglikelihoods, perplexity
from jaxlm.models import BertForPreTraining, CausalLM, model_config
from jaxlm.parallel.rules import MESH_AXES, rules_for


def tiny_decoder():
    config = model_config("llama-tiny", vocab_size=100, hidden_size=32, num_heads=2, num_kv_heads=0,
                          intermediate_size=64, num_layers=1, max_position_embeddings=16, dtype="float32")
    return config, nn.unbox(CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]


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
    with pytest.raises(ValueError, match="it needs mask_id, the tokenizer's mask token, and none was given"):
        loglikelihoods(config, params, items)
    with pytest.raises(ValueError, match=r"mask_id=5000 is not a token id of the model's vocabulary"):  # was [nan]
        loglikelihoods(config, params, items, mask_id=5000)


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


@pytest.mark.parametrize(("items", "expected"), [
    ([Item((1, 2), (3, 4)), Item((1,), (5, 100))], "item 1, continuation token 1: token id 100"),
    ([Item((1, -3), (3, 4))], "item 0, context token 1: token id -3"),
])
def test_an_id_outside_the_vocabulary_is_named_before_any_compute(items, expected):
    """JAX's gathers clamp such an id into range: a score of another token, or NaN, with no error."""
    config, params = tiny_decoder()
    with pytest.raises(ValueError) as refused:
        loglikelihoods(config, params, items)
    assert str(refused.value) == f"{expected} is outside the model's vocabulary (model.vocab_size=100: ids 0 to 99)"


def test_perplexity_of_no_tokens_or_of_ids_the_model_lacks_is_refused():
    """perplexity([]) and of lines that hold nothing to predict once gave 1.0."""
    config, params = tiny_decoder()
    gpt2 = load_tokenizer(gpt2_tokenizer_dir())  # ids up to 50,256, past this model's 100
    for lines in ([], [""]):
        with pytest.raises(ValueError, match=rf"^no tokens to score in {len(lines)} lines: pass lines with text"):
            perplexity(config, params, gpt2, lines)
    line = "It is a truth universally acknowledged"
    first = gpt2.encode(line)[0]
    with pytest.raises(ValueError) as refused:
        perplexity(config, params, gpt2, ["", line])
    assert str(refused.value) == (f"line 1 window 0, context token 0: token id {first} is outside the model's "
                                  "vocabulary (model.vocab_size=100: ids 0 to 99)")


def test_a_mesh_without_rules_gets_the_default_rules_or_a_line_naming_the_axes_they_need():
    config, params = tiny_decoder()
    items = [Item((1, 2), (3, 4)), Item((5,), (6, 7, 8))]
    expected = loglikelihoods(config, params, items)
    one_device = jax.make_mesh((1, 1, 1), MESH_AXES, devices=jax.devices()[:1])
    np.testing.assert_allclose(loglikelihoods(config, params, items, mesh=one_device), expected, rtol=1e-5)
    other_axes = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
    with pytest.raises(ValueError, match=r"^the default sharding rules \('dp'\) split over mesh axes \['data', "
                                         r"'fsdp'\], which this mesh \('x',\) lacks; pass rules for its axes$"):
        loglikelihoods(config, params, items, mesh=other_axes)


@pytest.mark.parametrize("axis_type", [jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto])
def test_scoring_and_abstract_parameters_work_under_the_callers_mesh_and_rules(axis_type):
    """Inside `jax.set_mesh` and `nn.logical_axis_rules`, as the README sets them for training, scoring unboxed
    its abstract parameters through a sharding constraint, a TypeError on a ShapeDtypeStruct; so did
    `nn.unbox(jax.eval_shape(model.init, ...))`."""
    config, params = tiny_decoder()
    items = [Item((1, 2), (3, 4)), Item((5,), (6, 7, 8))]
    expected = loglikelihoods(config, params, items)
    mesh = jax.make_mesh((jax.device_count() // 2, 2, 1), MESH_AXES, axis_types=(axis_type,) * 3)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules_for("fsdp")):
        np.testing.assert_allclose(loglikelihoods(config, params, items), expected, rtol=1e-5)
        shapes = nn.unbox(jax.eval_shape(CausalLM(config).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
    assert jax.tree.map(lambda s: s.shape, shapes["params"]) == jax.tree.map(np.shape, params)


def test_a_batch_larger_than_the_rows_is_padded_to_the_rows_not_to_the_batch(monkeypatch):
    """`jaxlm eval --batch-size 100000000` padded each batch to that many rows: killed for memory."""
    from jaxlm.eval import scoring
    config, params = tiny_decoder()
    items = [Item((1, 2), (3, 4)), Item((1,), (5, 6, 7)), Item((1, 9), (8,))]
    sizes, pad_rows = [], scoring.pad_rows
    monkeypatch.setattr(scoring, "pad_rows", lambda rows, size, *rest: sizes.append(size) or pad_rows(
        rows, min(size, 64), *rest))  # never the batch the old code asked for
    huge = loglikelihoods(config, params, items, batch_size=10 ** 9)
    assert sizes == [max(4, jax.device_count())]  # 3 rows: 4, a power of two, or one a device
    np.testing.assert_allclose(huge, loglikelihoods(config, params, items, batch_size=1), rtol=1e-5)


def test_items_of_arrays_score_as_tuples_and_float_ids_are_refused():
    """Item(np.array(...), ...) ended in numpy's "truth value of an array is ambiguous"; Item((5.5,), (6.0,)) scored
    ids 5 and 6."""
    config, params = tiny_decoder()
    arrays = loglikelihoods(config, params, [Item(np.array([1, 2]), np.array([3, 4]))])
    assert arrays.tolist() == loglikelihoods(config, params, [Item((1, 2), (3, 4))]).tolist()
    with pytest.raises(ValueError, match=r"^item 0, context token 0: token id 5.5 is not a whole number"):
        loglikelihoods(config, params, [Item((5.5,), (6.0,))])


def test_perplexity_names_a_foreign_tokenizer_and_a_string_of_lines():
    """A `tokenizers.Tokenizer` failed with "'Encoding' object is not iterable", and one string was read a
    character a line."""
    import tokenizers

    config, params = tiny_decoder()
    foreign = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match=r"^tokenizer is a tokenizers.Tokenizer; give jaxlm's: "
                                         r"jaxlm.data.tokenizers.load.load_tokenizer"):
        perplexity(config, params, foreign, ["a line"])
    with pytest.raises(ValueError, match=r"^lines is one string; give a list of lines"):
        perplexity(config, params, load_tokenizer(gpt2_tokenizer_dir()), "a line")


def test_scoring_takes_tuples_and_boxed_parameters_and_names_a_network_or_a_nested_tree():
    """Tuples for items were "'tuple' object has no attribute 'continuation'", boxed parameters a pytree
    structure error, the network for its config "object has no attribute 'family'", and {"params": tree} named
    the groups as missing without saying why."""
    config, params = tiny_decoder()
    items = [Item((1, 2), (3, 4))]
    expected = loglikelihoods(config, params, items)
    boxed = CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    np.testing.assert_allclose(loglikelihoods(config, boxed, [((1, 2), (3, 4))]), expected, rtol=1e-6)
    with pytest.raises(ValueError, match=r"^scoring takes the model's config \(a TransformerConfig, e\.g\. "
                                         r"model\.config\), not a CausalLM$"):
        loglikelihoods(CausalLM(config), params, items)
    with pytest.raises(ValueError, match=r"^the parameters lack decoder, lm_head, which scoring a llama model needs; "
                                         r"give the tree under \"params\", not the variables that hold it$"):
        loglikelihoods(config, {"params": params}, items)
    with pytest.raises(ValueError, match=r"^items must be Item\(context, continuation\[, suffix\]\) or tuples"):
        loglikelihoods(config, params, [(1, 2)])
