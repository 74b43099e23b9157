"""Fine-tuning heads on the BERT-like backbones against transformers (PyTorch, CPU, fp32): logits of
BertForSequenceClassification (single sequences and pairs, classification and regression),
BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice, and the sequence heads
of RoBERTa (dense + tanh on <s>) and DistilBERT (dense + ReLU on [CLS]), for the same weights; and the
fine-tuning objectives' losses and gradients against the same heads' `loss.backward()`."""
from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import random_model, right_padded, torch_tensors  # noqa: E402
from jaxlm.convert import hf, hf_encoders, registry, task_heads  # noqa: E402
from jaxlm.models.task_heads import (MultipleChoice, QuestionAnswering, SequenceClassifier,  # noqa: E402
                                     TokenClassifier)
from jaxlm.objectives.finetune import (MultipleChoiceObjective, QuestionAnsweringObjective,  # noqa: E402
                                       SequenceClassificationObjective, TokenClassificationObjective)

ATOL = 1e-4
VOCAB = 1000
LENGTHS = np.array([16, 11, 7, 13])
BERT = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu")
ROBERTA = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               max_position_embeddings=66, type_vocab_size=1, hidden_act="gelu", layer_norm_eps=1e-5,
               pad_token_id=1, bos_token_id=0, eos_token_id=2)
DISTILBERT = dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64,
                  activation="gelu", pad_token_id=0)


HEAD_OF = {"BertForSequenceClassification": "sequence_classification",
           "BertForTokenClassification": "token_classification",
           "BertForQuestionAnswering": "question_answering", "BertForMultipleChoice": "multiple_choice"}


def bert(model_class: str, **fields):
    """(transformers model, our config, its tensors, our head's params through jaxlm.convert.task_heads, which
    reads the number of classes from the classifier) of a small random BERT with that head."""
    model = random_model(getattr(transformers, model_class),
                         transformers.BertConfig(**BERT, **fields, attn_implementation="eager"))
    config = hf.bert_config_from_hf(model.config.to_dict(), dtype="float32")
    tensors = torch_tensors(model)
    params = task_heads.task_params_from_hf(tensors, config, HEAD_OF[model_class])  # the classes read from them
    return model, config, tensors, params


def inputs(pairs: bool, pad: int = 0, seed: int = 0):
    ids, mask = right_padded(LENGTHS, VOCAB, pad, np.random.default_rng(seed), low=5)
    segments = (np.arange(ids.shape[1])[None, :] >= (LENGTHS[:, None] // 2)) & mask if pairs else np.zeros_like(ids)
    return ids.astype(np.int32), segments.astype(np.int32), mask


def torch_inputs(ids, segments, mask, with_segments: bool = True):
    out = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask.astype(np.int64))}
    return out | ({"token_type_ids": torch.tensor(segments)} if with_segments else {})


@pytest.mark.parametrize("labels, pairs", [(3, False), (3, True), (1, True)])
def test_bert_sequence_classification(labels, pairs):
    model, config, tensors, params = bert("BertForSequenceClassification", num_labels=labels)
    ids, segments, mask = inputs(pairs)
    ours = SequenceClassifier(config, labels).apply({"params": params}, ids, segments, mask)
    with torch.no_grad():
        theirs = model(**torch_inputs(ids, segments, mask)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=ATOL)


def test_bert_token_classification():
    model, config, tensors, params = bert("BertForTokenClassification", num_labels=5)
    ids, segments, mask = inputs(False)
    ours = np.asarray(TokenClassifier(config, 5).apply({"params": params}, ids, segments, mask))
    with torch.no_grad():
        theirs = model(**torch_inputs(ids, segments, mask)).logits.numpy()
    np.testing.assert_allclose(ours[mask], theirs[mask], atol=ATOL)


def test_bert_question_answering():
    model, config, tensors, params = bert("BertForQuestionAnswering")
    ids, segments, mask = inputs(True)
    start, end = QuestionAnswering(config).apply({"params": params}, ids, segments, mask)
    with torch.no_grad():
        out = model(**torch_inputs(ids, segments, mask))
    np.testing.assert_allclose(np.asarray(start)[mask], out.start_logits.numpy()[mask], atol=ATOL)
    np.testing.assert_allclose(np.asarray(end)[mask], out.end_logits.numpy()[mask], atol=ATOL)


def test_bert_multiple_choice():
    model, config, tensors, params = bert("BertForMultipleChoice")
    ids, segments, mask = inputs(True)
    as_choices = lambda x: x.reshape(2, 2, -1)  # 2 examples of 2 choices
    ours = MultipleChoice(config).apply({"params": params}, as_choices(ids), as_choices(segments), as_choices(mask))
    with torch.no_grad():
        theirs = model(**{k: v.reshape(2, 2, -1) for k, v in torch_inputs(ids, segments, mask).items()}).logits
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=ATOL)


OTHERS = {  # family -> transformers classes, small config, our config converter, pad id
    "roberta": ("RobertaForSequenceClassification", "RobertaForMultipleChoice", "RobertaConfig", ROBERTA,
                hf_encoders.roberta_config_from_hf, 1),
    "distilbert": ("DistilBertForSequenceClassification", "DistilBertForMultipleChoice", "DistilBertConfig",
                   DISTILBERT, hf_encoders.distilbert_config_from_hf, 0),
}


@pytest.mark.parametrize("family", sorted(OTHERS))
@pytest.mark.parametrize("head", ["sequence_classification", "multiple_choice"])
def test_roberta_and_distilbert_heads_pool_as_theirs(family, head):
    """RoBERTa: dense + tanh on <s> (sequence), its pooler (choices); DistilBERT: dense + ReLU on [CLS]."""
    sequence_class, choice_class, config_class, small, config_from_hf, pad = OTHERS[family]
    model_class = sequence_class if head == "sequence_classification" else choice_class
    model = random_model(getattr(transformers, model_class),
                         getattr(transformers, config_class)(**small, num_labels=3, attn_implementation="eager"))
    config = config_from_hf(model.config.to_dict(), dtype="float32")
    params = task_heads.task_params_from_hf(torch_tensors(model), config, head, 3)
    ids, _, mask = inputs(False, pad=pad)
    module = task_heads.head_module(config, head, 3)
    shaped = (lambda x: x.reshape(2, 2, -1)) if head == "multiple_choice" else (lambda x: x)
    ours = module.apply({"params": params}, shaped(ids), None, shaped(mask))
    with torch.no_grad():
        theirs = model(**{k: shaped(v) for k, v in torch_inputs(ids, None, mask, with_segments=False).items()}).logits
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=ATOL)


@pytest.mark.parametrize("model_class", sorted(HEAD_OF))
def test_bert_heads_convert_both_ways_exactly(model_class):
    labels = {"num_labels": 4} if "Classification" in model_class else {}  # QA's two and choices' one are fixed
    model, config, tensors, params = bert(model_class, **labels)
    back = task_heads.task_params_to_hf(params, config, HEAD_OF[model_class], labels.get("num_labels", 2))
    expected = {k: v for k, v in tensors.items() if not k.endswith(("position_ids", "token_type_ids"))}
    assert sorted(back) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_a_padded_vocabulary_is_stripped_on_the_way_out():
    """A fine-tune of a model with padded token tables (model.vocab_multiple) gives Hugging Face's tensors."""
    model, config, tensors, params = bert("BertForSequenceClassification", num_labels=4)
    padded_config, padded = registry.padded_vocab(config, params, 128)
    assert padded_config.padded_vocab_size > config.vocab_size
    back = task_heads.task_params_to_hf(padded, padded_config, "sequence_classification", 4)
    expected = {k: v for k, v in tensors.items() if not k.endswith(("position_ids", "token_type_ids"))}
    assert sorted(back) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_a_head_the_family_lacks_and_a_misshapen_head_are_refused():
    model, config, tensors, _ = bert("BertForSequenceClassification", num_labels=3)
    with pytest.raises(ValueError, match="classifier.weight.*expected \\(4, 64\\), got \\(3, 64\\)"):
        task_heads.task_params_from_hf(tensors, config, "sequence_classification", 4)
    with pytest.raises(ValueError, match="has no span_labelling head"):
        task_heads.head_module(config, "span_labelling")


# ---------------------------------------------------------------- losses and gradients, through the objectives

def check_loss_and_gradient(model, objective, params, batch: dict, theirs_inputs: dict, head_layer: str):
    """The objective's loss (deterministic: no dropout, as transformers in eval mode) and its gradient at
    the word table and the head's `head_layer` equal transformers' `loss.backward()` on `theirs_inputs`."""
    loss_fn = lambda p: objective.summarize(objective.stats(p, batch, None, deterministic=True))["loss"]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    out = model(**theirs_inputs)
    out.loss.backward()
    assert float(loss) == pytest.approx(out.loss.item(), rel=1e-5)
    theirs = {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}
    # torch's Embedding(padding_idx=0) never gives the pad row a gradient
    np.testing.assert_allclose(np.asarray(grads["encoder"]["embeddings"]["word"]["embedding"])[1:],
                               theirs["bert.embeddings.word_embeddings.weight"][1:], atol=1e-5)
    np.testing.assert_allclose(np.asarray(grads[head_layer]["kernel"]).T, theirs[f"{head_layer}.weight"], atol=1e-5)


@pytest.mark.parametrize("labels", [3, 1])
def test_sequence_classification_loss_and_gradient(labels):
    model, config, tensors, params = bert("BertForSequenceClassification", num_labels=labels)
    ids, segments, mask = inputs(True)
    targets = np.array([0, 2, 1, 2]) if labels > 1 else np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    objective = SequenceClassificationObjective(config, ids.shape[1], functools.partial(SequenceClassifier,
                                                                                        num_labels=labels),
                                                regression=labels == 1)
    batch = {"input_ids": ids, "segment_ids": segments, "input_mask": mask.astype(np.int32), "label": targets,
             "example_weight": np.ones(4, np.float32)}
    check_loss_and_gradient(model, objective, params, batch,
                            torch_inputs(ids, segments, mask) | {"labels": torch.tensor(targets)}, "classifier")


def test_token_classification_loss_and_gradient_ignore_unlabelled_tokens():
    model, config, tensors, params = bert("BertForTokenClassification", num_labels=5)
    ids, segments, mask = inputs(False)
    labels = np.random.default_rng(1).integers(0, 5, ids.shape)
    weights = mask & (np.random.default_rng(2).random(ids.shape) < 0.6)
    objective = TokenClassificationObjective(config, ids.shape[1], functools.partial(TokenClassifier, num_labels=5))
    batch = {"input_ids": ids, "segment_ids": segments, "input_mask": mask.astype(np.int32), "labels": labels,
             "label_weights": weights.astype(np.float32)}
    check_loss_and_gradient(model, objective, params, batch, torch_inputs(ids, segments, mask)
                            | {"labels": torch.tensor(np.where(weights, labels, -100))}, "classifier")


def test_question_answering_loss_and_gradient():
    model, config, tensors, params = bert("BertForQuestionAnswering")
    ids, segments, mask = inputs(True)
    start, end = np.array([3, 0, 2, 5]), np.array([6, 0, 4, 9])
    objective = QuestionAnsweringObjective(config, ids.shape[1], QuestionAnswering)
    batch = {"input_ids": ids, "segment_ids": segments, "input_mask": mask.astype(np.int32),
             "start_position": start, "end_position": end, "answer_weight": np.ones(4, np.float32)}
    check_loss_and_gradient(model, objective, params, batch, torch_inputs(ids, segments, mask)
                            | {"start_positions": torch.tensor(start), "end_positions": torch.tensor(end)}, "qa_outputs")


def test_multiple_choice_loss_and_gradient():
    model, config, tensors, params = bert("BertForMultipleChoice")
    ids, segments, mask = inputs(True)
    as_choices = lambda x: x.reshape(2, 2, -1)
    label = np.array([1, 0])
    objective = MultipleChoiceObjective(config, ids.shape[1], MultipleChoice, choices=2)
    batch = {"input_ids": as_choices(ids), "segment_ids": as_choices(segments),
             "input_mask": as_choices(mask.astype(np.int32)), "label": label, "example_weight": np.ones(2, np.float32)}
    theirs = {k: v.reshape(2, 2, -1) for k, v in torch_inputs(ids, segments, mask).items()}
    check_loss_and_gradient(model, objective, params, batch, theirs | {"labels": torch.tensor(label)}, "classifier")


def test_from_hf_names_the_reader_of_a_fine_tuned_checkpoint(tmp_path):
    """from_hf of a BertForSequenceClassification listed `bert.classifier.bias` as unexpected, a name the
    checkpoint does not have; its config and `task_params_from_hf` read it, with transformers' logits."""
    model, config, _, params = bert("BertForSequenceClassification")
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"holds a fine-tuned BertForSequenceClassification, whose task head from_hf "
                                         r"has no place for; read it with jaxlm.convert.task_heads"):
        registry.from_hf(tmp_path)
    read = registry.config_from_hf(tmp_path, dtype="float32")
    assert read == config
    again = task_heads.task_params_from_hf(hf.read_tensors(tmp_path), read, "sequence_classification")
    assert jax.tree.all(jax.tree.map(np.array_equal, again, params))
