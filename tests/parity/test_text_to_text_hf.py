"""Text-to-text fine-tuning's rows and loss equal transformers' teacher forcing with `labels` (PyTorch,
CPU, fp32): a random T5 and a random BART, real sentences through a real SentencePiece tokenizer, the
SQuAD cast ("question: ... context: ..." -> the answer) included; loss and gradients."""
from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import SEQ2SEQ, torch_tensors  # noqa: E402
from jaxlm.config import FinetuneConfig  # noqa: E402
from jaxlm.corpora.models import sentencepiece_test_dir  # noqa: E402
from jaxlm.data.tokenizers.load import load_tokenizer  # noqa: E402
from jaxlm.finetune.tasks import Context, TextToText, squad_cast  # noqa: E402

VOCAB = 1000  # the botchan unigram model's
RECORDS = [
    {"source": "It was a fine spring morning in the old town.", "target": "spring"},
    {"question": "Who met Bob?", "context": "Ann met Bob at the station before the train left.",
     "answers": [{"text": "Ann", "answer_start": 0}]},
    {"source": "The committee will meet again next week to decide.", "target": "next week, to decide the plan"},
]


@functools.cache
def tokenizer():
    return load_tokenizer(sentencepiece_test_dir() / "botchan_en_unigram_1000.model")


@pytest.mark.parametrize("name", sorted(SEQ2SEQ))
def test_teacher_forced_loss_and_gradients_equal_transformers(name):
    family = SEQ2SEQ[name]
    model = family.random_model(0.1, vocab_size=VOCAB)
    config = family.config_from_hf(model.config.to_dict(), dtype="float32")
    params = family.params_from_hf(torch_tensors(model), config)
    settings = FinetuneConfig(task="text_to_text", max_length=24, max_target_length=8)
    ctx = Context(config, settings, (), tokenizer())
    task = TextToText()
    rows = task.rows(ctx, RECORDS, labelled=True)
    objective = task.objective(ctx)
    batch = {k: jax.numpy.asarray(v) for k, v in rows.arrays.items()}
    loss, grads = jax.value_and_grad(
        lambda p: objective.summarize(objective.stats(p, batch, None, deterministic=True))["loss"])(params)

    weights = rows.arrays["target_weights"].astype(bool)
    labels = torch.tensor(np.where(weights, rows.arrays["targets"], -100))
    inputs = {"input_ids": torch.tensor(rows.arrays["input_ids"], dtype=torch.long),
              "attention_mask": torch.tensor(rows.arrays["input_mask"], dtype=torch.long)}
    model.train(False)
    theirs = model(**inputs, labels=labels.long())
    theirs.loss.backward()
    assert float(loss) == pytest.approx(theirs.loss.item(), rel=1e-5)
    # their decoder input is the labels shifted right after the decoder start: ours, exactly
    shifted = model._shift_right(labels) if name == "t5" else transformers.models.bart.modeling_bart.shift_tokens_right(
        labels, model.config.pad_token_id, model.config.decoder_start_token_id)
    np.testing.assert_array_equal(np.where(weights, rows.arrays["decoder_input_ids"], 0),
                                  np.where(weights, shifted.numpy(), 0))
    embedding = "shared.weight" if name == "t5" else "model.shared.weight"
    theirs_grad = dict(model.named_parameters())[embedding].grad.numpy()
    np.testing.assert_allclose(np.asarray(grads["shared"]["embedding"]), theirs_grad, atol=2e-5, rtol=1e-4)


def test_squad_is_cast_as_t5_casts_it():
    record = RECORDS[1]
    assert squad_cast(record) == {"source": "question: Who met Bob? context: Ann met Bob at the station before the "
                                            "train left.", "target": "Ann"}
