"""Target log-likelihoods of `jaxlm.eval` for encoder-decoders equal transformers' (PyTorch, CPU, fp32):
a random T5 v1.1 and a random BART, items of different lengths scored in one padded batch."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import random_model, torch_tensors  # noqa: E402
from jaxlm.convert import hf_bart, hf_t5  # noqa: E402
from jaxlm.eval import Item, loglikelihoods  # noqa: E402

VOCAB = 500
T5 = dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
          relative_attention_num_buckets=16, relative_attention_max_distance=20, feed_forward_proj="gated-gelu",
          tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
BART = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)
MODELS = {
    "t5": (transformers.T5ForConditionalGeneration, transformers.T5Config, T5, hf_t5.t5_config_from_hf,
           hf_t5.t5_params_from_hf),
    "bart": (transformers.BartForConditionalGeneration, transformers.BartConfig, BART,
             hf_bart.bart_config_from_hf, hf_bart.bart_params_from_hf),
}


def items(seed: int = 0) -> list[Item]:
    rng = np.random.default_rng(seed)
    return [Item(tuple(rng.integers(3, VOCAB, n).tolist()), tuple(rng.integers(3, VOCAB, m).tolist()))
            for n, m in ((12, 5), (3, 9), (20, 1), (7, 7), (1, 3))]


def reference(model, item: Item, start: int) -> float:
    target = torch.tensor([list(item.continuation)])
    decoder_input = torch.tensor([[start] + list(item.continuation)[:-1]])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(item.context)]), decoder_input_ids=decoder_input).logits
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    return float(log_probs.gather(-1, target[..., None]).sum())


@pytest.mark.parametrize("family", sorted(MODELS))
def test_target_loglikelihoods_equal_transformers(family):
    model_cls, config_cls, small, config_from_hf, params_from_hf = MODELS[family]
    model = random_model(model_cls, config_cls(**small, attn_implementation="eager"))
    config = config_from_hf(model.config.to_dict(), dtype="float32")
    params = params_from_hf(torch_tensors(model), config)
    scored = items()
    ours = loglikelihoods(config, params, scored, batch_size=3)
    theirs = np.array([reference(model, item, small["decoder_start_token_id"]) for item in scored])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
