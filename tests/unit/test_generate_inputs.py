"""jaxlm.generate's host-side checks and defaults: token ids outside the vocabulary are refused before any
compute, and a mesh given without rules runs under the default rules."""
import dataclasses
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT
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


def test_a_tiny_temperature_samples_the_best_token_and_one_float32_cannot_hold_is_refused():
    """logits / 1e-37 overflowed float32 to inf and the draw became NaN's token 0, whatever the logits said; 1e-50
    divides by float32's 0."""
    from jaxlm.generate import check_sampling, sample_next

    logits = jnp.array([[50.0, 100.0, -20.0, 99.0]])
    for temperature in (1e-3, 1e-37):
        assert [int(sample_next(logits, jax.random.key(s), temperature)[0]) for s in range(4)] == [1] * 4
    for temperature in (1e-50, 1e300):
        said = rf"^temperature={re.escape(str(temperature))} is outside float32's range.*use 0 for greedy"
        with pytest.raises(ValueError, match=said):
            check_sampling(temperature, 0, 1.0)


@pytest.mark.parametrize("top_k, top_p, num_beams, named", [(0, 0.5, 1, "top_p=0.5 narrows"),
                                                             (5, 1.0, 1, "top_k=5 narrows"),
                                                             (5, 0.9, 2, "top_k=5 and top_p=0.9 narrow")])
def test_top_k_or_top_p_without_a_temperature_is_refused(top_k, top_p, num_beams, named):
    """Greedy decoding and beam search draw nothing: the filters were ignored without a word. The message names
    the filters given (it named top_p=1, which narrows nothing)."""
    from jaxlm.generate import check_sampling
    with pytest.raises(ValueError, match=rf"^{named} the tokens a sample is drawn "
                                         r"from, and temperature=0 draws none .*: give a temperature above 0"):
        check_sampling(0.0, top_k, top_p, num_beams)
    check_sampling(0.7, top_k, top_p)


def test_a_count_of_new_tokens_beyond_int32_is_refused_before_any_compute():
    """Rotary positions have no table to bound it: 3e9 was JAX's OverflowError traceback."""
    model, params = tiny_decoder()
    with pytest.raises(ValueError, match=r"^max_new_tokens=3000000000 must lie in \[1, 2\*\*31\)$"):
        generate_causal(model, params, np.array([[1, 5, 7]]), max_new_tokens=3_000_000_000)


def test_generate_from_a_checkpoint_checks_the_count_before_reading_it(tmp_path):
    from jaxlm.generate import generate_from_checkpoint

    with pytest.raises(ValueError, match=r"^max_new_tokens=0 must lie in \[1, 2\*\*31\)$"):
        generate_from_checkpoint(tmp_path / "not-read", ["hello"], max_new_tokens=0)


def test_a_generation_the_memory_cannot_hold_is_one_line():
    """Rotary positions have no table to bound the cache: 4 * 10**7 new tokens (a 9.5 GiB cache) was XLA's
    RESOURCE_EXHAUSTED traceback. Run in a process whose address space is capped below the cache and the machine's
    memory is not, so the cache passes the check before compiling and no overcommit lets the allocation through."""
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30)); "
              "sys.path[:0] = ['tests', 'tests/unit']; import numpy as np; "
              "from test_generate_inputs import tiny_decoder; "
              "from jaxlm.generate import generate_causal; model, params = tiny_decoder()\n"
              "try:\n generate_causal(model, params, np.array([[1, 5, 7]]), max_new_tokens=4 * 10**7)\n"
              "except ValueError as err:\n print(err)")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("1 prompt(s) of up to 3 tokens, 40000000 new tokens and 1 beam(s) need more "
                                  "memory than the device has (RESOURCE_EXHAUSTED: "), proc.stderr[-2000:]
    assert proc.stdout.rstrip().endswith("; ask for fewer new tokens, prompts or beams")


@pytest.mark.parametrize("beams", [1, 4])
def test_a_cache_larger_than_the_device_is_refused_before_compiling(beams):
    """10**9 new tokens compiled for about 28 s (SmolLM2) before XLA said it had no memory for them: the cache's
    size (its beams' rows included) is now weighed against the device's memory first, for decoders and
    encoder-decoders alike."""
    model, params = tiny_decoder()
    with pytest.raises(ValueError) as refused:
        generate_causal(model, params, np.array([[1, 5, 7], [2, 3, 4]]), max_new_tokens=10**9, num_beams=beams)
    cache_gib = 2 * beams * (3 + 10**9) * 2 * 32 * 4 / 2**30  # rows, slots, keys and values, width, float32
    assert re.fullmatch(rf"2 prompt\(s\) of up to 3 tokens, 1000000000 new tokens and {beams} beam\(s\) need more "
                        rf"memory than the device has \(the KV cache alone takes {cache_gib:,.1f} GiB per device, "
                        r"more than the [\d,.]+ GiB of .*\); ask for fewer new tokens, prompts or beams",
                        str(refused.value)), str(refused.value)
    t5 = T5ForConditionalGeneration(model_config("t5-small", head_size=16, **SIZES))
    t5_params = nn.unbox(t5.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32)))
    with pytest.raises(ValueError, match=r"the KV cache alone takes [\d,.]+ GiB per device"):
        generate_seq2seq(t5, t5_params["params"], [[5, 6, 7]], max_new_tokens=10**9, num_beams=beams)


@pytest.mark.parametrize("given, expected", [
    (dict(pad_id=5000), "pad_id=5000 is not a token id"),  # its row generated from the clamped last row: zeros
    (dict(eos_id=100), "eos_id=100 is not a token id"),
    (dict(pad_id=True), "pad_id=True is not a token id"),
])
def test_special_ids_outside_the_vocabulary_are_refused(given, expected):
    model, params = tiny_decoder()
    with pytest.raises(ValueError, match=re.escape(f"{expected} of the model's vocabulary (model.vocab_size=100")):
        generate_causal(model, params, [[5, 6, 7]], max_new_tokens=2, **given)
    t5 = T5ForConditionalGeneration(model_config("t5-small", head_size=16, **SIZES))
    with pytest.raises(ValueError, match=re.escape("decoder_start_id=5000 is not a token id")):  # gave [[0, 0, ...]]
        generate_seq2seq(t5, {}, [[5, 6, 7]], max_new_tokens=2, decoder_start_id=5000)


def test_float_token_ids_are_refused():
    """[[5.7, 6.2]] generated as [[5, 6]]."""
    model, params = tiny_decoder()
    with pytest.raises(ValueError, match=re.escape("prompt 0, token 0: token id 5.7 is not a whole number")):
        generate_causal(model, params, np.array([[5.7, 6.2]]), max_new_tokens=2)


def test_a_decoder_stops_at_its_configs_eos_as_transformers_does():
    """generate_causal ignored config.eos_token_id (generate_seq2seq took it): transformers stops at it."""
    model, params = tiny_decoder()
    free = generate_causal(model, params, [[5, 6, 7]], max_new_tokens=6, eos_id=-1)
    first = int(free.tokens[0, 0])
    stopping = CausalLM(dataclasses.replace(model.config, eos_token_id=first))
    stopped = generate_causal(stopping, params, [[5, 6, 7]], max_new_tokens=6)
    assert free.lengths.tolist() == [6] and stopped.lengths.tolist() == [1] and stopped.tokens[0, 0] == first


def test_inputs_of_the_wrong_shape_are_named():
    """ids [T] ended in "IndexError: tuple index out of range", a mask of another length in a broadcast error."""
    model, params = tiny_decoder()
    tokens = jnp.zeros((2, 8), jnp.int32)
    with pytest.raises(ValueError, match=re.escape("input_ids must be [batch, length], not shape (8,)")):
        model.apply({"params": params}, tokens[0])
    with pytest.raises(ValueError, match=re.escape("padding_mask has shape (2, 4) and input_ids (2, 8): give one per")):
        model.apply({"params": params}, tokens, padding_mask=jnp.ones((2, 4), bool))
    t5 = T5ForConditionalGeneration(model_config("t5-small", head_size=16, **SIZES))
    with pytest.raises(ValueError, match=re.escape("decoder_input_ids must be [batch, length], not shape (3,)")):
        jax.eval_shape(lambda: t5.init(jax.random.key(0), tokens, jnp.zeros((3,), jnp.int32)))


def test_a_mask_given_where_positions_go_and_ids_that_are_not_integers_are_named():
    """Hugging Face's order (ids, mask) put a padding mask into `positions`: it ran, every token at position 0 or 1.
    In T5's decoder ids it was an IndexError deep inside, and float ids a gather's TypeError."""
    model, params = tiny_decoder()
    tokens = jnp.zeros((2, 8), jnp.int32)
    with pytest.raises(ValueError, match=re.escape("positions must hold integers, not bool: is it a padding mask given "
                                                   "by position? pass it as padding_mask=")):
        model.apply({"params": params}, tokens, jnp.ones((2, 8), bool))
    with pytest.raises(ValueError, match=r"^input_ids must hold integers, not float32"):
        model.apply({"params": params}, tokens.astype(jnp.float32))
    model.apply({"params": params}, tokens, padding_mask=jnp.ones((2, 8), jnp.float32))  # a mask may be any type
    t5 = T5ForConditionalGeneration(model_config("t5-small", head_size=16, **SIZES))
    with pytest.raises(ValueError, match=re.escape("decoder_input_ids must hold integers, not bool: is it a padding")):
        jax.eval_shape(lambda: t5.init(jax.random.key(0), tokens, jnp.ones((2, 8), bool)))


def test_decoding_on_a_cache_without_positions_or_past_its_slots_is_refused():
    """Without positions each new token was read as position 0 again (rotary: other logits, no error); a cache
    fed more tokens than its slots wrote them clipped to its end. Token by token with positions, the logits are
    the whole sequence's."""
    model, params = tiny_decoder()
    tokens = jnp.array([[5, 17, 30, 42, 7, 99]])
    whole = model.apply({"params": params}, tokens)
    cache = model.init(jax.random.key(0), jnp.zeros((1, 6), jnp.int32), decode=True)["cache"]
    for t in range(6):
        logits, changed = model.apply({"params": params, "cache": cache}, tokens[:, t:t + 1],
                                      positions=jnp.array([[t]]), decode=True, mutable=["cache"])
        np.testing.assert_allclose(logits[0, 0], whole[0, t], atol=1e-5)
        cache = changed["cache"]
    with pytest.raises(ValueError, match=r"^decode=True on an existing cache needs positions \[batch, length\]"):
        model.apply({"params": params, "cache": cache}, tokens[:, :1], decode=True, mutable=["cache"])
    with pytest.raises(ValueError, match=r"^decode=True: 1 token\(s\) from cache slot 6 overflow the cache's 6 slots"):
        model.apply({"params": params, "cache": cache}, tokens[:, :1], positions=jnp.array([[6]]), decode=True,
                    mutable=["cache"])


def test_generation_names_the_wrong_network_key_or_rows():
    """A config for its network, a T5 given to generate_causal (and a decoder to generate_seq2seq), an int for a
    key and ragged rows were AttributeErrors, a TypeError about `decode`, PRNG key data and NumPy's inhomogeneous
    shape."""
    model, params = tiny_decoder()
    t5 = T5ForConditionalGeneration(model_config("t5-small", head_size=16, **SIZES))
    refused = [(lambda: generate_causal(model.config, params, [[5, 6]], max_new_tokens=2),
                "generation takes the network (e.g. jaxlm.generate.model_for(config)), not a TransformerConfig"),
               (lambda: generate_causal(t5, {}, [[5, 6]], max_new_tokens=2),
                "generate_causal takes a decoder, which a t5 model is not: use generate_seq2seq, or generate"),
               (lambda: generate_seq2seq(model, params, [[5, 6]], max_new_tokens=2),
                "generate_seq2seq takes an encoder-decoder, which a llama model is not: use generate_causal"),
               (lambda: generate_causal(model, params, [[5, 6]], max_new_tokens=2, temperature=1.0, rng=0),
                "rng=0 is not a JAX random key; give one such as jax.random.key(0)"),
               (lambda: generate_causal(model, params, [[5, 6, 7], [8, 9]], max_new_tokens=2),
                "token ids must be [batch, length]: pad the rows to one length and give the mask")]
    for call, expected in refused:
        with pytest.raises(ValueError, match="^" + re.escape(expected)):
            call()
    legacy = generate_causal(model, params, [[5, 6]], max_new_tokens=2, temperature=1.0, rng=jax.random.PRNGKey(0))
    assert legacy.tokens.shape == (1, 2)


def test_rules_may_be_a_presets_name():
    """rules="fsdp" (mesh.rules' spelling) was "not enough values to unpack"."""
    model, params = tiny_decoder()
    mesh = jax.make_mesh((jax.device_count(), 1, 1), MESH_AXES)
    by_name = generate_causal(model, params, [[5, 6, 7]], max_new_tokens=3, mesh=mesh, rules="fsdp")
    np.testing.assert_array_equal(by_name.tokens, generate_causal(model, params, [[5, 6, 7]], max_new_tokens=3).tokens)


def test_decoding_without_a_cache_says_how_to_make_one():
    """It was flax's ScopeCollectionNotFound on "cached_key"."""
    model, params = tiny_decoder()
    with pytest.raises(ValueError, match=r"^decode=True needs a KV cache: make one with init\(\.\.\., decode=True\)"):
        model.apply({"params": params}, jnp.zeros((1, 1), jnp.int32), positions=jnp.zeros((1, 1), jnp.int32),
                    decode=True)


def test_encoder_states_of_another_batch_or_width_are_named():
    """States of batch 2 for decoder ids of batch 1 broadcast to two rows of logits; another width was flax's
    ScopeParamShapeError from the cross-attention's key."""
    t5 = T5ForConditionalGeneration(model_config("t5-small", head_size=16, **SIZES))
    ids = jnp.zeros((2, 4), jnp.int32)
    params = nn.unbox(t5.init(jax.random.key(0), ids, ids))["params"]
    states = t5.apply({"params": params}, ids, method="encode")
    assert t5.apply({"params": params}, ids, states, method="decode").shape == (2, 4, 100)
    for given, decoder_ids, expected in [
            (states, ids[:1], "encoder_states has shape (2, 4, 32); the decoder reads [batch, source length, "
                              "hidden_size] = [1, Ts, 32], as encode returns them for its 1 rows"),
            (states[..., :16], ids, "encoder_states has shape (2, 4, 16); the decoder reads")]:
        with pytest.raises(ValueError, match="^" + re.escape(expected)):
            t5.apply({"params": params}, decoder_ids, given, method="decode")
    with pytest.raises(ValueError, match=re.escape("padding_mask has shape (2, 3) and encoder_states (2, 4, 32)")):
        t5.apply({"params": params}, ids, states, jnp.ones((2, 3), bool), method="decode")
