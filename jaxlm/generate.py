"""Text generation on a KV cache: sampling, greedy and beam search for decoders and encoder-decoders."""
from __future__ import annotations

import functools
import math
import pathlib
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxlm import families
from jaxlm.corpora.text import check_file, check_plain_text, utf8_lines
from jaxlm.errors import first_line
from jaxlm.convert.store import checkpoint_config, load_checkpoint, no_tokenizer
from jaxlm.models.config import check_ids, check_special_ids
from jaxlm.parallel.mesh import batch_shards, mesh_and_rules
from jaxlm.train.state import device_memory

# Hugging Face's "never choose this" offset in beam search, kept identical so that beam choices match.
NEG = -1.0e9
FLOAT32_RANGE = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)  # the logits / temperature
COUNT_LIMIT = 2 ** 31  # token counts and positions are int32 in the jitted loop


class Generation(NamedTuple):
    tokens: np.ndarray  # [batch, max_new_tokens] int32, pad after each row's length
    lengths: np.ndarray  # [batch] tokens generated per row, its EOS included


class Settings(NamedTuple):
    """Everything static about one generation call (part of the jit cache key)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    num_beams: int = 1
    early_stopping: bool | str = True
    rules: tuple | None = None


class Knobs(NamedTuple):
    """The traced scalars of a call, so that changing them does not recompile."""

    eos: jax.Array  # int32, -1: none
    pad: jax.Array  # int32
    length_penalty: jax.Array  # float32


# ---------------------------------------------------------------- sampling

def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
    """Logits below the k-th largest set to -inf (ties with it kept), as Hugging Face's TopKLogitsWarper."""
    kth = jax.lax.top_k(logits, min(k, logits.shape[-1]))[0][..., -1:]
    return jnp.where(logits < kth, -jnp.inf, logits)


def top_p_filter(logits: jax.Array, p: float) -> jax.Array:
    """Keeps the smallest set of most likely tokens whose probability reaches p (at least one)."""
    ordered = jnp.sort(logits, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(ordered, axis=-1)
    kept = jnp.sum(jnp.cumsum(probs, axis=-1) - probs < p, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(ordered, jnp.maximum(kept, 1) - 1, axis=-1)
    return jnp.where(logits < threshold, -jnp.inf, logits)


def sample_next(logits: jax.Array, rng: jax.Array, temperature: float = 0.0, top_k: int = 0,
                top_p: float = 1.0) -> jax.Array:
    """Next ids [B] from logits [B, V]: argmax at temperature 0, else a draw from softmax(logits / T)
    after top-k, then top-p filtering (Hugging Face's order)."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32)
    # the best at 0 before dividing: a small temperature sends the others to -inf, not the best to inf (then NaN)
    logits = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature
    if top_k > 0:
        logits = top_k_filter(logits, top_k)
    if top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def check_sampling(temperature: float, top_k: int, top_p: float, num_beams: int = 1) -> None:
    if not 0 <= temperature < math.inf:
        raise ValueError(f"temperature={temperature} must be a number >= 0 (0 is greedy)")
    tiny, largest = FLOAT32_RANGE
    if 0 < temperature < tiny or temperature > largest:
        raise ValueError(f"temperature={temperature} is outside float32's range, in which the logits are divided: "
                         f"use 0 for greedy, or a temperature from {tiny:.2g} to {largest:.2g}")
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 0 (0 keeps every token)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must lie in (0, 1]")
    if num_beams < 1:
        raise ValueError(f"num_beams={num_beams} must be >= 1")
    if num_beams > 1 and temperature > 0:
        raise ValueError("beam search is deterministic here: pass temperature=0 with num_beams > 1")
    filters = (("top_k", top_k, top_k > 0), ("top_p", f"{top_p:g}", top_p < 1))
    narrowing = {name: value for name, value, narrows in filters if narrows}
    if temperature == 0 and narrowing:
        settings = " and ".join(f"{name}={value}" for name, value in narrowing.items())
        raise ValueError(f"{settings} narrow{'s' * (len(narrowing) == 1)} the tokens a sample is drawn from, and "
                         "temperature=0 draws none (greedy, or beam search): give a temperature above 0 to sample, "
                         f"or leave {' and '.join(narrowing)} out")


# ---------------------------------------------------------------- decoding loops

Step = Callable  # (cache, tokens [B, 1], positions [B, 1]) -> (logits [B, V], cache)


def _sample_loop(step: Step, logits, cache, base, rng, knobs: Knobs, s: Settings):
    """Token by token from the prefill's logits [B, V] until max_new_tokens or every row has emitted
    EOS; token i is fed back at position base + i. Finished rows emit pad."""
    batch, count = logits.shape[0], s.max_new_tokens

    def pick(logits, i, done):
        token = sample_next(logits, jax.random.fold_in(rng, i), s.temperature, s.top_k, s.top_p)
        return jnp.where(done, knobs.pad, token)

    token = pick(logits, 0, jnp.zeros(batch, bool))
    tokens = jnp.full((batch, count), knobs.pad, jnp.int32).at[:, 0].set(token)
    state = (jnp.int32(1), token, cache, tokens, token == knobs.eos, jnp.ones(batch, jnp.int32))

    def cond(state):
        i, _, _, _, done, _ = state
        return (i < count) & ~jnp.all(done)

    def body(state):
        i, token, cache, tokens, done, lengths = state
        logits, cache = step(cache, token[:, None], (base + i - 1)[:, None])
        token = pick(logits, i, done)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], i, axis=1)
        return i + 1, token, cache, tokens, done | (token == knobs.eos), lengths + ~done

    _, _, _, tokens, _, lengths = jax.lax.while_loop(cond, body, state)
    return tokens, lengths


def _gather(x, index):
    """x [B, K, ...] at beam indices [B, J] -> [B, J, ...]."""
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def _beam_update(state: dict, logits, t, knobs: Knobs, s: Settings) -> dict:
    """One step of Hugging Face's vectorised beam search (`GenerationMixin._beam_search`): logits
    [B*K, V] of new token t -> the best K running beams and the best K finished hypotheses so far."""
    k, count, lp = s.num_beams, s.max_new_tokens, knobs.length_penalty
    batch = state["scores"].shape[0]
    vocab = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(batch, k, vocab)
    log_probs = (log_probs + state["running_scores"][:, :, None]).reshape(batch, k * vocab)
    top_scores, top_index = jax.lax.top_k(log_probs, 2 * k)
    source, top_tokens = top_index // vocab, top_index % vocab
    top_seqs = _gather(state["running"], source).at[:, :, t].set(top_tokens)
    hits = (top_tokens == knobs.eos) | (t + 1 >= count)

    live = top_scores + hits.astype(jnp.float32) * NEG
    keep = jax.lax.top_k(live, k)[1]
    running, running_scores = _gather(top_seqs, keep), _gather(live, keep)

    just = hits & (jnp.arange(2 * k) < k)[None, :]
    candidates = top_scores / jnp.asarray(t + 1, jnp.float32) ** lp
    full = jnp.all(state["finished"], axis=-1, keepdims=True) & (s.early_stopping is True)
    candidates = candidates + full.astype(jnp.float32) * NEG
    candidates = candidates + (~state["improvable"]).astype(jnp.float32) * NEG
    candidates = candidates + (~just).astype(jnp.float32) * NEG
    merged = {"seqs": jnp.concatenate([state["seqs"], top_seqs], axis=1),
              "scores": jnp.concatenate([state["scores"], candidates], axis=1),
              "finished": jnp.concatenate([state["finished"], just], axis=1),
              "lengths": jnp.concatenate([state["lengths"], jnp.full_like(just, t + 1, jnp.int32)], axis=1)}
    best = jax.lax.top_k(merged["scores"], k)[1]
    out = {name: _gather(value, best) for name, value in merged.items()}

    generated = jnp.where((s.early_stopping == "never") & (lp > 0), count, t + 1)
    best_running = running_scores[:, :1] / generated.astype(jnp.float32) ** lp
    worst = jnp.where(out["finished"], jnp.min(out["scores"], axis=1, keepdims=True), NEG)
    improvable = state["improvable"] & jnp.any(best_running > worst, axis=-1, keepdims=True)
    go = (jnp.any(improvable) & ~(jnp.all(out["finished"]) & (s.early_stopping is True)) & ~jnp.all(hits))
    return {**out, "running": running, "running_scores": running_scores, "improvable": improvable,
            "parent": _gather(source, keep), "go": go}


def _beam_loop(step: Step, logits, cache, base, batch_axes, knobs: Knobs, s: Settings):
    """Beam search from the prefill's logits [B*K, V] over a cache of B*K rows (each row's K copies
    adjacent); returns the best hypothesis per row, padded, and its length."""
    k, count = s.num_beams, s.max_new_tokens
    batch = logits.shape[0] // k
    running_scores = jnp.zeros((batch, k), jnp.float32).at[:, 1:].set(NEG)
    state = {"running": jnp.full((batch, k, count), knobs.pad, jnp.int32), "running_scores": running_scores,
             "seqs": jnp.full((batch, k, count), knobs.pad, jnp.int32), "scores": jnp.full((batch, k), NEG),
             "finished": jnp.zeros((batch, k), bool), "lengths": jnp.zeros((batch, k), jnp.int32),
             "improvable": jnp.ones((batch, 1), bool)}
    state = _beam_update(state, logits, 0, knobs, s)
    rows = jnp.arange(batch)[:, None] * k

    def reorder(cache, parent):
        flat = (rows + parent).reshape(-1)
        return jax.tree.map(lambda c, axis: c if axis is None else jnp.take(c, flat, axis=axis), cache, batch_axes)

    def cond(carry):
        t, state, _ = carry
        return state["go"] & (t < count)

    def body(carry):
        t, state, cache = carry
        cache = reorder(cache, state["parent"])
        tokens = jax.lax.dynamic_index_in_dim(state["running"], t - 1, axis=2, keepdims=False).reshape(-1)
        logits, cache = step(cache, tokens[:, None], (base + t - 1)[:, None])
        return t + 1, _beam_update(state, logits, t, knobs, s), cache

    _, state, _ = jax.lax.while_loop(cond, body, (jnp.int32(1), state, cache))
    return state["seqs"][:, 0], state["lengths"][:, 0]


# ---------------------------------------------------------------- cache helpers

def _zeros_like_tree(shapes):
    return jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)


def _batch_axes(cache_shapes: Callable[[int], object]):
    """Per cache leaf, the axis that grows with the batch (None for leaves without one, e.g. the index):
    found by comparing the abstract caches of batches 1 and 2, so the cache stays opaque."""
    def axis(one, two):
        found = [i for i, (a, b) in enumerate(zip(one.shape, two.shape)) if a != b]
        return found[0] if found else None

    return jax.tree.map(axis, cache_shapes(1), cache_shapes(2))


def _repeat(tree, batch_axes, k: int):
    return jax.tree.map(lambda c, axis: c if axis is None else jnp.repeat(c, k, axis=axis), tree, batch_axes)


def _search(step: Step, logits, cache, base, batch_axes, rng, knobs: Knobs, s: Settings, repeat_step: Callable):
    """Sampling/greedy, or beam search after expanding the prefilled batch to K copies per row."""
    if s.num_beams == 1:
        return _sample_loop(step, logits, cache, base, rng, knobs, s)
    k = s.num_beams
    return _beam_loop(repeat_step(k), jnp.repeat(logits, k, axis=0), _repeat(cache, batch_axes, k),
                      jnp.repeat(base, k), batch_axes, knobs, s)


# ---------------------------------------------------------------- jitted programs

def _causal_cache(model, params, rows: int, slots: int):
    """The shapes of a decoder's KV cache for `rows` sequences of `slots` positions."""
    sizing = lambda p: model.apply({"params": p}, jnp.zeros((rows, slots), jnp.int32), decode=True,
                                   mutable=["cache"])[1]["cache"]
    return jax.eval_shape(sizing, params)


def _seq2seq_cache(model, params, rows: int, new_tokens: int, states, mask):
    """The shapes of an encoder-decoder's decoder cache (its cross-attention's keys and values included) for
    `rows` sequences of `new_tokens` positions, given one row's encoder `states` and `mask` (shapes suffice)."""
    sizing = lambda p, st, m: model.apply({"params": p}, jnp.zeros((rows, new_tokens), jnp.int32), st, m,
                                          decode=True, method="decode", mutable=["cache"])[1]["cache"]
    return jax.eval_shape(sizing, params, jax.ShapeDtypeStruct((rows,) + states.shape[1:], states.dtype),
                          jax.ShapeDtypeStruct((rows,) + mask.shape[1:], mask.dtype))


def _causal_program(model, params, ids, mask, rng, knobs: Knobs, s: Settings):
    """Left-padded prompts [B, T] -> (new tokens [B, N], lengths [B]): one prefill, then the loop."""
    batch, width = ids.shape
    cache_shapes = lambda b: _causal_cache(model, params, b, width + s.max_new_tokens)
    cache_mask = jnp.concatenate([mask, jnp.ones((batch, s.max_new_tokens), bool)], axis=1)

    def make_step(cache_mask):
        def step(cache, tokens, positions):
            logits, variables = model.apply({"params": params, "cache": cache}, tokens, positions,
                                            padding_mask=cache_mask, decode=True, mutable=["cache"])
            return logits[:, -1], variables["cache"]
        return step

    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    logits, cache = make_step(cache_mask)(_zeros_like_tree(cache_shapes(batch)), ids, positions)
    batch_axes = _batch_axes(cache_shapes) if s.num_beams > 1 else None
    base = jnp.sum(mask, axis=1).astype(jnp.int32)
    return _search(make_step(cache_mask), logits, cache, base, batch_axes, rng, knobs, s,
                   lambda k: make_step(jnp.repeat(cache_mask, k, axis=0)))


def _seq2seq_program(model, params, ids, mask, rng, knobs: Knobs, start_id: int, s: Settings):
    """Encoder inputs [B, Ts] -> (new tokens [B, N], lengths [B]): encode once, decode on the cache."""
    batch = ids.shape[0]
    states = model.apply({"params": params}, ids, mask, method="encode")
    cache_shapes = lambda b: _seq2seq_cache(model, params, b, s.max_new_tokens, states, mask)

    def make_step(states, mask):
        def step(cache, tokens, positions):
            logits, variables = model.apply({"params": params, "cache": cache}, tokens, states, mask,
                                            decoder_positions=positions, decode=True, method="decode",
                                            mutable=["cache"])
            return logits[:, -1], variables["cache"]
        return step

    start = jnp.full((batch, 1), start_id, jnp.int32)
    logits, cache = make_step(states, mask)(_zeros_like_tree(cache_shapes(batch)), start, jnp.zeros_like(start))
    batch_axes = _batch_axes(cache_shapes) if s.num_beams > 1 else None
    return _search(make_step(states, mask), logits, cache, jnp.ones(batch, jnp.int32), batch_axes, rng, knobs, s,
                   lambda k: make_step(jnp.repeat(states, k, axis=0), jnp.repeat(mask, k, axis=0)))


_causal_jit = jax.jit(_causal_program, static_argnames=("model", "s"))
_seq2seq_jit = jax.jit(_seq2seq_program, static_argnames=("model", "start_id", "s"))


# ---------------------------------------------------------------- host side: checks, padding, placement

def _check_generator(model, generates: str | None = None) -> str:
    """How `model` generates ("causal", "seq2seq"); a ValueError unless it is a network of a family that generates,
    as `generates` where that is given."""
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise ValueError(f"generation takes the network (e.g. jaxlm.generate.model_for(config)), not a "
                         f"{type(model).__name__}")
    family = model.config.family
    how = families.get(family).generates
    if not how:
        raise _not_generative(family)
    if generates is not None and how != generates:
        wanted = {"causal": "a decoder", "seq2seq": "an encoder-decoder"}
        raise ValueError(f"generate_{generates} takes {wanted[generates]}, which a {family} model is not: use "
                         f"generate_{how}, or generate, which picks by the model's family")
    return how


def _check_rng(rng) -> None:
    """A ValueError unless `rng` is None or a JAX random key (new-style or the raw uint32[2] kind)."""
    if rng is None:
        return
    dtype, shape = getattr(rng, "dtype", None), getattr(rng, "shape", None)
    if dtype is not None and (jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) or (dtype, shape) == (np.uint32, (2,))):
        return
    raise ValueError(f"rng={rng!r} is not a JAX random key; give one such as jax.random.key(0)")


def _as_batch(ids, mask, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        ids = np.asarray(ids)
    except ValueError:  # NumPy's "inhomogeneous shape"
        raise ValueError("token ids must be [batch, length]: pad the rows to one length and give the mask (true at "
                         "real tokens)") from None
    if ids.ndim != 2:
        raise ValueError(f"token ids must be [batch, length], not shape {ids.shape}")
    mask = np.ones(ids.shape, bool) if mask is None else np.asarray(mask).astype(bool)
    if mask.shape != ids.shape:
        raise ValueError(f"mask shape {mask.shape} differs from the ids' shape {ids.shape}")
    empty = np.flatnonzero(mask.sum(axis=1) == 0)
    if empty.size:
        raise ValueError(f"rows {empty.tolist()} have no tokens; every row needs at least one")
    check_ids(np.where(mask, ids, 0), vocab_size, lambda at: f"prompt {at[0]}, token {at[1]}")
    return ids.astype(np.int32), mask


def left_pad(ids, mask, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's real tokens moved to the right end of a batch as wide as the longest row."""
    lengths = mask.sum(axis=1)
    width = int(lengths.max())
    out = np.full((ids.shape[0], width), pad_id, np.int32)
    for row, (tokens, keep) in enumerate(zip(ids, mask)):
        out[row, width - lengths[row]:] = tokens[keep]
    return out, np.arange(width)[None, :] >= (width - lengths)[:, None]


def position_capacity(config) -> int | None:
    """How many positions a sequence may use (None: unbounded, relative or rotary positions)."""
    if config.position_embedding != "learned":
        return None
    return config.max_position_embeddings - config.position_offset


def _knobs(eos_id: int | None, pad_id: int, length_penalty: float) -> Knobs:
    return Knobs(jnp.int32(-1 if eos_id is None else eos_id), jnp.int32(pad_id), jnp.float32(length_penalty))


def _check_counts(max_new_tokens: int, rows: int, early_stopping) -> None:
    if not 1 <= max_new_tokens < COUNT_LIMIT:
        raise ValueError(f"max_new_tokens={max_new_tokens} must lie in [1, 2**31)")
    if rows < 1:
        raise ValueError("no prompts to generate from")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping={early_stopping!r}; choose True, False or 'never'")


def _place(mesh, rules, params, abstract_init: Callable, arrays: list[np.ndarray]):
    """Params by their logical names, the batch over the data axes (rows padded with copies of row 0
    to a multiple of the batch shards; drop them from the outputs)."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(abstract_init)["params"]
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    params = jax.tree.map(jax.device_put, params, shardings)
    rows = arrays[0].shape[0]
    extra = -rows % batch_shards(mesh, rules)
    batch_sharding = NamedSharding(mesh, PartitionSpec(nn.logical_to_mesh_axes(("batch",), rules)[0]))
    arrays = [jax.device_put(np.concatenate([a, np.repeat(a[:1], extra, axis=0)]), batch_sharding) for a in arrays]
    return params, arrays


def _needs_more_memory(rows: int, width: int, s: Settings, why: str) -> ValueError:
    return ValueError(f"{rows} prompt(s) of up to {width} tokens, {s.max_new_tokens} new tokens and {s.num_beams} "
                      f"beam(s) need more memory than the device has ({why}); ask for fewer new tokens, prompts or "
                      "beams")


@functools.lru_cache(maxsize=64)
def _cache_bytes(model, signature, rows: int, width: int, new_tokens: int) -> int:
    """Bytes of the KV cache that generating `new_tokens` after `rows` inputs of `width` tokens keeps (`rows`: every
    beam's), from the shapes alone; once per shape, since tracing the model takes a large one most of a second.
    `signature`: (tree, ShapeDtypeStructs) of the parameters, `_signature`'s."""
    params = jax.tree.unflatten(*signature)
    if families.get(model.config.family).generates == "causal":
        cache = _causal_cache(model, params, rows, width + new_tokens)
    else:
        ids, mask = jax.ShapeDtypeStruct((rows, width), jnp.int32), jax.ShapeDtypeStruct((rows, width), bool)
        states = jax.eval_shape(lambda p, i, m: model.apply({"params": p}, i, m, method="encode"), params, ids, mask)
        cache = _seq2seq_cache(model, params, rows, new_tokens, states, mask)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(cache))


def _signature(params) -> tuple:
    """The parameters' tree and shapes, hashable."""
    leaves, tree = jax.tree.flatten(params)
    return tree, tuple(jax.ShapeDtypeStruct(jnp.shape(leaf), jnp.result_type(leaf)) for leaf in leaves)


def _check_cache_fits(model, params, ids, s: Settings, mesh, rules) -> None:
    """A ValueError before anything compiles where the KV cache alone (every beam's rows) outgrows a device, the
    batch split over the mesh's data axes (without a mesh, one device holds it all)."""
    have = device_memory(sharing=1 if mesh is None else mesh.size)
    if have is None:
        return
    shards = 1 if mesh is None else batch_shards(*mesh_and_rules(mesh, rules))
    rows, width = ids.shape
    need = _cache_bytes(model, _signature(params), rows * s.num_beams, width, s.max_new_tokens) / shards
    if need > have[0]:
        raise _needs_more_memory(rows, width, s, f"the KV cache alone takes {need / 2**30:,.1f} GiB per device, more "
                                 f"than the {have[0] / 2**30:,.1f} GiB of {have[1]}")


def _run(jitted, model, params, arrays, rng, knobs: Knobs, mesh, rules, abstract_init, **static) -> Generation:
    rows = arrays[0].shape[0]
    rng = jax.random.key(0) if rng is None else rng
    try:
        if mesh is None:
            tokens, lengths = jitted(model, params, *arrays, rng, knobs, **static)
        else:
            mesh, rules = mesh_and_rules(mesh, rules)
            params, arrays = _place(mesh, rules, params, abstract_init, arrays)
            static["s"] = static["s"]._replace(rules=rules)
            with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
                tokens, lengths = jitted(model, params, *arrays, rng, knobs, **static)
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)  # where a failed run's error surfaces
    except jax.errors.JaxRuntimeError as err:
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        raise _needs_more_memory(rows, arrays[0].shape[1], static["s"], first_line(err)) from None
    return Generation(tokens[:rows], lengths[:rows])


def generate_causal(model, params, prompt_ids, prompt_mask=None, *, max_new_tokens: int, eos_id: int | None = None,
                    pad_id: int | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                    num_beams: int = 1, length_penalty: float = 1.0, early_stopping: bool | str = True,
                    rng: jax.Array | None = None, mesh=None, rules=None) -> Generation:
    """New tokens after each prompt from a `CausalLM`. Prompts [B, T] may be padded anywhere
    (`prompt_mask` true at real tokens); they are left-padded, prefilled in one call, then extended one
    token at a time inside one jitted loop that stops once every row has emitted `eos_id`.
    `num_beams > 1` is Hugging Face's beam search. With `mesh`, params are placed by their logical axis names
    under `rules` (default: MeshConfig's preset) and the batch split over the data axes. `eos_id` and `pad_id`
    default to the config's (as transformers' generate: its eos_token_id ends a row)."""
    _check_generator(model, "causal")
    _check_rng(rng)
    ids, mask = _as_batch(prompt_ids, prompt_mask, model.config.vocab_size)
    _check_counts(max_new_tokens, ids.shape[0], early_stopping)
    check_sampling(temperature, top_k, top_p, num_beams)
    config = model.config
    longest = int(mask.sum(axis=1).max())
    capacity = position_capacity(config)
    if capacity is not None and longest + max_new_tokens > capacity:
        raise ValueError(
            f"prompt length {longest} + max_new_tokens {max_new_tokens} = {longest + max_new_tokens} exceeds the "
            f"model's {capacity} positions (model.max_position_embeddings={config.max_position_embeddings}); "
            "shorten the prompt or ask for fewer tokens")
    pad_id = config.pad_token_id if pad_id is None else pad_id
    eos_id = config.eos_token_id if eos_id is None else eos_id
    check_special_ids(config.vocab_size, eos_id=eos_id, pad_id=pad_id)
    ids, mask = left_pad(ids, mask, pad_id)
    s = Settings(max_new_tokens, float(temperature), top_k, float(top_p), num_beams, early_stopping)
    _check_cache_fits(model, params, ids, s, mesh, rules)
    init = lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
    return _run(_causal_jit, model, params, [ids, mask], rng, _knobs(eos_id, pad_id, length_penalty), mesh, rules,
                init, s=s)


def generate_seq2seq(model, params, input_ids, input_mask=None, *, max_new_tokens: int, eos_id: int | None = None,
                     decoder_start_id: int | None = None, pad_id: int | None = None, num_beams: int = 1,
                     length_penalty: float = 1.0, early_stopping: bool | str = True, temperature: float = 0.0,
                     top_k: int = 0, top_p: float = 1.0, rng: jax.Array | None = None, mesh=None,
                     rules=None) -> Generation:
    """Decoder tokens after `decoder_start_id` from an encoder-decoder (T5, BART) given encoder inputs
    [B, Ts] (`input_mask` true at real tokens): encode once, then greedy, sampling or beam search on the
    decoder's KV cache. `eos_id`, `decoder_start_id` and `pad_id` default to the config's."""
    _check_generator(model, "seq2seq")
    _check_rng(rng)
    ids, mask = _as_batch(input_ids, input_mask, model.config.vocab_size)
    _check_counts(max_new_tokens, ids.shape[0], early_stopping)
    check_sampling(temperature, top_k, top_p, num_beams)
    config = model.config
    capacity = position_capacity(config)
    for what, length in (("input length", ids.shape[1]), ("max_new_tokens", max_new_tokens)):
        if capacity is not None and length > capacity:
            raise ValueError(f"{what} {length} exceeds the model's {capacity} positions "
                             f"(model.max_position_embeddings={config.max_position_embeddings})")
    eos_id = config.eos_token_id if eos_id is None else eos_id
    start = config.decoder_start_token_id if decoder_start_id is None else decoder_start_id
    pad_id = config.pad_token_id if pad_id is None else pad_id
    check_special_ids(config.vocab_size, eos_id=eos_id, decoder_start_id=start, pad_id=pad_id)
    s = Settings(max_new_tokens, float(temperature), top_k, float(top_p), num_beams, early_stopping)
    _check_cache_fits(model, params, ids, s, mesh, rules)
    dummy = jnp.zeros((1, 1), jnp.int32)
    init = lambda: model.init(jax.random.key(0), dummy, dummy)
    return _run(_seq2seq_jit, model, params, [ids, mask], rng, _knobs(eos_id, pad_id, length_penalty), mesh, rules,
                init, s=s, start_id=int(start))


def _not_generative(family: str) -> ValueError:
    return ValueError(f"a {family!r} checkpoint is an encoder and cannot generate text; generation needs a "
                      f"decoder ({', '.join(families.names(generates='causal'))}) or an encoder-decoder "
                      f"({', '.join(families.names(generates='seq2seq'))})")


GENERATORS = {"causal": generate_causal, "seq2seq": generate_seq2seq}


def generate(model, params, ids, mask=None, **kwargs) -> Generation:
    """`generate_causal` or `generate_seq2seq`, by what the model's family generates."""
    return GENERATORS[_check_generator(model)](model, params, ids, mask, **kwargs)


def model_for(config):
    """The generating network of a config's family: CausalLM, T5ForConditionalGeneration, ..."""
    family = families.get(config.family)
    if not family.generates:
        raise _not_generative(config.family)
    return family.network(config)


def read_prompts(path) -> list[str]:
    """The non-blank lines of a prompt file."""
    path = pathlib.Path(path)
    check_file(path, "prompt file", "give a text file, one prompt per line")
    check_plain_text(path, "prompt file")
    prompts = [line for line in utf8_lines(path) if line.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompts (one per line)")
    return prompts


def _eos_id(config, tokenizer) -> int | None:
    if config.eos_token_id >= 0:
        return config.eos_token_id
    found = getattr(tokenizer, "eos_token_id", None)
    return found if isinstance(found, int) and found >= 0 else None


def generate_from_checkpoint(checkpoint, prompts: list[str], *, max_new_tokens: int = 32, temperature: float = 0.0,
                             top_k: int = 0, top_p: float = 1.0, num_beams: int = 1, seed: int = 0) -> list[dict]:
    """{"prompt", "generated" text, "token_ids"} per prompt, from a converted or run checkpoint and its
    tokenizer; every argument is checked before the parameters are read."""
    check_sampling(temperature, top_k, top_p, num_beams)
    _check_counts(max_new_tokens, len(prompts), True)
    if not 0 <= seed < 2 ** 31:
        raise ValueError(f"seed={seed} must lie in [0, 2**31)")
    config, checkpoint_tokenizer = checkpoint_config(checkpoint)
    if num_beams * config.vocab_size >= 2 ** 31:  # beam search ranks every beam's every next token in int32
        raise ValueError(f"num_beams={num_beams} is too many for a vocabulary of {config.vocab_size:,}: at most "
                         f"{(2 ** 31 - 1) // config.vocab_size:,}")
    model = model_for(config)
    if checkpoint_tokenizer is None:
        raise no_tokenizer(checkpoint, "the prompts cannot become ids")
    tokenizer = checkpoint_tokenizer.load()
    encoded = [list(tokenizer.encode(p, add_special_tokens=True)) for p in prompts]
    empty = next((index for index, e in enumerate(encoded) if not e), None)
    if empty is not None:
        raise ValueError(f"prompt {empty + 1} ({prompts[empty]!r}) gives the tokenizer no tokens; give each prompt "
                         "some text to continue")
    _, params, _ = load_checkpoint(checkpoint)
    width = max(len(e) for e in encoded)
    pad = config.pad_token_id
    ids = np.array([e + [pad] * (width - len(e)) for e in encoded], np.int32)
    mask = np.array([[True] * len(e) + [False] * (width - len(e)) for e in encoded])
    result = generate(model, params, ids, mask, max_new_tokens=max_new_tokens, eos_id=_eos_id(config, tokenizer),
                      temperature=temperature, top_k=top_k, top_p=top_p, num_beams=num_beams,
                      rng=jax.random.key(seed))
    out = []
    for prompt, tokens, length in zip(prompts, result.tokens, result.lengths):
        new = [int(t) for t in tokens[:length]]
        out.append({"prompt": prompt, "generated": tokenizer.decode(new), "token_ids": new})
    return out
