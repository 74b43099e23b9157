"""The Hugging Face set-ups the parity tests share: small random transformers models built reproducibly,
their tensors, right-padded random inputs, the small decoder configs, and the real checkpoints
(all-MiniLM-L6-v2, SmolLM2-135M from its GGUF) loaded once per session.

A plain module, not tests/parity/conftest.py: a second `conftest` module would shadow tests/conftest.py
for the test files that import from it (`from conftest import run_cli`) when both folders are collected.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np
import torch
import transformers

from jaxlm.convert import hf_bart, hf_decoder, hf_t5
from jaxlm.convert.gguf import load_gguf
from jaxlm.corpora.models import minilm_dir, smollm2_gguf_path


def torch_tensors(model) -> dict[str, np.ndarray]:
    """A copy of `model`'s state dict as NumPy arrays, by checkpoint name."""
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def random_model(model_cls, config, noise: float = 0.05, *, noise_seed: int | None = None,
                 before_noise: Callable | None = None):
    """`model_cls(config)` built after torch.manual_seed(0) (and changed by `before_noise`, if given), then
    every parameter, biases and norms too, shifted by `noise` standard normals (drawn after reseeding with
    `noise_seed`, if given) so that none keeps its initial value; in eval mode."""
    torch.manual_seed(0)
    model = model_cls(config)
    if before_noise is not None:
        before_noise(model)
    if noise_seed is not None:
        torch.manual_seed(noise_seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn_like(p))
    return model.eval()


def right_padded(lengths, vocab: int, pad: int, rng: np.random.Generator, low: int) -> tuple[np.ndarray, np.ndarray]:
    """Random ids in [low, vocab) [len(lengths), max(lengths)], `pad` after each row's length, and the
    real-token mask."""
    mask = np.arange(max(lengths))[None, :] < np.asarray(lengths)[:, None]
    return np.where(mask, rng.integers(low, vocab, size=mask.shape), pad), mask


# ---------------------------------------------------------------- families, and the small decoders

VOCAB = 1000
GPT2 = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
LLAMA = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0,
             pad_token_id=0)


class Family(NamedTuple):
    """A family on both sides: the transformers classes (by name, imported when used), a small config,
    our converters."""

    model_class: str
    config_class: str
    small: dict
    config_from_hf: Callable
    params_from_hf: Callable
    params_to_hf: Callable

    @property
    def model_cls(self) -> type:
        return getattr(transformers, self.model_class)

    def random_model(self, noise: float = 0.05, noise_seed: int | None = None, **fields):
        """A small random model of this family (`fields` change the small config) with eager attention:
        see :func:`random_model`."""
        config = getattr(transformers, self.config_class)(**{**self.small, **fields}, attn_implementation="eager")
        return random_model(self.model_cls, config, noise, noise_seed=noise_seed)


DECODERS = {
    "gpt2": Family("GPT2LMHeadModel", "GPT2Config", GPT2, hf_decoder.gpt2_config_from_hf,
                   hf_decoder.gpt2_params_from_hf, hf_decoder.gpt2_params_to_hf),
    "llama": Family("LlamaForCausalLM", "LlamaConfig", LLAMA, hf_decoder.llama_config_from_hf,
                    hf_decoder.llama_params_from_hf, hf_decoder.llama_params_to_hf),
}

SEQ2SEQ_VOCAB = 500
T5 = dict(vocab_size=SEQ2SEQ_VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
          relative_attention_num_buckets=16, relative_attention_max_distance=20, feed_forward_proj="relu",
          tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
BART = dict(vocab_size=SEQ2SEQ_VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)
SEQ2SEQ = {
    "t5": Family("T5ForConditionalGeneration", "T5Config", T5, hf_t5.t5_config_from_hf, hf_t5.t5_params_from_hf,
                 hf_t5.t5_params_to_hf),
    "bart": Family("BartForConditionalGeneration", "BartConfig", BART, hf_bart.bart_config_from_hf,
                   hf_bart.bart_params_from_hf, hf_bart.bart_params_to_hf),
}

# ---------------------------------------------------------------- real checkpoints, loaded once

@functools.cache
def minilm_tokenizer():
    """transformers' BertTokenizer of all-MiniLM-L6-v2 (lower-cased WordPiece)."""
    return transformers.BertTokenizer(vocab=str(minilm_dir() / "vocab.txt"), do_lower_case=True)


@functools.cache
def minilm_transformers():
    """transformers' BertModel of all-MiniLM-L6-v2, float32, eager attention, in eval mode."""
    return transformers.BertModel.from_pretrained(str(minilm_dir()), dtype=torch.float32,
                                                  attn_implementation="eager").eval()


@functools.cache
def smollm2_ours() -> tuple:
    """(config, params, tokenizer info) of SmolLM2-135M through jaxlm.convert.gguf, float32."""
    return load_gguf(smollm2_gguf_path(), dtype="float32")


@functools.cache
def smollm2_transformers():
    """transformers' own GGUF loader on SmolLM2-135M (needs accelerate), float32, in eval mode."""
    path = smollm2_gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                             dtype=torch.float32).eval()
