"""Splash attention: the Pallas TPU flash-attention kernel behind `dot_product_attention(kernel="splash")`.

The kernel works on one example in [heads, length, head_dim]; here it is vmapped over the batch,
fed the query pre-scaled (the kernel does not scale), and told about padding and packed documents
through its segment ids: padding tokens get a segment id of their own, so real tokens never attend
to them. (Padding *queries* then attend only to padding keys, where the xla kernel lets them attend
to the real keys; their outputs differ, and nothing downstream reads them.)

Under a mesh (the abstract mesh in context) the call is wrapped in `jax.shard_map`: batch and query
heads are split as the active flax logical-axis rules place the logical names `batch` and `heads`
(mesh axes that do not divide the size are dropped); key/value heads are split like the query heads,
or repeated per query head when there are too few to split; length and head_dim stay whole (the
kernel needs every key). Each device runs the kernel on its shard; unnamed mesh axes hold replicas.

Built for TPU it is the Mosaic kernel; built for the CPU (the tests) it runs in Pallas interpret
mode, slow and for checking numbers only; on GPU it refuses (use `cudnn`).
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernels
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import PartitionSpec

from jaxlm.parallel.logical import target_platform

# The kernel tiles the sequence in blocks whose kv extent must be a multiple of the TPU lane width.
LANES = 128
BLOCKS = (512, 256, 128)


def block_size(length: int, what: str) -> int:
    """The largest of 512, 256, 128 that divides `length`; a ValueError naming the fix otherwise."""
    for block in BLOCKS:
        if length % block == 0:
            return block
    up = -(-length // LANES) * LANES
    raise ValueError(f"attention_kernel='splash' needs {what} lengths that are multiples of {LANES}, got {length}; "
                     f"pad the sequences to {up} (e.g. data.max_seq_length={up}) or use model.attention_kernel=xla")


def make_kernel(heads: int, q_length: int, kv_length: int, causal: bool, mqa: bool, interpret: bool):
    """The splash kernel for one example (one shard of heads). Its mask tables are made inside the
    caller's trace (the kernel library caches the numpy work per mask shape)."""
    bq, bkv = block_size(q_length, "query"), block_size(kv_length, "key")
    sizes = kernels.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv,
                               block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                               block_q_dq=bq, block_kv_dq=bkv)
    shape = (q_length, kv_length)
    mask = masks.MultiHeadMask([masks.CausalMask(shape) if causal else masks.FullMask(shape)] * heads)
    make = kernels.make_splash_mqa if mqa else kernels.make_splash_mha
    return make(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def segments(batch: int, q_length: int, kv_length: int, padding_mask, segment_ids):
    """(q, kv) int32 segment ids [batch, length], or None when nothing separates tokens. Padding keys
    (and, in self-attention, padding queries) get an id below every real one."""
    if segment_ids is None and padding_mask is None:
        return None
    if segment_ids is not None and q_length != kv_length:
        raise ValueError("segment_ids need self-attention (equal query and key lengths)")
    base = (jnp.zeros((batch, kv_length), jnp.int32) if segment_ids is None
            else segment_ids.astype(jnp.int32))
    if padding_mask is None:
        return base, base
    real = padding_mask.astype(bool)
    pad_id = jnp.min(base, axis=-1, keepdims=True) - 1
    kv = jnp.where(real, base, pad_id)
    if q_length != kv_length:  # cross-attention: queries are all real, only keys are padded
        return jnp.zeros((batch, q_length), jnp.int32), kv
    return kv, kv


def _local(query, key, value, q_segments, kv_segments, *, causal: bool, interpret: bool):
    """The kernel on local [B, H, T, D] shards, vmapped over the batch."""
    heads, q_length, kv_length = query.shape[1], query.shape[2], key.shape[2]
    mqa = key.shape[1] == 1 and heads > 1
    if mqa:
        key, value = key[:, 0], value[:, 0]
    kernel = make_kernel(heads, q_length, kv_length, causal, mqa, interpret)
    if q_segments is None:
        return jax.vmap(kernel)(query, key, value)
    return jax.vmap(lambda q, k, v, qs, ks: kernel(q, k, v, kernels.SegmentIds(qs, ks)))(
        query, key, value, q_segments, kv_segments)


def dividing_axes(mesh, axes, size: int) -> tuple[str, ...]:
    """The leading mesh axes of `axes` (a PartitionSpec entry) whose product divides `size`; manual axes dropped."""
    if axes is None:
        return ()
    chosen, product = [], 1
    for axis in (axes,) if isinstance(axes, str) else tuple(axes):
        if axis not in mesh.shape or axis in mesh.manual_axes:
            continue
        if size % (product * mesh.shape[axis]):
            break
        chosen.append(axis)
        product *= mesh.shape[axis]
    return tuple(chosen)


def spec_axis(axes: tuple[str, ...]):
    return None if not axes else axes[0] if len(axes) == 1 else axes


def batch_and_head_axes(batch: int, heads: int):
    """(the mesh in context, the mesh axes that split the batch, those that split the heads) where the active flax
    rules put them (no rules: nothing is split), or None when the mesh has no automatic axis to split over."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or all(axis in mesh.manual_axes for axis in mesh.axis_names):
        return None
    batch_axes, head_axes = placed_batch_and_heads()
    return mesh, dividing_axes(mesh, batch_axes, batch), dividing_axes(mesh, head_axes, heads)


def placed_batch_and_heads() -> tuple:
    """The mesh-axis entries the active flax rules give an attention input's batch and heads."""
    placed = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
    return placed[0], placed[2]


def shard_map_automatic(fn, mesh, in_specs, out_specs):
    """`fn` under jax.shard_map with every automatic mesh axis manual; the ones not named in the specs hold
    replicas."""
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs, check_vma=False,
                         axis_names={a for a in mesh.axis_names if a not in mesh.manual_axes})


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, padding_mask: jax.Array | None = None,
                     causal: bool = False, segment_ids: jax.Array | None = None, scale: float,
                     interpret: bool | None = None) -> jax.Array:
    """Attention of [B, Tq, H, D] queries over [B, Tk, KVH, D] keys/values (KVH divides H) with the
    splash kernel; returns [B, Tq, H, D]. Arguments as `jaxlm.nn.attention.dot_product_attention`.
    Lengths must be multiples of 128. `interpret` defaults to "not building for TPU"."""
    batch, q_length, heads, _ = query.shape
    kv_length, kv_heads = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads; kv heads must divide heads")
    if causal and q_length != kv_length:
        raise ValueError(f"causal splash attention needs equal query and key lengths, got {q_length} and {kv_length}")
    block_size(q_length, "query"), block_size(kv_length, "key")  # fail early, before any tracing below
    if interpret is None:
        platform = target_platform()
        if platform not in ("tpu", "cpu"):
            raise ValueError(f"attention_kernel='splash' is the TPU kernel; on {platform} use 'flash', 'cudnn' or "
                             "'xla'")
        interpret = platform != "tpu"
    seg = segments(batch, q_length, kv_length, padding_mask, segment_ids)
    q_seg, kv_seg = seg if seg is not None else (None, None)
    # [B, T, H, D] -> [B, H, T, D], the layout the kernel takes.
    q = jnp.swapaxes(query * jnp.asarray(scale, query.dtype), 1, 2)
    k, v = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)
    local = functools.partial(_local, causal=causal, interpret=interpret)

    split = batch_and_head_axes(batch, heads)
    if split is None:
        return jnp.swapaxes(local(q, k, v, q_seg, kv_seg), 1, 2)
    mesh, batch_axes, head_axes = split
    head_shards = math.prod(mesh.shape[a] for a in head_axes)
    if head_shards > 1 and kv_heads % head_shards:
        # Too few kv heads to split like the query heads: give each query head its own copy.
        k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
    b, h = spec_axis(batch_axes), spec_axis(head_axes)
    qkv_spec, seg_spec = PartitionSpec(b, h, None, None), PartitionSpec(b, None)
    args, specs = (q, k, v), (qkv_spec,) * 3
    if seg is not None:
        args, specs = args + seg, specs + (seg_spec, seg_spec)
    else:
        local = functools.partial(local, q_segments=None, kv_segments=None)
    return jnp.swapaxes(shard_map_automatic(local, mesh, specs, qkv_spec)(*args), 1, 2)
