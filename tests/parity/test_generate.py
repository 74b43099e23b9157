"""jaxlm.generate against Hugging Face `generate` (PyTorch, CPU, fp32): greedy and beam search on small
random GPT-2, Llama, T5 and BART models and on the real SmolLM2-135M GGUF, token for token; the scanned
and sharded paths; the sampler's statistics; the CLI; and bad input stopped before any compute."""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
stats = pytest.importorskip("scipy.stats")

from hf_models import (DECODERS, SEQ2SEQ, SEQ2SEQ_VOCAB, VOCAB, right_padded, smollm2_ours,  # noqa: E402
                       smollm2_transformers, torch_tensors)
from jaxlm import cli  # noqa: E402
from jaxlm import generate as gen  # noqa: E402
from jaxlm.convert.layout import stack_layers  # noqa: E402
from jaxlm.models.bart import BartForConditionalGeneration  # noqa: E402
from jaxlm.models.decoder import CausalLM  # noqa: E402
from jaxlm.models.t5 import T5ForConditionalGeneration  # noqa: E402
from jaxlm.parallel.rules import MESH_AXES, rules_for  # noqa: E402

NEW = 20
PROMPT_LENGTHS = (7, 3, 5)
SOURCE_LENGTHS = (9, 4)
NETWORKS = {"t5": T5ForConditionalGeneration, "bart": BartForConditionalGeneration}


def hf_new_tokens(model, ids, mask, pad, **kwargs) -> np.ndarray:
    """Hugging Face `generate`'s new tokens [B, NEW] (pad after early stops). Decoder prompts are given
    right-padded and left-padded here, as transformers needs them."""
    if not model.config.is_encoder_decoder:
        ids, mask = gen.left_pad(ids, mask, pad)
    with torch.no_grad():
        out = model.generate(input_ids=torch.from_numpy(ids.astype(np.int64)),
                             attention_mask=torch.from_numpy(mask.astype(np.int64)), max_new_tokens=NEW,
                             pad_token_id=pad, **kwargs).numpy()
    new = out[:, 1:] if model.config.is_encoder_decoder else out[:, ids.shape[1]:]
    return np.pad(new, ((0, 0), (0, NEW - new.shape[1])), constant_values=pad)


def assert_same(ours: gen.Generation, theirs: np.ndarray, eos: int, pad: int, what: str):
    print(f"{what}:\n{theirs}")
    np.testing.assert_array_equal(ours.tokens, theirs, err_msg=what)
    for row, length in zip(theirs, ours.lengths):
        ended = np.flatnonzero(row == eos)
        assert length == (ended[0] + 1 if ended.size else NEW)
        assert (row[length:] == pad).all()


def eos_inside(tokens: np.ndarray) -> int:
    """An id first emitted mid-way through row 0, to serve as EOS so rows and beams end early."""
    for i in range(2, NEW - 2):
        if tokens[0, i] not in tokens[0, :i]:
            return int(tokens[0, i])
    raise AssertionError(f"row 0 repeats one id throughout: {tokens[0]}")


# ---------------------------------------------------------------- decoders

@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request):
    """A random decoder, its weights shifted far enough (0.2) that greedy output is not one repeated id."""
    family = DECODERS[request.param]
    model = family.random_model(noise=0.2)
    config = family.config_from_hf(model.config.to_dict(), dtype="float32")
    return request.param, model, config, family.params_from_hf(torch_tensors(model), config)


@pytest.fixture(scope="module")
def prompts():
    return right_padded(PROMPT_LENGTHS, VOCAB, 0, np.random.default_rng(0), low=1)


@pytest.fixture(scope="module")
def greedy(decoder, prompts):
    """(ours, transformers') greedy tokens, EOS = 0 as the configs say."""
    name, model, config, params = decoder
    ours = gen.generate_causal(CausalLM(config), params, *prompts, max_new_tokens=NEW, eos_id=0, pad_id=0)
    return ours, hf_new_tokens(model, *prompts, pad=0, do_sample=False, eos_token_id=0)


def test_greedy_matches_transformers(decoder, greedy):
    ours, theirs = greedy
    assert_same(ours, theirs, eos=0, pad=0, what=f"{decoder[0]} greedy")
    assert len(np.unique(theirs)) > 6, "degenerate output: the test would prove little"


def test_eos_ends_rows_early_and_pads_them(decoder, prompts, greedy):
    name, model, config, params = decoder
    eos = eos_inside(greedy[1])
    ours = gen.generate_causal(CausalLM(config), params, *prompts, max_new_tokens=NEW, eos_id=eos, pad_id=0)
    assert_same(ours, hf_new_tokens(model, *prompts, pad=0, do_sample=False, eos_token_id=eos), eos, 0,
                f"{name} greedy, eos={eos}")
    assert ours.lengths[0] < NEW


@pytest.mark.parametrize("decoder", ["gpt2"], indirect=True)  # Llama scanned: the SmolLM2 test
def test_scan_layers_give_the_same_tokens(decoder, prompts, greedy):
    _, _, config, params = decoder
    scanned = CausalLM(dataclasses.replace(config, scan_layers=True))
    ours = gen.generate_causal(scanned, stack_layers(params), *prompts, max_new_tokens=NEW, eos_id=0, pad_id=0)
    np.testing.assert_array_equal(ours.tokens, greedy[0].tokens)


def mesh_2x2x2(axes: str) -> Mesh:
    """The 8 devices as a (data, fsdp, tensor) mesh: `Mesh`'s auto axes, or `jax.make_mesh`'s explicit ones,
    which generation once met with a sharding type error."""
    if axes == "auto":
        return Mesh(np.array(jax.devices()).reshape(2, 2, 2), MESH_AXES)
    return jax.make_mesh((2, 2, 2), MESH_AXES, axis_types=(AxisType.Explicit,) * 3)


@pytest.mark.parametrize("axes", ["auto", "explicit"])
def test_sharded_generation_gives_the_same_tokens(decoder, prompts, greedy, axes):
    _, _, config, params = decoder
    mesh = mesh_2x2x2(axes)
    ours = gen.generate_causal(CausalLM(config), params, *prompts, max_new_tokens=NEW, eos_id=0, pad_id=0,
                               mesh=mesh, rules=rules_for("fsdp_tp"))
    np.testing.assert_array_equal(ours.tokens, greedy[0].tokens)
    np.testing.assert_array_equal(ours.lengths, greedy[0].lengths)


@pytest.mark.parametrize("decoder", ["gpt2"], indirect=True)
@pytest.mark.parametrize("early_stopping", [True, "never"])
def test_beam_search_matches_transformers(decoder, prompts, greedy, early_stopping):
    name, model, config, params = decoder
    eos = eos_inside(greedy[1])
    ours = gen.generate_causal(CausalLM(config), params, *prompts, max_new_tokens=NEW, eos_id=eos, pad_id=0,
                               num_beams=3, early_stopping=early_stopping)
    theirs = hf_new_tokens(model, *prompts, pad=0, do_sample=False, num_beams=3, eos_token_id=eos,
                           early_stopping=early_stopping)
    assert_same(ours, theirs, eos, 0, f"{name} beam search, eos={eos}, early_stopping={early_stopping}")


# ---------------------------------------------------------------- encoder-decoders

@pytest.fixture(scope="module", params=sorted(SEQ2SEQ))
def seq2seq(request):
    family = SEQ2SEQ[request.param]
    model = family.random_model(0.2)
    config = family.config_from_hf(model.config.to_dict(), dtype="float32")
    inputs = right_padded(SOURCE_LENGTHS, SEQ2SEQ_VOCAB, config.pad_token_id, np.random.default_rng(0), low=3)
    params = family.params_from_hf(torch_tensors(model), config)
    return request.param, model, config, params, NETWORKS[request.param](config), inputs


def test_seq2seq_greedy_matches_transformers(seq2seq):
    name, model, config, params, ours_model, inputs = seq2seq
    ours = gen.generate_seq2seq(ours_model, params, *inputs, max_new_tokens=NEW)
    theirs = hf_new_tokens(model, *inputs, pad=config.pad_token_id, do_sample=False, forced_eos_token_id=None)
    assert_same(ours, theirs, config.eos_token_id, config.pad_token_id, f"{name} greedy")
    assert len(np.unique(theirs[0])) >= 3, "degenerate output: the test would prove little"


@pytest.mark.parametrize("length_penalty", [1.0, 2.0])
def test_seq2seq_beam_search_matches_transformers(seq2seq, length_penalty):
    name, model, config, params, ours_model, inputs = seq2seq
    pad = config.pad_token_id
    greedy = hf_new_tokens(model, *inputs, pad=pad, do_sample=False, forced_eos_token_id=None)
    eos = eos_inside(greedy)
    ours = gen.generate_seq2seq(ours_model, params, *inputs, max_new_tokens=NEW, num_beams=4, eos_id=eos,
                                length_penalty=length_penalty, early_stopping=True)
    theirs = hf_new_tokens(model, *inputs, pad=pad, do_sample=False, num_beams=4, eos_token_id=eos,
                           length_penalty=length_penalty, early_stopping=True, forced_eos_token_id=None)
    assert_same(ours, theirs, eos, pad, f"{name} beam search, eos={eos}, length_penalty={length_penalty}")


@pytest.mark.parametrize("seq2seq", ["t5"], indirect=True)
@pytest.mark.parametrize("axes", ["auto", "explicit"])
def test_sharded_seq2seq_beam_search_matches_transformers(seq2seq, axes):
    name, model, config, params, ours_model, inputs = seq2seq
    pad = config.pad_token_id
    eos = eos_inside(hf_new_tokens(model, *inputs, pad=pad, do_sample=False))
    mesh = mesh_2x2x2(axes)
    ours = gen.generate_seq2seq(ours_model, params, *inputs, max_new_tokens=NEW, num_beams=4, eos_id=eos,
                                mesh=mesh, rules=rules_for("fsdp_tp"))
    theirs = hf_new_tokens(model, *inputs, pad=pad, do_sample=False, num_beams=4, eos_token_id=eos,
                           early_stopping=True)
    assert_same(ours, theirs, eos, pad, f"{name} sharded beam search ({axes} axes), eos={eos}")


# ---------------------------------------------------------------- SmolLM2-135M from its GGUF

def test_smollm2_gguf_greedy_matches_transformers():
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate installed")
    from jaxlm.convert.gguf import gguf_tokenizer
    from jaxlm.corpora.models import smollm2_gguf_path

    config, params, info = smollm2_ours()
    tokenizer = gguf_tokenizer(smollm2_gguf_path())
    texts = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
             "It is a truth universally acknowledged, that a single man in possession of a good fortune,"]
    encoded = [tokenizer.encode(t).ids for t in texts]
    width = max(map(len, encoded))
    ids = np.array([e + [0] * (width - len(e)) for e in encoded])
    mask = np.arange(width)[None, :] < np.array([len(e) for e in encoded])[:, None]
    eos = info["eos_token_id"]
    scanned = CausalLM(dataclasses.replace(config, scan_layers=True))
    ours = gen.generate_causal(scanned, stack_layers(params), ids, mask, max_new_tokens=NEW, eos_id=eos, pad_id=0)
    theirs = hf_new_tokens(smollm2_transformers(), ids, mask, pad=0, do_sample=False, eos_token_id=eos)
    for text, tokens, length in zip(texts, ours.tokens, ours.lengths):
        print(repr(text), "->", repr(tokenizer.decode(tokens[:length].tolist(), skip_special_tokens=False)))
    assert_same(ours, theirs, eos, 0, "SmolLM2-135M greedy")
    assert "Paris" in tokenizer.decode(ours.tokens[0, :ours.lengths[0]].tolist())


# ---------------------------------------------------------------- the sampler

DRAWS = 20000


def frequencies(logits, **kwargs) -> np.ndarray:
    tokens = gen.sample_next(jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (DRAWS, len(logits))),
                             jax.random.key(0), **kwargs)
    return np.bincount(np.asarray(tokens), minlength=len(logits))


def assert_drawn_from(counts: np.ndarray, probs: np.ndarray):
    """Zero counts exactly where probs are zero; a chi-square goodness of fit on the rest."""
    np.testing.assert_array_equal(counts == 0, probs == 0)
    kept = probs > 0
    if kept.sum() == 1:
        return
    result = stats.chisquare(counts[kept], probs[kept] / probs[kept].sum() * counts.sum())
    print(f"counts {counts.tolist()}, expected {np.round(probs * counts.sum()).tolist()}, p={result.pvalue:.3f}")
    assert result.pvalue > 1e-3


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


LOGITS = np.log(np.array([0.30, 0.22, 0.16, 0.12, 0.08, 0.06, 0.04, 0.02]))


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_samples_follow_the_tempered_softmax(temperature):
    assert_drawn_from(frequencies(LOGITS, temperature=temperature), softmax(LOGITS / temperature))


def test_top_k_keeps_only_the_k_best_renormalised():
    expected = softmax(LOGITS / 0.8)
    expected[3:] = 0
    assert_drawn_from(frequencies(LOGITS, temperature=0.8, top_k=3), expected)


@pytest.mark.parametrize("top_p, kept", [(0.5, 2), (0.52, 2), (0.53, 3), (0.75, 4), (1.0, 8), (1e-6, 1)])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    """Mass of the best 1, 2, 3, 4 ids: 0.30, 0.52, 0.68, 0.80."""
    expected = np.exp(LOGITS)
    expected[kept:] = 0
    assert_drawn_from(frequencies(LOGITS, temperature=1.0, top_p=top_p), expected)


def test_top_k_applies_before_top_p():
    """After top-k=2 the renormalised mass is 0.58, 0.42: top_p=0.5 then keeps one id."""
    counts = frequencies(LOGITS, temperature=1.0, top_k=2, top_p=0.5)
    assert counts[0] == DRAWS


def test_filters_equal_transformers_warpers():
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                         TopPLogitsWarper)

    logits = np.random.default_rng(0).normal(scale=3.0, size=(16, 200)).astype(np.float32)
    for temperature, top_k, top_p in [(1.0, 5, 1.0), (0.7, 0, 0.9), (1.3, 50, 0.6), (0.5, 0, 0.3)]:
        scores = TemperatureLogitsWarper(temperature)(None, torch.from_numpy(logits))
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        scores = TopPLogitsWarper(top_p)(None, scores) if top_p < 1 else scores
        ours = jnp.asarray(logits) / temperature
        ours = gen.top_k_filter(ours, top_k) if top_k else ours
        ours = gen.top_p_filter(ours, top_p) if top_p < 1 else ours
        np.testing.assert_array_equal(np.isfinite(np.asarray(ours)), np.isfinite(scores.numpy()))


def test_temperature_zero_is_argmax_and_draws_are_deterministic():
    logits = jax.random.normal(jax.random.key(1), (64, 300))
    argmax = np.asarray(jnp.argmax(logits, -1))
    np.testing.assert_array_equal(gen.sample_next(logits, jax.random.key(2), 0.0, top_k=5, top_p=0.5), argmax)
    first = gen.sample_next(logits, jax.random.key(3), 1.0, top_k=50, top_p=0.9)
    np.testing.assert_array_equal(first, gen.sample_next(logits, jax.random.key(3), 1.0, top_k=50, top_p=0.9))
    assert (first != gen.sample_next(logits, jax.random.key(4), 1.0, top_k=50, top_p=0.9)).any()


@pytest.mark.parametrize("decoder", ["llama"], indirect=True)
def test_sampled_generation_is_reproducible_and_seed_dependent(decoder, prompts):
    _, _, config, params = decoder
    run = lambda seed: gen.generate_causal(CausalLM(config), params, *prompts, max_new_tokens=8, temperature=1.0,
                                           top_k=40, top_p=0.95, rng=jax.random.key(seed)).tokens
    np.testing.assert_array_equal(run(0), run(0))
    assert (run(0) != run(1)).any()


# ---------------------------------------------------------------- command line

def test_cli_prints_one_json_line_per_prompt(tmp_path, capsys):
    pytest.importorskip("gguf")
    from jaxlm.convert.gguf import gguf_tokenizer, save_tokenizer
    from jaxlm.convert.store import save_converted
    from jaxlm.corpora.models import smollm2_gguf_path

    tokenizer = gguf_tokenizer(smollm2_gguf_path())
    llama = DECODERS["llama"]
    model = llama.random_model(noise=0.05, vocab_size=tokenizer.get_vocab_size(), eos_token_id=2)
    config = llama.config_from_hf(model.config.to_dict(), dtype="float32", eos_token_id=2)
    params = llama.params_from_hf(torch_tensors(model), config)
    checkpoint = save_converted(tmp_path / "ckpt", config, params, save_tokenizer(tokenizer, tmp_path / "tok"))
    parser = cli.parser()
    prompts = ["It is a truth universally acknowledged", "Hello"]
    args = parser.parse_args(["generate", str(checkpoint), "--prompt", *prompts, "--max-new-tokens", "6"])
    args.handler(args)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt"] for line in lines] == prompts
    ids = [tokenizer.encode(p).ids for p in prompts]
    mask = [[True] * len(i) + [False] * (7 - len(i)) for i in ids]
    expected = gen.generate_causal(CausalLM(config), params, [i + [0] * (7 - len(i)) for i in ids], mask,
                                   max_new_tokens=6, eos_id=2)
    for line, tokens, length in zip(lines, expected.tokens, expected.lengths):
        assert line["token_ids"] == tokens[:length].tolist()
        assert line["generated"] == tokenizer.decode(line["token_ids"])
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    args = parser.parse_args(["generate", str(checkpoint), "--input", str(tmp_path / "prompts.txt"),
                              "--max-new-tokens", "6"])
    args.handler(args)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == lines
    assert cli.main(["generate", str(checkpoint), "--prompt", "Hello", ""]) == 2  # was "rows [1] have no tokens"
    assert capsys.readouterr().err == ("jaxlm generate: error: prompt 2 ('') gives the tokenizer no tokens; give each "
                                       "prompt some text to continue\n")


# ---------------------------------------------------------------- bad input

def test_prompt_beyond_the_learned_positions_is_rejected_before_compute(decoder):
    name, _, config, _ = decoder
    ids = np.ones((2, 50), np.int32)
    if name == "gpt2":  # params=None: any compute would fail with another error
        with pytest.raises(ValueError, match=r"prompt length 50 \+ max_new_tokens 20 = 70 .* 64 positions"):
            gen.generate_causal(CausalLM(config), None, ids, max_new_tokens=20)
    else:  # rotary positions have no table to overflow
        assert gen.position_capacity(config) is None


def test_other_bad_input_is_rejected_before_compute(seq2seq):
    name, _, config, _, model, _ = seq2seq
    with pytest.raises(ValueError, match=r"rows \[1\] have no tokens"):
        gen.generate_seq2seq(model, None, np.ones((2, 4)), np.array([[1, 1, 0, 0], [0, 0, 0, 0]]), max_new_tokens=4)
    with pytest.raises(ValueError, match="temperature=0 with num_beams"):
        gen.generate_seq2seq(model, None, np.ones((2, 4)), max_new_tokens=4, num_beams=2, temperature=1.0)
    with pytest.raises(ValueError, match=r"top_p=0.0 must lie in \(0, 1\]"):
        gen.generate_seq2seq(model, None, np.ones((2, 4)), max_new_tokens=4, temperature=1.0, top_p=0.0)
    if name == "bart":  # Hugging Face's max_position_embeddings=64 (our table holds 2 more: the offset)
        with pytest.raises(ValueError, match="input length 70 exceeds the model's 64 positions"):
            gen.generate_seq2seq(model, None, np.ones((1, 70)), max_new_tokens=4)
        with pytest.raises(ValueError, match="max_new_tokens 65 exceeds the model's 64 positions"):
            gen.generate_seq2seq(model, None, np.ones((1, 7)), max_new_tokens=65)
    encoder = dataclasses.replace(config, family="bert")
    with pytest.raises(ValueError, match="'bert' checkpoint is an encoder and cannot generate"):
        gen.model_for(encoder)
