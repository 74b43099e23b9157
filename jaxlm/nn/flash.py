"""Flash attention for GPUs in Pallas (Triton) behind `dot_product_attention(kernel="flash")`: a logit bias shared
by the batch (T5's relative positions) with its gradient, key padding, causal masks and attention dropout, all
inside the kernels, so that no [batch, heads, q, k] tensor reaches memory (but the bias's gradient's, below).

Three kernels: the forward pass (one program per block of queries, example and head; online softmax over the
key blocks), the keys' and values' gradients (one per block of keys, example and head) and the queries'
gradients (one per block of queries, head and example). With a bias (BIAS_GRADIENT; "stored" was the fastest of the
three on an H200, `bench/attention_kernels.py --sweep`), "stored": the keys' and values' kernel also writes the
logits' gradient in the queries' dtype, from which XLA computes dq (a batched matmul, in place of the third
kernel) and the bias's gradient (its sum over the batch in float32); a [batch, heads, q, k] tensor in memory
for the backward pass, as the xla kernel writes, in return for a pass over the tiles fewer. "fused": the
queries' kernel sums the bias's gradient over the batch in registers, a chunk of the batch at a time, the chunks'
sums added by XLA (keys longer than GROUP_BLOCKS blocks in groups, whose dq XLA adds). "separate": a fourth
kernel for the bias's gradient. None uses atomics, so every run gives the same sums. The block index is the
grid's first axis, the one GPUs launch fastest, so that the programs running together read the same keys and
values (or queries) and find them in L2.

Lengths are padded to the block size; padded keys are masked, padded queries dropped. A row that sees no key
attends uniformly to every key of the real length, as the xla kernel's does, and its logits get no gradient;
under a causal mask it averages only the keys up to its block (the xla kernel: all of them).

Dropout keeps the attention weight of (example b, head h, query i, key j) when 16 bits of a hash of (the
dropout key, b, h, i, j) fall below round(keep_prob * 65536), as `jaxlm.nn.dropout` compares its threefry
draws, and divides by that kept fraction; `keep_mask` computes the same bits outside the kernels (tests). The
hash is two rounds of `lowbias32` (Wellons's 32-bit integer hash), about 20 integer operations a weight (as many
as `jaxlm.nn.dropout` spends: a threefry block of about 80 for four draws), done again by each backward kernel,
with nothing written to memory. Under a mesh the kernels run per shard (`jax.shard_map`, split as the flax
rules place batch and heads) and hash global indices, so the masks do not depend on the mesh. Called inside a
`shard_map` of the caller's, the manual mesh axes that the active rules give the batch and the heads count as
splitting them, so the masks still hash global indices; the other manual axes hold replicas, with the same masks.

Built for the CPU (the tests) the kernels run in Pallas interpret mode, slow and for checking numbers only.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec

from jaxlm.nn.dropout import LEVELS, hashed_bits, hashed_keep, keep_threshold, seed_words
from jaxlm.nn.splash import batch_and_head_axes, placed_batch_and_heads, shard_map_automatic, spec_axis
from jaxlm.parallel.logical import axis_tuple, target_platform

BLOCK = 64  # queries and keys per tile; lengths are padded to a multiple
DQ_BLOCK = 16  # queries per program of the kernel that sums the bias's gradient: [16, 64 * GROUP_BLOCKS] floats live
LOG2E = math.log2(math.e)  # the kernels work in base 2: exp(x) = exp2(x * log2(e))
MASKED = float(np.finfo(np.float32).min)  # as the xla kernel masks: a row with no real key attends uniformly
BIAS_CHUNKS = 4  # the batch's chunks whose bias gradients are summed separately (more programs, more partial sums)
# key blocks whose bias gradients one program keeps in registers (and whose keys and values Triton buffers in
# shared memory: 12 blocks overflow an H100's); longer keys are split into groups, their dq summed by XLA
GROUP_BLOCKS = 8
# each kernel's warps and software-pipelining stages: 3 stages were 5% faster than 2 on an H200 (T5's encoder, BERT's
# and GPT-2's shapes, `bench/attention_kernels.py --sweep`); the kernels that sum the bias's gradient over the
# batch (BIAS_GRADIENT "fused" and "separate") keep 2, as 3 overflow the shared memory of the separate one
TRITON = plgpu.CompilerParams(num_warps=4, num_stages=3)
BIAS_SUM_TRITON = plgpu.CompilerParams(num_warps=4, num_stages=2)
# "stored": the logits' gradient written by the keys' and values' kernel, dq and the bias's gradient from it in XLA;
# "fused": the queries' gradient kernel sums the bias's too (DQ_BLOCK rows, GROUP_BLOCKS, BIAS_CHUNKS); "separate":
# a kernel of its own, one program per (query block, key block, head) summing the whole batch in one tile, the
# queries' gradient in full tiles (no batch chunks or key groups), at the cost of a fourth pass over the tiles
BIAS_GRADIENT = "stored"


def _keep(seed: tuple, row, q_positions, k_positions, k_length: int, threshold: int) -> jax.Array:
    """Booleans [queries, keys] of one (example, head) `row`: 16 hashed bits below `threshold`."""
    position = (q_positions.astype(jnp.uint32)[:, None] * np.uint32(k_length)
                + k_positions.astype(jnp.uint32)[None, :])
    return (hashed_bits(seed, row, position) >> 16) < np.uint32(threshold)


def keep_mask(rng: jax.Array, keep_prob: float, shape: tuple[int, int, int, int]) -> tuple[jax.Array, float]:
    """(the kernels' dropout booleans [batch, heads, q_length, k_length] for the key `rng`, the kept fraction);
    `shape` is the padded one the kernels see (lengths rounded up to BLOCK)."""
    threshold = keep_threshold(keep_prob)
    return hashed_keep(seed_words(rng), threshold, shape), threshold / LEVELS


def _row(seed_ref, b, h, heads: int):
    """The global (example, head) index that the dropout hash takes: the shard's offsets are seed words 2 and 3."""
    return ((seed_ref[2] + b.astype(jnp.uint32)) * np.uint32(heads) + seed_ref[3] + h.astype(jnp.uint32))


def _scores(q, k, bias, key_real, segments, q_positions, k_positions, *, scale: float, causal: bool):
    """(float32 logits [queries, keys] of one tile in base 2, the mask of those attended or None). Masked entries
    are MASKED, as the xla kernel masks, and the keys that only pad the length to the block (key_real < 0) -inf,
    so that a row with no real key attends uniformly to the real length's keys. `segments` is None or the
    (queries', keys') segment ids."""
    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * scale
    if bias is not None:
        s = s + bias.astype(jnp.float32)
    s = jnp.maximum(s * LOG2E, MASKED)  # finite, as the xla kernel's float32 logits stay
    mask = None if key_real is None else (key_real > 0)[None, :]
    if segments is not None:
        same = segments[0][:, None] == segments[1][None, :]
        mask = same if mask is None else mask & same
    if causal:
        lower = q_positions[:, None] >= k_positions[None, :]
        mask = lower if mask is None else mask & lower
    if mask is not None:
        s = jnp.where(mask, s, MASKED)
    if key_real is not None:
        s = jnp.where((key_real < 0)[None, :], -jnp.inf, s)
    return s, mask


def _forward_kernel(seed_ref, q_ref, k_ref, v_ref, bias_ref, keys_ref, segments_ref, o_ref, stats_ref, *, scale,
                    causal, rate, heads, k_length):
    i, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    block_q = q_ref.shape[0]
    q = q_ref[...]
    q_positions = i * block_q + jnp.arange(block_q)
    threshold = keep_threshold(1.0 - rate)
    seed = None if seed_ref is None else (seed_ref[0], seed_ref[1])
    row = None if seed_ref is None else _row(seed_ref, b, h, heads)
    q_segments = None if segments_ref is None else segments_ref[pl.ds(i * block_q, block_q)]

    def body(j, carry):
        out, top, total = carry
        keys = pl.ds(j * BLOCK, BLOCK)
        k_positions = j * BLOCK + jnp.arange(BLOCK)
        segments = None if segments_ref is None else (q_segments, segments_ref[keys])
        s, _ = _scores(q, k_ref[keys, :], None if bias_ref is None else bias_ref[:, keys],
                    None if keys_ref is None else keys_ref[keys], segments, q_positions, k_positions, scale=scale,
                    causal=causal)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))
        correction = jnp.exp2(top - new_top)
        p = jnp.exp2(s - new_top[:, None])
        total = total * correction + jnp.sum(p, axis=-1)
        if seed is not None:
            p = jnp.where(_keep(seed, row, q_positions, k_positions, k_length, threshold), p, 0.0)
        v = v_ref[keys, :]
        out = out * correction[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return out, new_top, total

    blocks = jax.lax.div((i + 1) * block_q + BLOCK - 1, BLOCK) if causal else k_length // BLOCK
    start = (jnp.zeros(o_ref.shape, jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32),
             jnp.zeros((block_q,), jnp.float32))
    out, top, total = jax.lax.fori_loop(0, blocks, body, start)
    kept = threshold / LEVELS if seed is not None else 1.0
    o_ref[...] = (out / (total * kept)[:, None]).astype(o_ref.dtype)
    # the row's largest logit and its sum's log apart: a row with no real key has top = MASKED, where the sum
    # MASKED + log2(total) would round back to MASKED
    stats_ref[0, :] = top
    stats_ref[1, :] = jnp.log2(total)


def _weights_and_grad(seed, row, q, k, v, do, stats, delta, bias, key_real, segments, q_positions, k_positions, *,
                      scale, causal, rate, k_length):
    """(dropped weights, the logits' gradient) [queries, keys] of one tile in the backward kernels; `stats` is
    the forward's (top, log2 of the sum), each [queries]."""
    s, mask = _scores(q, k, bias, key_real, segments, q_positions, k_positions, scale=scale, causal=causal)
    p = jnp.exp2((s - stats[0][:, None]) - stats[1][:, None])
    dp = jnp.dot(do, v.T, preferred_element_type=jnp.float32)
    dropped = p
    if seed is not None:
        threshold = keep_threshold(1.0 - rate)
        keep, inverse = _keep(seed, row, q_positions, k_positions, k_length, threshold), LEVELS / threshold
        dropped = jnp.where(keep, p * inverse, 0.0)
        dp = jnp.where(keep, dp * inverse, 0.0)
    ds = p * (dp - delta[:, None])
    return dropped, ds if mask is None else jnp.where(mask, ds, 0.0)


def _key_value_grad_kernel(seed_ref, q_ref, k_ref, v_ref, bias_ref, keys_ref, segments_ref, do_ref, stats_ref,
                           delta_ref, dk_ref, dv_ref, ds_ref=None, *, scale, causal, rate, heads, k_length):
    """dk and dv of one block of keys, example and head; with `ds_ref`, the logits' gradient of that column of
    tiles too (zeros where a causal mask skips them)."""
    j, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k, v = k_ref[...], v_ref[...]
    k_positions = j * BLOCK + jnp.arange(BLOCK)
    key_real = None if keys_ref is None else keys_ref[...]
    seed = None if seed_ref is None else (seed_ref[0], seed_ref[1])
    row = None if seed_ref is None else _row(seed_ref, b, h, heads)
    k_segments = None if segments_ref is None else segments_ref[pl.ds(j * BLOCK, BLOCK)]

    def body(i, carry):
        dk, dv = carry
        queries = pl.ds(i * BLOCK, BLOCK)
        q, do = q_ref[queries, :], do_ref[queries, :]
        segments = None if segments_ref is None else (segments_ref[queries], k_segments)
        dropped, ds = _weights_and_grad(
            seed, row, q, k, v, do, (stats_ref[0, queries], stats_ref[1, queries]), delta_ref[queries],
            None if bias_ref is None else bias_ref[queries, :], key_real, segments, i * BLOCK + jnp.arange(BLOCK),
            k_positions, scale=scale, causal=causal, rate=rate, k_length=k_length)
        dv = dv + jnp.dot(dropped.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
        dk = dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32)
        if ds_ref is not None:
            ds_ref[queries, :] = ds.astype(ds_ref.dtype)
        return dk, dv

    def skipped(i, _):
        ds_ref[pl.ds(i * BLOCK, BLOCK), :] = jnp.zeros((BLOCK, BLOCK), ds_ref.dtype)

    if causal and ds_ref is not None:
        jax.lax.fori_loop(0, j, skipped, None)
    zeros = jnp.zeros(dk_ref.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(j if causal else 0, q_ref.shape[0] // BLOCK, body, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _query_rows(q_ref, do_ref, stats_ref, delta_ref, b, h, queries):
    """(q, do, (top, log2 of the sum), delta) of example b and head h at `queries`, from whole-array refs."""
    stats = (stats_ref[b, h, 0, queries], stats_ref[b, h, 1, queries])
    return q_ref[b, queries, h, :], do_ref[b, queries, h, :], stats, delta_ref[b, h, queries]


def _example_tile(seed_ref, k_ref, v_ref, keys_ref, segments_ref, b, h, q_start, j, rows, bias, *, scale, causal,
                  rate, heads, k_length):
    """(the logits' gradient, the keys) of example b and head h, for the queries from q_start (`rows`:
    `_query_rows`) and key block j, from whole-array refs: the tile of the queries' and the bias's gradients."""
    q, do, stats, delta = rows
    queries, keys = pl.ds(q_start, q.shape[0]), pl.ds(j * BLOCK, BLOCK)
    k, v = k_ref[b, keys, h, :], v_ref[b, keys, h, :]
    _, ds = _weights_and_grad(
        None if seed_ref is None else (seed_ref[0], seed_ref[1]),
        None if seed_ref is None else _row(seed_ref, b, h, heads), q, k, v, do, stats, delta, bias,
        None if keys_ref is None else keys_ref[b, keys],
        None if segments_ref is None else (segments_ref[b, queries], segments_ref[b, keys]),
        q_start + jnp.arange(q.shape[0]), j * BLOCK + jnp.arange(BLOCK), scale=scale, causal=causal, rate=rate,
        k_length=k_length)
    return ds, k


def _query_grad_kernel(seed_ref, q_ref, k_ref, v_ref, bias_ref, keys_ref, segments_ref, do_ref, stats_ref, delta_ref,
                       dq_ref, dbias_ref=None, *, scale, causal, rate, heads, k_length, per_program, groups):
    """dq of `per_program` examples for one head and block of queries, over one group of key blocks (all of them
    without a bias); with a bias, its gradient over that group summed over the examples."""
    i, h = pl.program_id(0), pl.program_id(1)
    c, g = pl.program_id(2) // groups, pl.program_id(2) % groups
    block_q = DQ_BLOCK if dbias_ref is not None else BLOCK
    group_blocks = k_length // BLOCK // groups
    queries = pl.ds(i * block_q, block_q)
    statics = dict(scale=scale, causal=causal, rate=rate, heads=heads, k_length=k_length)

    def tile(b, n, rows):  # the logits' gradient of the group's key block n
        return _example_tile(seed_ref, k_ref, v_ref, keys_ref, segments_ref, b, h, i * block_q, g * group_blocks + n,
                             rows, None if bias_ref is None else bias_ref[:, pl.ds(n * BLOCK, BLOCK)], **statics)

    def example(step, sums):
        b = c * per_program + step
        rows = _query_rows(q_ref, do_ref, stats_ref, delta_ref, b, h, queries)
        dq = jnp.zeros((block_q, q_ref.shape[-1]), jnp.float32)
        if sums is None:
            def key_block(j, dq):
                ds, k = tile(b, j, rows)
                return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
            blocks = jax.lax.div((i + 1) * block_q + BLOCK - 1, BLOCK) if causal else k_length // BLOCK
            dq = jax.lax.fori_loop(0, blocks, key_block, dq)
        else:
            added = []
            for n, total in enumerate(sums):  # unrolled, so that each key block's bias gradient stays in registers
                ds, k = tile(b, n, rows)
                dq = dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
                added.append(total + ds)
            sums = tuple(added)
        dq_ref[g, b, queries, h, :] = (dq * scale).astype(dq_ref.dtype)
        return sums

    if dbias_ref is None:
        jax.lax.fori_loop(0, per_program, example, None)
        return
    zeros = tuple(jnp.zeros((block_q, BLOCK), jnp.float32) for _ in range(group_blocks))
    for n, total in enumerate(jax.lax.fori_loop(0, per_program, example, zeros)):
        dbias_ref[:, n * BLOCK:(n + 1) * BLOCK] = total


def _bias_grad_kernel(seed_ref, q_ref, k_ref, v_ref, bias_ref, keys_ref, segments_ref, do_ref, stats_ref, delta_ref,
                      dbias_ref, **statics):
    """The bias's gradient of one (query block, key block, head) tile, summed over the batch in registers."""
    i, j, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)

    def example(b, total):
        rows = _query_rows(q_ref, do_ref, stats_ref, delta_ref, b, h, pl.ds(i * BLOCK, BLOCK))
        ds, _ = _example_tile(seed_ref, k_ref, v_ref, keys_ref, segments_ref, b, h, i * BLOCK, j, rows,
                              bias_ref[...], **statics)
        return total + ds

    dbias_ref[...] = jax.lax.fori_loop(0, q_ref.shape[0], example, jnp.zeros(dbias_ref.shape, jnp.float32))


def _key_groups(k_length: int) -> int:
    """Into how many groups of at most GROUP_BLOCKS key blocks the bias's gradient kernel splits the keys."""
    blocks = k_length // BLOCK
    return blocks // max(d for d in range(1, GROUP_BLOCKS + 1) if blocks % d == 0)


def _spec(array, block, index):
    """A BlockSpec, or None for an absent input."""
    return None if array is None else pl.BlockSpec(block, index)


def _whole(array):
    """The whole array for every program."""
    return _spec(array, None if array is None else array.shape, lambda *_: (0,) * array.ndim)


def _forward(q, k, v, bias, keys, segments, seed, scale, causal, rate, heads, interpret):
    batch, q_length, local_heads, head_dim = q.shape
    k_length = k.shape[1]
    kernel = functools.partial(_forward_kernel, scale=scale, causal=causal, rate=rate, heads=heads,
                               k_length=k_length)
    out, stats = pl.pallas_call(
        kernel, grid=(q_length // BLOCK, batch, local_heads),
        in_specs=[_whole(seed),
                  pl.BlockSpec((None, BLOCK, None, head_dim), lambda i, b, h: (b, i, h, 0)),
                  pl.BlockSpec((None, k_length, None, head_dim), lambda i, b, h: (b, 0, h, 0)),
                  pl.BlockSpec((None, k_length, None, head_dim), lambda i, b, h: (b, 0, h, 0)),
                  _spec(bias, (None, None, BLOCK, k_length), lambda i, b, h: (0, h, i, 0)),
                  _spec(keys, (None, k_length), lambda i, b, h: (b, 0)),
                  _spec(segments, (None, k_length), lambda i, b, h: (b, 0))],
        out_specs=[pl.BlockSpec((None, BLOCK, None, head_dim), lambda i, b, h: (b, i, h, 0)),
                   pl.BlockSpec((None, None, 2, BLOCK), lambda i, b, h: (b, h, 0, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, local_heads, 2, q_length), jnp.float32)],
        compiler_params=TRITON, interpret=interpret, name="flash_forward",
    )(seed, q, k, v, bias, keys, segments)
    return out, stats


def _backward(q, k, v, bias, keys, segments, seed, out, stats, do, scale, causal, rate, heads, interpret):
    batch, q_length, local_heads, head_dim = q.shape
    k_length = k.shape[1]
    statics = dict(scale=scale, causal=causal, rate=rate, heads=heads, k_length=k_length)
    delta = jnp.einsum("bqhd,bqhd->bhq", out.astype(jnp.float32), do.astype(jnp.float32))
    rows = pl.BlockSpec((None, q_length, None, head_dim), lambda j, b, h: (b, 0, h, 0))
    keys_block = pl.BlockSpec((None, BLOCK, None, head_dim), lambda j, b, h: (b, j, h, 0))
    per_query = pl.BlockSpec((None, None, q_length), lambda j, b, h: (b, h, 0))
    stats_spec = pl.BlockSpec((None, None, 2, q_length), lambda j, b, h: (b, h, 0, 0))
    stored = bias is not None and BIAS_GRADIENT == "stored"
    dk, dv, *stored_ds = pl.pallas_call(
        functools.partial(_key_value_grad_kernel, **statics), grid=(k_length // BLOCK, batch, local_heads),
        in_specs=[_whole(seed), rows, keys_block, keys_block,
                  _spec(bias, (None, None, q_length, BLOCK), lambda j, b, h: (0, h, 0, j)),
                  _spec(keys, (None, BLOCK), lambda j, b, h: (b, j)),
                  _spec(segments, (None, k_length), lambda j, b, h: (b, 0)), rows, stats_spec, per_query],
        out_specs=[keys_block, keys_block] + (
            [pl.BlockSpec((None, None, q_length, BLOCK), lambda j, b, h: (b, h, 0, j))] if stored else []),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)] + (
            [jax.ShapeDtypeStruct((batch, local_heads, q_length, k_length), q.dtype)] if stored else []),
        compiler_params=TRITON, interpret=interpret, name="flash_key_value_grad",
    )(seed, q, k, v, bias, keys, segments, do, stats, delta)
    if stored:  # XLA's batched matmul for dq and its sum over the batch for the bias, both reading ds
        ds, = stored_ds
        # written in the queries' dtype by the matmul itself (float32 accumulation): in float32 it wrote twice the
        # bytes, which each of the two transposes XLA makes for the projection's GEMMs then read. The scale (1 in
        # T5) goes into the keys in float32, each rounded once, rather than into a bfloat16 constant.
        scaled = k if scale == 1 else (k.astype(jnp.float32) * scale).astype(k.dtype)
        dq = jnp.einsum("bhqk,bkhd->bqhd", ds, scaled, preferred_element_type=q.dtype)
        return dq, dk, dv, jnp.sum(ds, axis=0, keepdims=True, dtype=jnp.float32).astype(bias.dtype)

    fused = bias is not None and BIAS_GRADIENT == "fused"
    chunks = math.gcd(batch, BIAS_CHUNKS) if fused else batch
    groups = _key_groups(k_length) if fused else 1
    block_q, group_length = (DQ_BLOCK if fused else BLOCK), k_length // groups
    # each key group's dq apart, in float32 when XLA adds them
    dq_shape = jax.ShapeDtypeStruct((groups, *q.shape), jnp.float32 if groups > 1 else q.dtype)
    dbias_shape = jax.ShapeDtypeStruct((chunks, local_heads, q_length, k_length), jnp.float32)
    whole = [_whole(q), _whole(k), _whole(v)]
    rest = [_whole(keys), _whole(segments), _whole(do), _whole(stats), _whole(delta)]
    outputs = pl.pallas_call(
        functools.partial(_query_grad_kernel, **statics, per_program=batch // chunks, groups=groups),
        grid=(q_length // block_q, local_heads, chunks * groups),
        in_specs=[_whole(seed), *whole,
                  _spec(bias, (None, None, block_q, group_length), lambda i, h, cg: (0, h, i, cg % groups)), *rest],
        out_specs=[_whole(dq_shape)] + ([] if not fused else [pl.BlockSpec(
            (None, None, block_q, group_length), lambda i, h, cg: (cg // groups, h, i, cg % groups))]),
        out_shape=[dq_shape] + ([] if not fused else [dbias_shape]),
        compiler_params=BIAS_SUM_TRITON if fused else TRITON, interpret=interpret, name="flash_query_grad",
    )(seed, q, k, v, bias, keys, segments, do, stats, delta)
    dq = jnp.sum(outputs[0], axis=0).astype(q.dtype)
    if bias is None:
        return dq, dk, dv, None
    if fused:
        return dq, dk, dv, jnp.sum(outputs[1], axis=0, keepdims=True).astype(bias.dtype)
    tile = pl.BlockSpec((None, None, BLOCK, BLOCK), lambda i, j, h: (0, h, i, j))
    dbias = pl.pallas_call(
        functools.partial(_bias_grad_kernel, **statics), grid=(q_length // BLOCK, k_length // BLOCK, local_heads),
        in_specs=[_whole(seed), *whole, tile, *rest], out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((1, local_heads, q_length, k_length), jnp.float32),
        compiler_params=BIAS_SUM_TRITON, interpret=interpret, name="flash_bias_grad",
    )(seed, q, k, v, bias, keys, segments, do, stats, delta)
    return dq, dk, dv, dbias.astype(bias.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11))
def _flash(q, k, v, bias, keys, segments, seed, scale, causal, rate, heads, interpret):
    return _forward(q, k, v, bias, keys, segments, seed, scale, causal, rate, heads, interpret)[0]


def _flash_forward(q, k, v, bias, keys, segments, seed, scale, causal, rate, heads, interpret):
    out, stats = _forward(q, k, v, bias, keys, segments, seed, scale, causal, rate, heads, interpret)
    return out, (q, k, v, bias, keys, segments, seed, out, stats)


def _flash_backward(scale, causal, rate, heads, interpret, residuals, do):
    dq, dk, dv, dbias = _backward(*residuals, do, scale, causal, rate, heads, interpret)
    return dq, dk, dv, dbias, None, None, None


_flash.defvjp(_flash_forward, _flash_backward)


def _pad(x: jax.Array | None, axis: int, length: int, value=0) -> jax.Array | None:
    if x is None or x.shape[axis] == length:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def padded(length: int) -> int:
    """`length` rounded up to the kernels' block."""
    return -(-length // BLOCK) * BLOCK


def flash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, padding_mask: jax.Array | None = None,
                    causal: bool = False, segment_ids: jax.Array | None = None, bias: jax.Array | None = None,
                    scale: float, dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None,
                    interpret: bool | None = None) -> jax.Array:
    """Attention of [B, Tq, H, D] queries over [B, Tk, KVH, D] keys/values with the flash kernels; returns
    [B, Tq, H, D]. Arguments as `jaxlm.nn.attention.dot_product_attention`; `bias` is [1, H, Tq, Tk] (shared by
    the batch). `interpret` defaults to "not building for a GPU"."""
    batch, q_length, heads, head_dim = query.shape
    k_length, kv_heads = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads; kv heads must divide heads")
    if value.shape[-1] != head_dim or key.shape[-1] != head_dim:
        raise ValueError(f"attention_kernel='flash' needs one head size for queries, keys and values, not "
                         f"{head_dim}, {key.shape[-1]} and {value.shape[-1]}")
    if (causal or segment_ids is not None) and q_length != k_length:
        raise ValueError(f"causal or segmented flash attention needs equal query and key lengths, got {q_length} and "
                         f"{k_length}")
    if bias is not None and bias.shape[0] != 1:
        raise ValueError(f"attention_kernel='flash' takes a bias shared by the batch ([1, heads, q, k]), not "
                         f"{bias.shape}; use 'xla'")
    if interpret is None:
        platform = target_platform()
        if platform == "tpu":
            raise ValueError("attention_kernel='flash' is the GPU kernel; on a TPU use 'splash' or 'xla'")
        interpret = platform != "gpu"
    if not interpret and (head_dim < 16 or head_dim & (head_dim - 1)):
        raise ValueError(f"attention_kernel='flash' needs a head_dim that is a power of two from 16, not {head_dim}")
    if heads != kv_heads:
        key, value = (jnp.repeat(x, heads // kv_heads, axis=2) for x in (key, value))
    rate = float(dropout_rate) if dropout_rng is not None else 0.0
    if rate > 0.0 and keep_threshold(1.0 - rate) == 0:  # 16 bits keep nothing, as jaxlm.nn.dropout.dropout
        return jnp.zeros_like(query)
    seed = None
    outer_batch, outer_heads = _caller_split_axes()
    if rate > 0.0:  # words 2 and 3: the offsets of this shard's examples and heads (_row)
        seed = jnp.concatenate([seed_words(dropout_rng), jnp.stack([_shard_index(outer_batch) * np.uint32(batch),
                                                                     _shard_index(outer_heads) * np.uint32(heads)])])
    all_heads = heads * math.prod(jax.sharding.get_abstract_mesh().shape[axis] for axis in outer_heads)
    q_padded, k_padded = padded(q_length), padded(k_length)
    keys = None  # 1 at a real key, 0 at a masked one, -1 at those that pad the length to the block
    if padding_mask is not None or k_padded != k_length:
        real = jnp.ones((batch, k_length), bool) if padding_mask is None else padding_mask
        keys = _pad(real.astype(jnp.int32), 1, k_padded, value=-1)
    segments = None if segment_ids is None else _pad(segment_ids.astype(jnp.int32), 1, k_padded)
    q = _pad(query, 1, q_padded)
    k, v = _pad(key, 1, k_padded), _pad(value, 1, k_padded)
    if bias is not None:
        bias = _pad(_pad(bias, 2, q_padded), 3, k_padded)
    local = functools.partial(_local, scale=float(scale), causal=causal, rate=rate, heads=all_heads,
                              interpret=interpret)
    out = _sharded(local, q, k, v, bias, keys, segments, seed)
    return out[:, :q_length]


def _local(q, k, v, bias, keys, segments, seed, *, scale, causal, rate, heads, interpret, batch_offset=0,
           head_offset=0):
    if seed is not None:
        seed = seed + jnp.asarray([0, 0, batch_offset, head_offset], jnp.uint32)
    return _flash(q, k, v, bias, keys, segments, seed, scale, causal, rate, heads, interpret)


def _caller_split_axes() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The manual mesh axes (a caller's own shard_map) that the active flax rules give the batch and the heads:
    the caller split those already, so the masks' global indices count their shards."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not mesh.manual_axes or not nn.get_logical_axis_rules():
        return (), ()
    return tuple(tuple(a for a in axis_tuple(axes) if a in mesh.manual_axes) for axes in placed_batch_and_heads())


def _sharded(local, q, k, v, bias, keys, segments, seed):
    """`local` on each device's shard of batch and heads, as the active flax rules split them."""
    split = batch_and_head_axes(q.shape[0], q.shape[2])
    if split is None:
        return local(q, k, v, bias, keys, segments, seed)
    mesh, batch_axes, head_axes = split
    b, h = spec_axis(batch_axes), spec_axis(head_axes)

    def per_shard(q, k, v, bias, keys, segments, seed):
        return local(q, k, v, bias, keys, segments, seed, batch_offset=_shard_index(batch_axes) * q.shape[0],
                     head_offset=_shard_index(head_axes) * q.shape[2])

    qkv = PartitionSpec(b, None, h, None)
    specs = (qkv, qkv, qkv, None if bias is None else PartitionSpec(None, h, None, None),
             None if keys is None else PartitionSpec(b, None), None if segments is None else PartitionSpec(b, None),
             None if seed is None else PartitionSpec())
    return shard_map_automatic(per_shard, mesh, specs, qkv)(q, k, v, bias, keys, segments, seed)


def _shard_index(axes: tuple[str, ...]) -> jax.Array:
    """This device's index along `axes` taken together (major to minor), as uint32; 0 for no axes."""
    index = jnp.zeros((), jnp.uint32)
    for axis in axes:
        index = index * np.uint32(jax.lax.axis_size(axis)) + jax.lax.axis_index(axis).astype(jnp.uint32)
    return index
