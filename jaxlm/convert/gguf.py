"""llama.cpp GGUF files -> jaxlm Llama decoder: metadata to config, our own dequantisation, names, tokenizer."""
from __future__ import annotations

import os
import pathlib
import re
from typing import Mapping

import numpy as np
from gguf import READER_SUPPORTED_VERSIONS, GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from jaxlm.convert.hf_decoder import llama_config_from_hf, llama_params_from_hf
from jaxlm.convert.names import listed
from jaxlm.errors import first_line
from jaxlm.models.config import TransformerConfig

MAGIC = b"GGUF"
ARCHITECTURE = "llama"
_REQUIRED = object()


# ---------------------------------------------------------------- reading the file

def open_gguf(path):
    """A `gguf.GGUFReader` over `path`, after checking that the file is a little-endian GGUF of a version the
    reader reads; a file cut short or damaged is a ValueError that says so."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a llama.cpp .gguf model file (a Hugging Face model's "
                                "directory converts with `jaxlm convert from-hf`)")
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != MAGIC:
        found = f"it starts with {head[:4]!r}, not {MAGIC!r}" if head else "it is empty"
        raise ValueError(f"{path} is not a GGUF file ({found}); pass a llama.cpp .gguf model file, or convert a "
                         "Hugging Face model directory with `jaxlm convert from-hf`")
    version = int.from_bytes(head[4:], "little") if len(head) == 8 else None
    if version is not None and version & 0xFFFF == 0:  # as GGUFReader tells a file of the other byte order
        raise ValueError(f"{path} is a big-endian GGUF; only little-endian files are supported")
    if version is not None and version not in READER_SUPPORTED_VERSIONS:
        raise ValueError(f"{path} is a GGUF file of version {version}, which jaxlm cannot read (it reads versions "
                         f"{', '.join(map(str, READER_SUPPORTED_VERSIONS))}); re-create it with a current llama.cpp")
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError) as err:  # GGUFReader's words for what it cannot read
        reason = first_line(err)[:160]
        raise ValueError(f"{path} could not be read as GGUF ({reason}; {path.stat().st_size} bytes): it is truncated "
                         "or damaged, or newer than the installed gguf package reads; download it again, or upgrade "
                         "gguf") from None


def _reader(path_or_reader):
    return path_or_reader if hasattr(path_or_reader, "fields") else open_gguf(path_or_reader)


def metadata(reader, key: str, default=_REQUIRED):
    """The value of one GGUF metadata key (strings, numbers, lists of them)."""
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ValueError(f"GGUF file lacks the metadata key {key!r}: it was not written by llama.cpp's "
                             "converter, or is damaged; convert the model again with llama.cpp")
        return default
    return field.contents()


DAMAGED = "the file is damaged; download or convert it again"


def number(reader, key: str, default=_REQUIRED):
    """A numeric metadata key's value; a ValueError naming the key where the file holds anything else there."""
    value = metadata(reader, key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"GGUF {key}={str(value)[:60]!r} is not a number: {DAMAGED}")
    return value


def check_architecture(reader) -> None:
    arch = metadata(reader, "general.architecture")
    if arch != ARCHITECTURE:
        raise ValueError(f"GGUF architecture {arch!r} is not supported: jaxlm reads only {ARCHITECTURE!r} "
                         "GGUF files (Llama-style decoders)")


# ---------------------------------------------------------------- config

def hf_llama_config(reader) -> dict:
    """The Hugging Face LlamaConfig dict that the GGUF metadata describes."""
    check_architecture(reader)

    def key(name, default=_REQUIRED):
        return number(reader, f"{ARCHITECTURE}.{name}", default)

    def count(name, default=_REQUIRED):
        value = int(key(name, default))
        if value < 1:
            raise ValueError(f"GGUF {ARCHITECTURE}.{name}={value} must be at least 1: {DAMAGED}")
        return value

    if key("expert_count", 0):
        raise ValueError("mixture-of-experts Llama GGUF files (llama.expert_count > 0) are not supported")
    hidden, heads = count("embedding_length"), count("attention.head_count")
    head_dim = count("attention.key_length", hidden // heads)
    rotary = int(key("rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise ValueError(f"llama.rope.dimension_count={rotary} differs from head_dim={head_dim}: "
                         "partial rotary embeddings are not supported")
    tokens = metadata(reader, "tokenizer.ggml.tokens", None)
    config = dict(
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=hidden,
        num_hidden_layers=count("block_count"), num_attention_heads=heads,
        num_key_value_heads=count("attention.head_count_kv", heads), head_dim=head_dim,
        intermediate_size=count("feed_forward_length"),
        max_position_embeddings=count("context_length"),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        vocab_size=len(tokens) if tokens is not None else int(key("vocab_size")),
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=number(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=number(reader, "tokenizer.ggml.eos_token_id", None))
    scaling = metadata(reader, f"{ARCHITECTURE}.rope.scaling.type", "none")
    if scaling != "none":
        config["rope_scaling"] = {"rope_type": scaling}
    return config


# ---------------------------------------------------------------- dequantisation

def _f16(columns: np.ndarray) -> np.ndarray:
    """[blocks, 2] little-endian bytes -> [blocks, 1] float32."""
    return np.ascontiguousarray(columns).view("<f2").astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """Element j of a 4-bit block is the low nibble of byte j, element j + 16 the high nibble."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def _q8_0(blocks):
    return _f16(blocks[:, :2]) * blocks[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(blocks):
    return _f16(blocks[:, :2]) * (_nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32)


def _q4_1(blocks):
    return _f16(blocks[:, :2]) * _nibbles(blocks[:, 4:]).astype(np.float32) + _f16(blocks[:, 2:4])


def _f32(blocks):
    return blocks.view("<f4")


def _f16_plain(blocks):
    return blocks.view("<f2").astype(np.float32)


def _bf16(blocks):
    return (blocks.view("<u2").astype(np.uint32) << 16).view(np.float32)


# type name -> (elements per block, bytes per block, [blocks, bytes] uint8 -> [blocks, elements] float32)
DEQUANTIZERS = {
    "F32": (1, 4, _f32),
    "F16": (1, 2, _f16_plain),
    "BF16": (1, 2, _bf16),
    "Q8_0": (32, 34, _q8_0),
    "Q4_0": (32, 18, _q4_0),
    "Q4_1": (32, 20, _q4_1),
}


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 array of `shape` (NumPy order) from the raw bytes of one GGUF tensor."""
    elements, nbytes, decode = DEQUANTIZERS[type_name]
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    count = int(np.prod(shape, dtype=np.int64))
    if count % elements or raw.size != count // elements * nbytes:
        raise ValueError(f"{type_name} tensor of shape {shape} needs {count // elements * nbytes} bytes "
                         f"in blocks of {elements}, got {raw.size}")
    return decode(raw.reshape(-1, nbytes)).reshape(shape).astype(np.float32, copy=False)


def numpy_shape(tensor) -> tuple[int, ...]:
    """GGUF lists dimensions fastest-varying first; NumPy lists them slowest first."""
    return tuple(int(d) for d in reversed(tensor.shape))


def check_tensor_types(reader) -> None:
    unsupported = [f"{t.name} ({t.tensor_type.name})" for t in reader.tensors
                   if t.tensor_type.name not in DEQUANTIZERS]
    if unsupported:
        raise ValueError(f"GGUF tensor types that jaxlm cannot dequantise: {listed(unsupported)}. "
                         f"Supported types: {', '.join(DEQUANTIZERS)}; re-quantise the model to one of them "
                         "(llama-quantize) or convert the original Hugging Face checkpoint instead")


def dequantized_tensors(reader) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array in NumPy layout, for every tensor of the file."""
    check_tensor_types(reader)
    return {t.name: dequantize(t.data, t.tensor_type.name, numpy_shape(t)) for t in reader.tensors}


# ---------------------------------------------------------------- names and the Q/K permutation

TOP_LEVEL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
IN_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}
ROTARY_HEADS = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(gguf_name: str) -> str:
    """The Hugging Face LlamaForCausalLM name of a GGUF tensor."""
    if gguf_name in TOP_LEVEL:
        return TOP_LEVEL[gguf_name]
    match = _BLOCK_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in IN_BLOCK:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a Llama decoder; known names: "
                         f"{', '.join(TOP_LEVEL)}, blk.N.{{{','.join(IN_BLOCK)}}}.weight")
    return f"model.layers.{match.group(1)}.{IN_BLOCK[match.group(2)]}.weight"


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's rotary permutation of q_proj/k_proj rows: llama.cpp wants each
    head's rows ordered (head_dim/2, 2) — interleaved rotary pairs — where Hugging Face has (2, head_dim/2)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_tensors(tensors: Mapping[str, np.ndarray], hf_config: Mapping) -> dict[str, np.ndarray]:
    """HF LlamaForCausalLM tensors from dequantised GGUF tensors: renamed, Q and K un-permuted."""
    out = {}
    for name, value in tensors.items():
        match = _BLOCK_NAME.fullmatch(name)
        if match and match.group(2) in ROTARY_HEADS:
            value = unpermute_rows(value, hf_config[ROTARY_HEADS[match.group(2)]])
        out[hf_name(name)] = value
    return out


# ---------------------------------------------------------------- tokenizer

def tokenizer_info(reader) -> dict:
    """What the file says about its tokenizer, beyond the vocabulary itself."""
    keys = ("model", "pre", "bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id",
            "add_bos_token", "add_eos_token")
    info = {key: (number if key.endswith("_id") else metadata)(reader, f"tokenizer.ggml.{key}", None) for key in keys}
    info["chat_template"] = metadata(reader, "tokenizer.chat_template", None)
    return info


_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PRE = ("default", "gpt-2")
DIGITS_PRE = ("smollm", "starcoder", "refact", "codeshell", "command-r")
LLAMA3_PRE = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3")


def _pre_tokenizer(pre: str | None):
    """The pre-tokenizer llama.cpp (llama-vocab.cpp) uses for `tokenizer.ggml.pre`."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre is None or pre in GPT2_PRE:
        return byte_level
    if pre in DIGITS_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in LLAMA3_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise ValueError(f"GGUF tokenizer.ggml.pre={pre!r} is not supported; supported: "
                     f"{', '.join(GPT2_PRE + DIGITS_PRE + LLAMA3_PRE)}")


def _gpt2_byte_alphabet() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def byte_level_tokens(tokens: list[str]) -> list[str]:
    """The vocabulary in GPT-2's byte alphabet; a token the file writes as plain text gets respelled."""
    alphabet = _gpt2_byte_alphabet()
    letters = set(alphabet.values())
    return [t if set(t) <= letters else "".join(alphabet[b] for b in t.encode("utf-8")) for t in tokens]


def post_processor(tokens: list[str], info: Mapping):
    """BOS/EOS around each sequence where the file asks for them (`add_bos_token`/`add_eos_token`)."""
    first = [info["bos_token_id"]] if info.get("add_bos_token") and info.get("bos_token_id") is not None else []
    last = [info["eos_token_id"]] if info.get("add_eos_token") and info.get("eos_token_id") is not None else []
    if not first and not last:
        return None

    def around(sequence):
        return [tokens[i] for i in first] + [sequence] + [tokens[i] for i in last]

    return processors.TemplateProcessing(single=around("$A"), pair=around("$A") + around("$B:1"),
                                         special_tokens=[(tokens[i], i) for i in dict.fromkeys(first + last)])


def gguf_tokenizer(path_or_reader):
    """A Hugging Face `tokenizers.Tokenizer` built from the file's byte-level BPE vocabulary."""
    reader = _reader(path_or_reader)
    info = tokenizer_info(reader)
    if info["model"] is None:
        metadata(reader, "tokenizer.ggml.model")  # the error of a missing key
    if info["model"] != "gpt2":
        raise ValueError(f"GGUF tokenizer.ggml.model={info['model']!r} is not supported: jaxlm builds only "
                         "byte-level BPE ('gpt2') tokenizers from GGUF files")
    tokens = metadata(reader, "tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        raise ValueError(f"GGUF tokenizer.ggml.tokens is not a list of strings: {DAMAGED}")
    tokens = byte_level_tokens(tokens)
    outside = next((key for key in ("bos_token_id", "eos_token_id") if info[key] is not None
                    and not 0 <= info[key] < len(tokens)), None)
    if outside:
        raise ValueError(f"GGUF tokenizer.ggml.{outside}={info[outside]} is outside the file's {len(tokens):,} tokens: "
                         f"{DAMAGED}")
    kinds = metadata(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else () for m in metadata(reader, "tokenizer.ggml.merges")]
    odd = next((i for i, merge in enumerate(merges) if len(merge) != 2), None)
    if odd is not None:
        raise ValueError(f"GGUF tokenizer.ggml.merges[{odd}] is not two tokens joined by a space: {DAMAGED}")
    try:
        tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception for a merge of unknown tokens
        raise ValueError(f"GGUF tokenizer.ggml.merges: {first_line(err)}: {DAMAGED}") from None
    tokenizer.pre_tokenizer = _pre_tokenizer(info["pre"])
    tokenizer.decoder = decoders.ByteLevel()
    # llama.cpp token types: 3 = control (special), 4 = user-defined (matched whole, not special).
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                  for t, k in zip(tokens, kinds) if k == 3])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, kinds) if k == 4])
    processor = post_processor(tokens, info)
    if processor is not None:
        tokenizer.post_processor = processor
    return tokenizer


def save_tokenizer(tokenizer, directory) -> pathlib.Path:
    path = pathlib.Path(directory) / "tokenizer.json"
    os.makedirs(path.parent, exist_ok=True)
    tokenizer.save(str(path))
    return path


# ---------------------------------------------------------------- loading

def load_gguf(path, **config_overrides) -> tuple[TransformerConfig, dict, dict]:
    """(config, CausalLM parameter tree, tokenizer info) of a Llama-architecture GGUF file (a path, or its reader)."""
    reader = _reader(path)
    check_architecture(reader)
    check_tensor_types(reader)
    hf_config = hf_llama_config(reader)
    config = llama_config_from_hf(hf_config, **config_overrides)
    params = llama_params_from_hf(hf_tensors(dequantized_tensors(reader), hf_config), config)
    return config, params, tokenizer_info(reader)
