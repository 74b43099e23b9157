"""A decoder's sequence classification equals transformers' GPT2ForSequenceClassification and
LlamaForSequenceClassification (PyTorch, CPU, fp32): logits at the last real token of right-padded rows,
the loss and its gradients; left-padded rows give the same logits."""
from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import DECODERS, random_model, right_padded, torch_tensors  # noqa: E402
from jaxlm.models.task_heads import DecoderClassifier  # noqa: E402
from jaxlm.objectives.finetune import SequenceClassificationObjective  # noqa: E402

CLASSES = {"gpt2": "GPT2ForSequenceClassification", "llama": "LlamaForSequenceClassification"}
PAD = 0


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_logits_loss_and_gradients_equal_transformers(name):
    family = DECODERS[name]
    hf_config = getattr(transformers, family.config_class)(**{**family.small, "pad_token_id": PAD}, num_labels=3,
                                                             attn_implementation="eager")
    model = random_model(getattr(transformers, CLASSES[name]), hf_config, 0.05)
    tensors = torch_tensors(model)
    config = family.config_from_hf(model.config.to_dict(), dtype="float32")
    score = tensors.pop("score.weight")
    if not config.tie_embeddings:  # the converter reads a whole CausalLM; its LM head is not used here
        tensors["lm_head.weight"] = np.zeros((config.vocab_size, config.hidden_size), np.float32)
    params = family.params_from_hf(tensors, config)
    params = {"decoder": params["decoder"], "score": score.T}
    ids, mask = right_padded([9, 5, 12, 3], config.vocab_size, PAD, np.random.default_rng(0), low=3)
    labels = np.array([0, 2, 1, 2])
    objective = SequenceClassificationObjective(config, ids.shape[1], functools.partial(DecoderClassifier, num_labels=3))
    batch = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask.astype(np.int32), "label": labels,
             "example_weight": np.ones(4, np.float32)}
    logits = objective.apply(params, batch, None, True)
    loss, grads = jax.value_and_grad(
        lambda p: objective.summarize(objective.stats(p, batch, None, deterministic=True))["loss"])(params)

    theirs = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                   labels=torch.tensor(labels))
    theirs.loss.backward()
    np.testing.assert_allclose(np.asarray(logits), theirs.logits.detach().numpy(), atol=2e-5)
    assert float(loss) == pytest.approx(theirs.loss.item(), rel=1e-5)
    np.testing.assert_allclose(np.asarray(grads["score"]).T, model.score.weight.grad.numpy(), atol=2e-5)
    embedding = dict(model.named_parameters())["transformer.wte.weight" if name == "gpt2" else "model.embed_tokens.weight"]
    np.testing.assert_allclose(np.asarray(grads["decoder"]["token"]["embedding"]), embedding.grad.numpy(), atol=2e-5)

    # the same rows padded on the left: pooled at the last real token too (it read the row's length - 1th)
    shifts = ids.shape[1] - mask.sum(1)
    left = {"input_ids": np.stack([np.roll(row, k) for row, k in zip(ids, shifts)]),
            "input_mask": np.stack([np.roll(row, k) for row, k in zip(mask.astype(np.int32), shifts)])}
    np.testing.assert_allclose(np.asarray(objective.apply(params, batch | left, None, True)), np.asarray(logits),
                               atol=2e-5)


def test_prompt_response_loss_equals_transformers_with_the_prompt_ignored():
    from jaxlm.config import FinetuneConfig
    from jaxlm.corpora.models import gpt2_tokenizer_dir
    from jaxlm.data.tokenizers.load import load_tokenizer
    from jaxlm.data.tokenizers.roles import special_ids
    from jaxlm.finetune.tasks import TASKS, Context
    family = DECODERS["gpt2"]
    tokenizer = load_tokenizer(gpt2_tokenizer_dir())
    model = family.random_model(0.05, vocab_size=tokenizer.vocab_size)
    config = family.config_from_hf(model.config.to_dict(), dtype="float32")
    params = family.params_from_hf(torch_tensors(model), config)
    records = [{"prompt": "Translate to French: good morning", "response": " bonjour"},
               {"prompt": "Q: Which team won Super Bowl 50?\nA:", "response": " the Denver Broncos, 24 to 10"},
               {"prompt": " ".join(["a very long prompt"] * 12), "response": " cut from the left"}]
    settings = FinetuneConfig(task="causal_lm", max_length=24, max_target_length=8)
    task = TASKS["causal_lm"]
    ctx = Context(config, settings, (), tokenizer)
    rows = task.rows(ctx, records, labelled=True)
    objective = task.objective(ctx)
    loss = objective.summarize(objective.stats(params, rows.arrays, None, deterministic=True))["loss"]

    eos = special_ids(tokenizer)["eos"]
    total, count = 0.0, 0
    for index, record in enumerate(records):
        weights = np.asarray(rows.arrays["target_weights"][index])
        prompt = np.asarray(rows.arrays["input_ids"][index])[:int(np.argmax(weights > 0)) + 1].tolist()  # trained on
        response = [*tokenizer.encode(record["response"])[:7], eos]
        ids = torch.tensor([[*prompt, *response]])
        labels = ids.clone()
        labels[0, :len(prompt)] = -100
        theirs = model(input_ids=ids, labels=labels)
        total, count = total + theirs.loss.item() * len(response), count + len(response)
        assert prompt == tokenizer.encode(record["prompt"])[-len(prompt):]  # a long one lost its start
        assert len(prompt) + len(response) <= 25
    assert float(loss) == pytest.approx(total / count, rel=1e-5)
    # generation starts from the prompt's last 24 - 8 tokens: room for the response's 8 new ones
    assert [len(m) for m in rows.meta] == [min(len(tokenizer.encode(r["prompt"])), 16) for r in records]
