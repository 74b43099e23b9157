"""jaxlm.convert.gguf on the real SmolLM2-135M-Instruct Q4_1 GGUF: our dequantisation against the gguf
package's, our un-permuted tensors and perplexity against transformers' own GGUF loader (PyTorch, CPU,
fp32), our tokenizer against transformers' GGUF tokenizer, and clear errors on files we cannot read."""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from hf_models import smollm2_ours, smollm2_transformers  # noqa: E402
from jaxlm.convert import gguf as ours  # noqa: E402
from jaxlm.convert.hf_decoder import llama_params_to_hf  # noqa: E402
from jaxlm.corpora.models import smollm2_gguf_path  # noqa: E402
from jaxlm.corpora.registry import fetch_austen  # noqa: E402
from jaxlm.models.decoder import CausalLM  # noqa: E402

PER_TYPE = 4
OPENING = "It is a truth universally acknowledged"


@pytest.fixture(scope="module")
def path():
    return smollm2_gguf_path()


@pytest.fixture(scope="module")
def reader(path):
    return ours.open_gguf(path)


@pytest.fixture(scope="module")
def loaded():
    return smollm2_ours()


@pytest.fixture(scope="module")
def hf_model():
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate installed")
    return smollm2_transformers()


@pytest.fixture(scope="module")
def hf_tokenizer(path):
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def chapter() -> str:
    """Chapter 1 of Pride and Prejudice. The Austen corpus keeps one chapter per document (headings
    dropped, one sentence per line, paragraph breaks lost), so the sentences are joined with spaces."""
    documents = fetch_austen().read_text(encoding="utf-8").split("\n\n")
    found = [doc for doc in documents if doc.startswith(OPENING)]
    assert len(found) == 1
    return " ".join(found[0].splitlines())


def finish(writer):
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ---------------------------------------------------------------- dequantisation

def test_dequantisation_equals_the_gguf_package_on_every_type_in_the_file(reader):
    by_type = collections.defaultdict(list)
    for tensor in reader.tensors:
        by_type[tensor.tensor_type.name].append(tensor)
    print("tensor types:", {name: len(tensors) for name, tensors in by_type.items()})
    assert set(by_type) <= set(ours.DEQUANTIZERS) and {"Q4_1", "Q8_0"} <= set(by_type)
    for name, tensors in by_type.items():
        for tensor in tensors[:PER_TYPE]:
            mine = ours.dequantize(tensor.data, name, ours.numpy_shape(tensor))
            theirs = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            assert mine.dtype == np.float32 and mine.shape == theirs.shape, tensor.name
            assert np.array_equal(mine, theirs), tensor.name
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert ours.numpy_shape(embedding) == (49152, 576)


SYNTHETIC = ("F16", "BF16", "Q4_0", "Q4_1", "Q8_0")


def test_dequantisation_of_types_the_file_lacks(tmp_path):
    """F16, BF16 and Q4_0 do not occur in the SmolLM2 file; write them with the gguf package."""
    values = np.random.default_rng(0).normal(size=(6, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(tmp_path / "types.gguf", "llama")
    for name in SYNTHETIC:
        qtype = gguf.GGMLQuantizationType[name]
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    finish(writer)
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "types.gguf").tensors}
    for name in SYNTHETIC:
        tensor = tensors[name]
        assert tensor.tensor_type.name == name
        mine = ours.dequantize(tensor.data, name, ours.numpy_shape(tensor))
        assert mine.shape == values.shape
        assert np.array_equal(mine, gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(values.shape))
        assert np.abs(mine - values).max() < 0.5, name


# ---------------------------------------------------------------- names and Q/K permutation

def llama_cpp_permute(weight, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes Q and K."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def test_unpermute_inverts_llama_cpp_permute():
    weight = np.arange(3 * 8 * 5, dtype=np.float32).reshape(24, 5)
    assert np.array_equal(ours.unpermute_rows(llama_cpp_permute(weight, 3), 3), weight)
    assert not np.array_equal(llama_cpp_permute(weight, 3), weight)


def test_every_tensor_equals_transformers_gguf_loader(loaded, hf_model):
    config, params, _ = loaded
    mine = llama_params_to_hf(params, config)
    theirs = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    assert set(mine) == set(theirs)
    worst = {name: float(np.abs(mine[name] - theirs[name]).max()) for name in theirs}
    print("max abs diff, q_proj/k_proj:", max(v for k, v in worst.items() if k.endswith(("q_proj.weight",
                                                                                        "k_proj.weight"))))
    assert all(mine[name].shape == theirs[name].shape for name in theirs)
    assert max(worst.values()) <= 1e-6, sorted(worst.items(), key=lambda kv: -kv[1])[:5]


def test_config_from_metadata(loaded):
    config, _, info = loaded
    assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads,
            config.intermediate_size, config.max_position_embeddings) == (49152, 576, 30, 9, 3, 1536, 8192)
    assert config.tie_embeddings and config.rope_theta == 100000.0 and config.norm == "rmsnorm"
    assert abs(config.layer_norm_eps - 1e-5) < 1e-9
    assert (info["model"], info["pre"], info["bos_token_id"], info["eos_token_id"]) == ("gpt2", "smollm", 1, 2)


# ---------------------------------------------------------------- tokenizer and perplexity

def perplexity(logits: np.ndarray, ids: np.ndarray) -> float:
    logits = logits[0, :-1].astype(np.float64)
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(np.exp(-np.take_along_axis(log_probs, ids[0, 1:, None], -1).mean()))


def test_tokenizer_matches_transformers(reader, hf_tokenizer, chapter, tmp_path):
    tokenizer = ours.gguf_tokenizer(reader)
    assert tokenizer.encode(chapter).ids == hf_tokenizer(chapter)["input_ids"]
    saved = tokenizers.Tokenizer.from_file(str(ours.save_tokenizer(tokenizer, tmp_path / "tok")))
    assert saved.encode(chapter).ids == tokenizer.encode(chapter).ids
    chat = "<|im_start|>user\nIn 2024, 12345 apples cost £3.50 — naïve café!<|im_end|>\n"
    assert tokenizer.encode(chat).ids == hf_tokenizer(chat)["input_ids"]
    assert tokenizer.encode(chat).ids[0] == 1 and tokenizer.decode(tokenizer.encode(chat).ids, False) == chat


def test_bos_and_eos_are_added_only_where_the_file_asks(reader):
    tokenizer = ours.gguf_tokenizer(reader)
    plain = tokenizer.encode("Hello world").ids
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    tokenizer.post_processor = ours.post_processor(tokens, {"bos_token_id": 1, "eos_token_id": 2,
                                                            "add_bos_token": True, "add_eos_token": True})
    assert tokenizer.encode("Hello world").ids == [1, *plain, 2]


def test_perplexity_on_pride_and_prejudice_chapter_one(loaded, hf_model, hf_tokenizer, chapter):
    config, params, _ = loaded
    ids = np.asarray([hf_tokenizer(chapter)["input_ids"]], np.int64)
    assert 800 < ids.shape[1] < config.max_position_embeddings
    with torch.no_grad():
        theirs = perplexity(hf_model(input_ids=torch.from_numpy(ids)).logits.numpy(), ids)
    logits = jax.jit(lambda p, x: CausalLM(config).apply({"params": p}, x))(params, jnp.asarray(ids, jnp.int32))
    mine = perplexity(np.asarray(logits), ids)
    message = (f"perplexity over {ids.shape[1]} tokens: jaxlm {mine:.5f}, transformers {theirs:.5f} "
               f"(relative difference {abs(mine - theirs) / theirs:.1e})")
    print(message)
    assert abs(mine - theirs) <= 0.01 * theirs, message
    assert mine < 40, message


# ---------------------------------------------------------------- bad input

def write_gguf(path, arch="llama", tensors=(), **strings):
    writer = gguf.GGUFWriter(path, arch)
    for key, value in strings.items():
        writer.add_string(key.replace("__", "."), value)
    for name, array, qtype in tensors:
        writer.add_tensor(name, array, raw_dtype=qtype)
    finish(writer)
    return path


def test_a_file_that_is_not_gguf_is_rejected(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(ValueError, match=r"not a GGUF file.*b'PK\\x03\\x04'"):
        ours.load_gguf(path)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        ours.load_gguf(tmp_path / "missing.gguf")


def test_an_unsupported_tensor_type_is_rejected_by_name_before_any_work(tmp_path):
    q5_k = np.zeros((1, 176), np.uint8)  # one 256-element Q5_K block
    path = write_gguf(tmp_path / "q5k.gguf", tensors=[("blk.0.attn_q.weight", q5_k, gguf.GGMLQuantizationType.Q5_K)])
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight \(Q5_K\).*Supported types: F32, F16, BF16, Q8_0"):
        ours.load_gguf(path)


def test_a_non_llama_architecture_is_rejected_by_name(tmp_path):
    path = write_gguf(tmp_path / "gpt2.gguf", arch="gpt2",
                      tensors=[("token_embd.weight", np.zeros((4, 8), np.float32), None)])
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported.*'llama'"):
        ours.load_gguf(path)


def test_a_non_bpe_tokenizer_is_rejected(tmp_path):
    path = write_gguf(tmp_path / "spm.gguf", tokenizer__ggml__model="llama")
    with pytest.raises(ValueError, match="tokenizer.ggml.model='llama' is not supported"):
        ours.gguf_tokenizer(path)


def damaged_gguf(path, **fields):
    """A tiny llama GGUF file of a two-token byte-level vocabulary, `fields` (key with __ for . -> value, written
    with the type its Python value has) added or in place of its own."""
    writer = gguf.GGUFWriter(path, "llama")
    own = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"],
           "llama.block_count": 1, "llama.embedding_length": 8, "llama.attention.head_count": 2,
           "llama.feed_forward_length": 16, "llama.context_length": 32, "llama.attention.layer_norm_rms_epsilon": 1e-5}
    for key, value in (own | {key.replace("__", "."): value for key, value in fields.items()}).items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    finish(writer)
    return path


@pytest.mark.parametrize("fields, expected", [
    ({"llama__block_count": [2, 3]}, r"GGUF llama.block_count='\[2, 3\]' is not a number"),  # a TypeError's traceback
    ({"llama__block_count": "one"}, r"GGUF llama.block_count='one' is not a number"),  # said no key
    ({"tokenizer__ggml__bos_token_id": "x"}, r"GGUF tokenizer.ggml.bos_token_id='x' is not a number"),
    ({"tokenizer__ggml__merges": ["a zz"]}, r"GGUF tokenizer.ggml.merges: .*zz.*: the file is damaged"),
    ({"tokenizer__ggml__merges": ["ab"]}, r"GGUF tokenizer.ggml.merges\[0\] is not two tokens joined by a space"),
    ({"tokenizer__ggml__tokens": [1, 2]}, r"GGUF tokenizer.ggml.tokens is not a list of strings"),
])
def test_damaged_metadata_is_named_by_its_key(tmp_path, fields, expected):
    path = damaged_gguf(tmp_path / "damaged.gguf", **fields)
    reader = ours.open_gguf(path)
    with pytest.raises(ValueError, match=expected + ".*download or convert it again"):
        ours.gguf_tokenizer(reader)
        ours.hf_llama_config(reader)
