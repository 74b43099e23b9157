"""Target log-likelihoods of `jaxlm.eval` for encoder-decoders equal transformers' (PyTorch, CPU, fp32):
a random T5 and a random BART, items of different lengths scored in padded batches."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import SEQ2SEQ, SEQ2SEQ_VOCAB, torch_tensors  # noqa: E402
from jaxlm.eval import Item, loglikelihoods  # noqa: E402
from jaxlm.eval.scoring import position_limit  # noqa: E402


def items(seed: int = 0) -> list[Item]:
    rng = np.random.default_rng(seed)
    return [Item(tuple(rng.integers(3, SEQ2SEQ_VOCAB, n).tolist()), tuple(rng.integers(3, SEQ2SEQ_VOCAB, m).tolist()))
            for n, m in ((12, 5), (3, 9), (20, 1), (7, 7), (1, 3))]


def reference(model, item: Item, start: int) -> float:
    target = torch.tensor([list(item.continuation)])
    decoder_input = torch.tensor([[start] + list(item.continuation)[:-1]])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(item.context)]), decoder_input_ids=decoder_input).logits
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    return float(log_probs.gather(-1, target[..., None]).sum())


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_target_loglikelihoods_equal_transformers(name):
    family = SEQ2SEQ[name]
    model = family.random_model(0.2)
    config = family.config_from_hf(model.config.to_dict(), dtype="float32")
    params = family.params_from_hf(torch_tensors(model), config)
    scored = items()
    limit = position_limit(config)
    if limit is not None:  # BART: a continuation as long as the decoder's positions
        scored.append(Item((5, 6), tuple(np.random.default_rng(1).integers(3, SEQ2SEQ_VOCAB, limit).tolist())))
    ours = loglikelihoods(config, params, scored, batch_size=3)
    theirs = np.array([reference(model, item, family.small["decoder_start_token_id"]) for item in scored])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
