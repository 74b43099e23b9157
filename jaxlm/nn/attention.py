"""Scaled dot-product attention behind one function, with the kernel chosen by name."""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxlm.nn.dropout import Dropout, dropout
from jaxlm.nn.embed import rotary_embedding
from jaxlm.nn.flash import flash_attention
from jaxlm.nn.layers import LayerDense, projections
from jaxlm.nn.splash import splash_attention
from jaxlm.parallel.logical import constrain

if TYPE_CHECKING:
    from jaxlm.models.config import TransformerConfig


def padding_mask_lengths(padding_mask: jax.Array) -> jax.Array:
    """Per-row count of real tokens in a right-padded [batch, length] mask."""
    return jnp.sum(padding_mask.astype(jnp.int32), axis=-1)


def attention_mask(length: int, padding_mask: jax.Array | None = None, causal: bool = False,
                   segment_ids: jax.Array | None = None) -> jax.Array | None:
    """A boolean mask broadcastable to [batch, heads, query, key], or None when nothing is masked."""
    mask = None
    if padding_mask is not None:
        mask = padding_mask.astype(bool)[:, None, None, :]
    if causal:
        lower = jnp.tril(jnp.ones((length, length), bool))[None, None]
        mask = lower if mask is None else mask & lower
    if segment_ids is not None:
        same = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
        mask = same if mask is None else mask & same
    return mask


ATTENTION_SCOPE = "attention_core"  # the ops under it are what `jaxlm bench --profile` counts as attention


def add_bias(logits: jax.Array, bias: jax.Array) -> jax.Array:
    """float32 logits + bias, whose backward pass rounds the gradient to the logits' dtype once and sums the
    bias's gradient from that rounded tensor (in float32): XLA then writes the logits' gradient once, in bf16
    under mixed precision, where the plain add's transpose keeps a float32 copy for the bias's sum (T5-base,
    batch 64: 805 MB a layer, written and read twice)."""
    return _add_bias(logits, bias, logits.dtype, bias.shape, bias.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _add_bias(logits, bias, logits_dtype, bias_shape, bias_dtype):
    return logits.astype(jnp.float32) + bias.astype(jnp.float32)


def _add_bias_forward(logits, bias, logits_dtype, bias_shape, bias_dtype):
    return _add_bias(logits, bias, logits_dtype, bias_shape, bias_dtype), None


def _add_bias_backward(logits_dtype, bias_shape, bias_dtype, _, grad):
    # the barrier keeps XLA (which lets GPUs compute in excess precision) from folding the sum's float32
    # convert back into the float32 gradient, which would then be written whole for the sum to read
    grad = jax.lax.optimization_barrier(grad.astype(logits_dtype))
    broadcast = tuple(axis for axis, size in enumerate(bias_shape) if size == 1 and grad.shape[axis] != 1)
    return grad, jnp.sum(grad.astype(jnp.float32), axis=broadcast, keepdims=True).astype(bias_dtype)


_add_bias.defvjp(_add_bias_forward, _add_bias_backward)


_tracing_a_mask = threading.local()  # set while this thread traces cuDNN's attention with a mask and no bias


@contextlib.contextmanager
def _no_gradient_for_a_mask():
    """Within it, cuDNN's backward pass computes no gradient for the bias a boolean mask becomes (packed
    documents' segments), which nothing reads: JAX before 0.11.1 had it write one, [batch, 1, q_length, k_length]
    a layer, on a slower kernel (jax-ml/jax#34685; later JAX skips it itself). JAX decides in a private function,
    wrapped once to consult this thread's flag, so that other threads' traces (a real bias) are left as they are."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn  # private: where JAX decides it
    except ImportError:
        cudnn = None
    decide = getattr(cudnn, "should_export_dbias", None)
    if decide is None:
        yield
        return
    if not hasattr(decide, "jaxlm_wrapped"):
        def should_export_dbias(*args):
            return not getattr(_tracing_a_mask, "active", False) and decide(*args)

        should_export_dbias.jaxlm_wrapped = decide
        cudnn.should_export_dbias = should_export_dbias
    _tracing_a_mask.active = True
    try:
        yield
    finally:
        _tracing_a_mask.active = False


@jax.named_scope(ATTENTION_SCOPE)
def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    padding_mask: jax.Array | None = None,
    kernel: str = "xla",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    causal: bool = False,
    segment_ids: jax.Array | None = None,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    scale: float | None = None,
) -> jax.Array:
    """Attention of [batch, q_length, heads, head_dim] queries over [batch, k_length, kv_heads, head_dim]
    keys and values; keys and values may have fewer heads (grouped-query attention: query head h reads
    key/value head h // (heads / kv_heads)).

    `padding_mask` is [batch, k_length], true at real (right-padded) keys. `causal` lets each token
    attend only to itself and earlier ones; `segment_ids` [batch, length] keeps packed documents
    apart (tokens attend within their own segment id). `bias` [1 or batch, heads, q_length, k_length]
    is added to the logits (T5's relative positions); `mask` is any further boolean mask of that shape;
    `scale` multiplies the logits (default 1/sqrt(head_dim)). `xla` is portable and supports attention
    dropout; `cudnn` is the fused GPU kernel (no dropout); `flash` is our Pallas GPU kernel (a bias shared by
    the batch, dropout inside); `splash` is the Pallas TPU kernel.
    """
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if kernel == "cudnn":
        lengths = None if padding_mask is None else padding_mask_lengths(padding_mask)
        if segment_ids is not None:
            segments = attention_mask(query.shape[1], segment_ids=segment_ids)
            mask = segments if mask is None else mask & segments
        # in the queries' dtype: with a float32 bias, cuDNN's bias gradient comes back wrong (jax-ml/jax#32242)
        bias = None if bias is None else bias.astype(query.dtype)
        with _no_gradient_for_a_mask() if bias is None and mask is not None else contextlib.nullcontext():
            return jax.nn.dot_product_attention(
                query, key, value, bias=bias, mask=mask, scale=scale, key_value_seq_lengths=lengths,
                is_causal=causal, implementation="cudnn")
    if kernel == "flash":
        if mask is not None:
            raise ValueError("attention_kernel='flash' takes no extra mask: use 'xla'")
        return flash_attention(query, key, value, padding_mask=padding_mask, causal=causal, segment_ids=segment_ids,
                               bias=bias, scale=scale, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
    if kernel == "splash":
        if bias is not None or mask is not None:
            raise ValueError("attention_kernel='splash' takes no logit bias or extra mask: use 'xla' for "
                             "relative positions (T5) and for cached decoding")
        return splash_attention(query, key, value, padding_mask=padding_mask, causal=causal,
                                segment_ids=segment_ids, scale=scale)
    if kernel != "xla":
        raise ValueError(f"unknown attention kernel {kernel!r}; choose xla, cudnn, flash or splash")
    groups = query.shape[2] // key.shape[2]
    if groups > 1:
        key, value = jnp.repeat(key, groups, axis=2), jnp.repeat(value, groups, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", query * jnp.asarray(scale, query.dtype), key)
    if bias is not None:
        logits = add_bias(logits, bias)
    logits = logits.astype(jnp.float32)
    full_mask = attention_mask(query.shape[1], padding_mask, causal, segment_ids)
    if mask is not None:
        full_mask = mask if full_mask is None else full_mask & mask
    if full_mask is not None:
        logits = jnp.where(full_mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    if dropout_rate > 0.0 and dropout_rng is not None:
        weights = dropout(weights, dropout_rate, dropout_rng)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


class Attention(nn.Module):
    """Multi-head (or grouped-query) attention: projections, rotary positions when configured, the
    kernel the config names, the output projection and dropout. Self-attention by default; with
    `context` it attends over those states instead (cross-attention). Every family shares it.

    With `decode=True` (self-attention only) keys and values go into the "cache" collection: the
    first (init) call sizes it from its input, [batch, max_length]; each later call writes its
    tokens at the cache index and attends to every slot written so far. `padding_mask` then covers
    the cache slots, and `positions` must be given for rotary positions.
    """

    config: "TransformerConfig"
    causal: bool = False
    scale: float | None = None

    @nn.compact
    def __call__(self, x, padding_mask=None, deterministic: bool = True, positions=None, segment_ids=None, *,
                 context=None, bias=None, decode: bool = False) -> jax.Array:
        cfg = self.config
        kv_axis = "heads" if cfg.kv_heads == cfg.num_heads else "kv_heads"
        source = x if context is None else context
        q, k, v = self._projections(x, source, kv_axis)
        if cfg.position_embedding == "rope" and context is None:
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
            q, k = rotary_embedding(q, positions, cfg.rope_theta), rotary_embedding(k, positions, cfg.rope_theta)
        q = constrain(q, ("batch", "length", "heads", "kv"))
        k, v = (constrain(t, ("batch", "length", kv_axis, "kv")) for t in (k, v))
        causal, mask, kernel = self.causal, None, cfg.attention_kernel
        if decode and context is None:
            k, v, mask = self._cached(k, v)
            if mask is not None:
                causal, kernel = False, "xla"
        use_dropout = not deterministic and cfg.attention_dropout > 0.0
        out = dot_product_attention(
            q, k, v, padding_mask=padding_mask, causal=causal, segment_ids=segment_ids, bias=bias, mask=mask,
            scale=self.scale, kernel=kernel, dropout_rate=cfg.attention_dropout if use_dropout else 0.0,
            dropout_rng=self.make_rng("dropout") if use_dropout else None)
        out = LayerDense(cfg, cfg.hidden_size, ("heads", "kv"), ("embed",), contract=2, name="output")(out)
        return Dropout(cfg.hidden_dropout)(out, deterministic=deterministic)

    def _projections(self, x: jax.Array, source: jax.Array, kv_axis: str):
        """Queries from x, keys and values from `source`. Where projections stack (`projections`), with XLA's
        attention, the three as one matmul where they share input and shape (self-attention without grouped
        heads), else the keys and values as one. The other kernels are custom calls that take each operand dense,
        for which XLA would copy the slices of a fused result out (and concatenate their gradients) where separate
        matmuls write each where it is used: BERT-128's compile-only H100 plan with cuDNN's attention bounds 0.6 ms
        higher."""
        cfg = self.config
        stackable = cfg.attention_kernel == "xla"
        query_shape, key_shape = (cfg.num_heads, cfg.head_dim), (cfg.kv_heads, cfg.head_dim)
        if source is x and query_shape == key_shape:
            return tuple(projections(cfg, x, ("query", "key", "value"), query_shape, ("embed",), ("heads", "kv"),
                                     stackable))
        q = LayerDense(cfg, query_shape, ("embed",), ("heads", "kv"), name="query")(x)
        k, v = projections(cfg, source, ("key", "value"), key_shape, ("embed",), (kv_axis, "kv"), stackable)
        return q, k, v

    def _cached(self, k: jax.Array, v: jax.Array):
        """(all cached keys, values, mask of the slots each query may see); no mask on the sizing call."""
        sizing = not self.has_variable("cache", "cached_key")
        if sizing and not self.is_mutable_collection("cache"):  # else flax's ScopeCollectionNotFound
            raise ValueError("decode=True needs a KV cache: make one with init(..., decode=True), whose \"cache\" "
                             "is then passed beside the parameters with mutable=[\"cache\"]")
        key_cache = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        value_cache = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
        if sizing:
            return k, v, None
        start, length = index.value, k.shape[1]
        slots = key_cache.value.shape[1]
        if not isinstance(start, jax.core.Tracer) and int(start) + length > slots:  # under jit: written clipped
            raise ValueError(f"decode=True: {length} token(s) from cache slot {int(start)} overflow the cache's "
                             f"{slots} slots; size the cache (the length of the first decode=True call) for every "
                             "token")
        key_cache.value = jax.lax.dynamic_update_slice_in_dim(key_cache.value, k, start, axis=1)
        value_cache.value = jax.lax.dynamic_update_slice_in_dim(value_cache.value, v, start, axis=1)
        index.value = start + length
        slots, queries = jnp.arange(slots), start + jnp.arange(length)
        return key_cache.value, value_cache.value, (slots[None, :] <= queries[:, None])[None, None]
