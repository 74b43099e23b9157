"""TransformerConfig: the small, frozen description of a network that every module takes."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

ATTENTION_KERNELS = ("xla", "cudnn", "flash", "splash")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
POSITION_EMBEDDINGS = ("learned", "rope", "relative")
FLOAT_DTYPES = ("float32", "bfloat16", "float16")  # model.dtype (compute) and model.param_dtype (storage)
REMAT_POLICIES = ("none", "full", "dots")
POSITIVE_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                  "max_position_embeddings")
# 0 means none, or the default the field's comment names
SIZES_OR_ZERO = ("type_vocab_size", "num_kv_heads", "embedding_size", "head_size", "num_decoder_layers")
DROPOUTS = ("hidden_dropout", "attention_dropout", "activation_dropout")


def check_vocab_multiple(multiple: int, name: str = "model.vocab_multiple") -> None:
    if multiple < 1:
        raise ValueError(f"{name}={multiple}; use 1 (no padding) or a row multiple such as 64 or 128")


def check_ids(ids, vocab_size: int, where: Callable[[tuple[int, ...]], str]) -> None:
    """Raise ValueError for the first token id outside [0, vocab_size), or not a whole number, saying
    `where(its index)`: on the host, since the networks' gathers clamp such an id into range and give NaN or
    another token's numbers, and a fraction was cut to a whole id."""
    ids = np.asarray(ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        if not np.issubdtype(ids.dtype, np.floating):
            raise ValueError(f"{where((0,) * ids.ndim)}: token ids must be integers, not {ids.dtype}")
        fractions = np.argwhere(ids != np.round(ids))
        if fractions.size:
            at = tuple(int(i) for i in fractions[0])
            raise ValueError(f"{where(at)}: token id {float(ids[at])!r} is not a whole number; give integer ids")
    ids = ids.astype(np.int64)
    outside = np.argwhere((ids < 0) | (ids >= vocab_size))
    if outside.size:
        at = tuple(int(i) for i in outside[0])
        raise ValueError(f"{where(at)}: token id {int(ids[at])} is outside the model's vocabulary "
                         f"(model.vocab_size={vocab_size}: ids 0 to {vocab_size - 1})")


def check_special_ids(vocab_size: int, **ids) -> None:
    """Raise ValueError naming the first of `ids` (name=id; None, and -1 for an eos, mean none) that is not a
    token id of the vocabulary: a pad, mask or start id beyond it gave NaN or another token's numbers."""
    for name, value in ids.items():
        if value is None or (name == "eos_id" and value == -1):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < vocab_size:
            raise ValueError(f"{name}={value!r} is not a token id of the model's vocabulary (model.vocab_size="
                             f"{vocab_size}: ids 0 to {vocab_size - 1})")


def typed_field(name: str, value, default):
    """`value` for the field `name` as its default's type, or a ValueError for a value of another type (an int field
    takes no float or bool, a float field an int, a text field only text): the networks failed deep inside, or took a
    string "no" as true. A NumPy scalar (read from an array) counts as the Python value it holds."""
    kind = type(default)
    if isinstance(value, np.generic):
        value = value.item()
    fits = (isinstance(value, bool) if kind is bool else
            isinstance(value, int) and not isinstance(value, bool) if kind is int else
            isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
            isinstance(value, kind))
    if not fits:
        raise ValueError(f"model.{name}={value!r} must be {'an' if kind is int else 'a'} {kind.__name__}")
    return float(value) if kind is float else value


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """What a network is. Checked as it is built (`dataclasses.replace` included): each field of its default's type
    and the rules of `validate` kept, so a module never meets a config it would fail inside or silently run as
    another network (hidden_size=100 over 3 heads was a 99-wide attention)."""

    family: str = "bert"  # a name in jaxlm.families
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    # dropout on the MLP's inner activations (T5, BART); 0 for BERT and GPT-2
    activation_dropout: float = 0.0
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    # Dense kernels drawn with std initializer_range / sqrt(fan_in) (T5's scheme, with range 1.0);
    # embeddings keep std initializer_range.
    fan_in_init: bool = False
    dtype: str = "bfloat16"
    param_dtype: str = "float32"
    attention_kernel: str = "xla"
    # On GPUs, projections of one input with the same shape as one matmul of their stacked kernels: the gated MLP's
    # gate and up, and with XLA's attention self-attention's queries, keys and values (cross-attention's keys and
    # values). The parameters and the values are the separate projections'; false computes each on its own.
    fused_projections: bool = True
    # The transformer layers' projections (attention and MLP) in FP8 with current scaling (jaxlm.nn.fp8);
    # embeddings, heads, the output projection and attention's own products stay at `dtype`.
    fp8: bool = False
    num_kv_heads: int = 0
    position_embedding: str = "learned"
    rope_theta: float = 10000.0
    norm: str = "layernorm"
    activation: str = "gelu"
    use_bias: bool = True
    tie_embeddings: bool = True
    # Learned positions of real tokens start at `position_offset`. 0 (BERT) numbers every slot
    # 0, 1, 2, ...; above 0 (RoBERTa: pad_token_id + 1) only non-pad tokens are counted, from the
    # offset, and pad tokens take position `pad_token_id`, as Hugging Face RoBERTa does.
    position_offset: int = 0
    pad_token_id: int = 0
    # ALBERT: token embeddings of this width, projected up to hidden_size (0: no factorisation).
    embedding_size: int = 0
    # Width of each attention head; 0 means hidden_size // num_heads (T5 sets it apart).
    head_size: int = 0
    # T5's bucketed relative positions (position_embedding="relative").
    relative_buckets: int = 32
    relative_max_distance: int = 128
    # Encoder-decoders: decoder depth (0: num_layers); decoder_start_token_id starts generation.
    num_decoder_layers: int = 0
    decoder_start_token_id: int = 0
    eos_token_id: int = -1
    # The id that begins text in the model's own training (-1: none, as jaxlm's causal rows), written to config.json
    # by to-hf: left out, transformers takes its default (Llama's 1), another token of this vocabulary.
    bos_token_id: int = -1
    # Layers as one nn.scan over stacked parameters (leading "layers" axis) instead of layer_0..N-1,
    # and what each layer keeps for the backward pass: none (all), full (recompute all), dots.
    scan_layers: bool = False
    remat: str = "none"
    # Causal LM: the head and its cross-entropy over this many slices of the sequence in turn, each slice's
    # logits recomputed in the backward pass, so only [batch, length / logits_chunks, vocab] is ever live
    # (0: the whole logits at once).
    logits_chunks: int = 0
    # Decoders on packed rows: a row is one sequence, its documents attending to those before them and its positions
    # running on, as GPT-2 and nanoGPT attend (false: each document attends within itself, positions restart). The
    # next document's first token stays no target of the end-of-text before it, which they do train.
    cross_document_attention: bool = False
    # Token tables, output projections and their biases get rows up to the next multiple of this
    # (Megatron's make-vocab-size-divisible-by, 64 or 128; tensor-parallel meshes need it when the vocabulary
    # does not divide, as GPT-2's 50,257 = 29 x 1,733 never does). The extra rows are never looked up and
    # their logits are dropped, so every output equals the unpadded model's.
    vocab_multiple: int = 1

    def __post_init__(self):
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, typed_field(field.name, getattr(self, field.name), field.default))
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_layers

    @property
    def gated_mlp(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token tables: vocab_size rounded up to a multiple of vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def kv_heads(self) -> int:
        """Key/value heads: `num_kv_heads`, or `num_heads` when it is 0 (plain multi-head)."""
        return self.num_kv_heads or self.num_heads

    def validate(self) -> None:
        for name in POSITIVE_SIZES:
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be positive")
        for name in SIZES_OR_ZERO:
            if getattr(self, name) < 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be 0 or positive")
        for name in DROPOUTS:
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must lie in [0, 1): the share of values dropped")
        check_vocab_multiple(self.vocab_multiple)
        for name, meaning in (("layer_norm_eps", "added to the variance a norm divides by (1e-12 in BERT)"),
                              ("rope_theta", "the base of RoPE's wavelengths (10000 in Llama)")):
            if not getattr(self, name) > 0:
                raise ValueError(f"model.{name}={getattr(self, name):g} must be above 0: {meaning}")
        if self.logits_chunks < 0:
            raise ValueError(f"model.logits_chunks={self.logits_chunks}; use 0 (whole logits) or a number of slices")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"model.remat={self.remat!r}; choose one of {REMAT_POLICIES}")
        if not self.head_size and self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} is not divisible by model.num_kv_heads={self.num_kv_heads}"
            )
        for name, choices in (("norm", NORMS), ("activation", ACTIVATIONS),
                              ("position_embedding", POSITION_EMBEDDINGS), ("dtype", FLOAT_DTYPES),
                              ("param_dtype", FLOAT_DTYPES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"model.{name}={getattr(self, name)!r}; choose one of {choices}")
        if self.position_embedding == "rope" and self.head_dim % 2:
            raise ValueError(f"model.position_embedding='rope' needs an even head_dim, not {self.head_dim}")
        if self.position_embedding == "relative" and (self.relative_buckets < 4 or
                                                      self.relative_max_distance <= self.relative_buckets // 2):
            raise ValueError(f"model.relative_buckets={self.relative_buckets} and model.relative_max_distance="
                             f"{self.relative_max_distance}: T5's relative positions need 4 buckets or more and a "
                             "max distance above half the buckets (T5: 32 and 128)")
        for name, lowest in (("pad_token_id", 0), ("decoder_start_token_id", 0), ("eos_token_id", -1),
                             ("bos_token_id", -1)):
            if not lowest <= getattr(self, name) < self.vocab_size:  # an id beyond the table: NaN, not an error
                raise ValueError(f"model.{name}={getattr(self, name)} must lie in [{lowest}, model.vocab_size="
                                 f"{self.vocab_size}), an id of the vocabulary" + (" (-1: none)" if lowest else ""))
        if self.position_offset < 0 or self.position_offset >= self.max_position_embeddings:
            raise ValueError(f"model.position_offset={self.position_offset} must lie in "
                             f"[0, model.max_position_embeddings={self.max_position_embeddings})")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(
                f"model.attention_kernel={self.attention_kernel!r}; choose one of {ATTENTION_KERNELS}"
            )
        if self.attention_kernel in ("cudnn", "splash") and self.attention_dropout:
            raise ValueError(f"model.attention_kernel={self.attention_kernel!r} has no attention dropout; "
                             "set model.attention_dropout=0")
        if self.attention_kernel == "cudnn" and self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"model.attention_kernel='cudnn' computes in bfloat16 or float16, not model.dtype="
                             f"{self.dtype!r}; set model.dtype=bfloat16 or use 'xla'")
        if self.attention_kernel == "flash" and (self.head_dim < 16 or self.head_dim & (self.head_dim - 1)):
            raise ValueError(f"model.attention_kernel='flash' needs a head_dim that is a power of two from 16, not "
                             f"{self.head_dim}; use 'cudnn' or 'xla'")
        if self.attention_kernel == "splash" and self.position_embedding == "relative":
            raise ValueError("model.attention_kernel='splash' takes no relative-position bias (T5); use 'xla'")
