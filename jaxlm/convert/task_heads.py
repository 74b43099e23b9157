"""Hugging Face fine-tuned encoders (`*ForSequenceClassification`, `*ForTokenClassification`,
`*ForQuestionAnswering`, `*ForMultipleChoice`) <-> the heads of jaxlm.models.task_heads, both ways: the
backbone through its family's converter, the head's layers through the one name engine."""
from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxlm import families
from jaxlm.convert.registry import padded_vocab
from jaxlm.convert.names import Entry, dense, flatten, params_from_hf, params_to_hf, plain, unflatten
from jaxlm.models.config import TransformerConfig
from jaxlm.models.task_heads import MultipleChoice, QuestionAnswering, SequenceClassifier, TokenClassifier

HEADS = ("sequence_classification", "token_classification", "question_answering", "multiple_choice")
# A sequence head's layers are named after how it pools: BERT's and ALBERT's classifier on the pooler,
# RoBERTa's classifier.dense + out_proj, DistilBERT's pre_classifier + classifier.
POOLED_HEAD_NAMES = {"first_dense_tanh": ("classifier.dense", "classifier.out_proj"),
                     "first_dense_relu": ("pre_classifier", "classifier")}


def head_entries(head: str, pooling: str) -> list[Entry]:
    """The Hugging Face names of a head's layers (our `dense`, `classifier`, `qa_outputs`)."""
    if head == "question_answering":
        return dense("qa_outputs", "qa_outputs")
    if head == "token_classification" or pooling not in POOLED_HEAD_NAMES:
        return dense("classifier", "classifier")
    first, classifier = POOLED_HEAD_NAMES[pooling]
    return [*dense("dense", first), *dense("classifier", classifier)]


def head_module(config: TransformerConfig, head: str, num_labels: int = 2, pooling: str | None = None) -> nn.Module:
    """The head `head` on the family's backbone, pooling as the family's Hugging Face head (or `pooling`)."""
    family = families.get(config.family)
    if head not in HEADS or head not in family.heads or family.backbone is None:
        raise ValueError(f"a {config.family} model has no {head} head; its heads: "
                         f"{', '.join(h for h in family.heads if h in HEADS) or 'none'}")
    if head == "sequence_classification":
        return SequenceClassifier(config, num_labels, pooling or family.pooling, family.backbone)
    if head == "token_classification":
        return TokenClassifier(config, num_labels, family.backbone)
    if head == "question_answering":
        return QuestionAnswering(config, family.backbone)
    return MultipleChoice(config, pooling or family.choice_pooling, family.backbone)


def head_shapes(module: nn.Module, head: str) -> dict[str, tuple[int, ...]]:
    """'/'-joined path -> shape of every parameter of the head's own layers (not the encoder's)."""
    ids = jnp.zeros((1, 2, 4) if head == "multiple_choice" else (1, 4), jnp.int32)
    tree = jax.eval_shape(lambda: nn.unbox(module.init(jax.random.key(0), ids, ids, ids > -1))["params"])
    return {path: tuple(leaf.shape) for path, leaf in flatten(tree) if not path.startswith("encoder/")}


def _head_pooling(module: nn.Module) -> str:
    return getattr(module, "pooling", "")


def task_params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig, head: str,
                        num_labels: int | None = None, pooling: str | None = None) -> dict:
    """Our head's tree ({"encoder": ..., and the head's layers}) from a Hugging Face fine-tuned model's tensors;
    `num_labels` defaults to the classes its classifier has."""
    if num_labels is None:
        num_labels = checkpoint_labels(tensors, head, _head_pooling(head_module(config, head, 2, pooling)))
    module = head_module(config, head, num_labels, pooling)
    entries = head_entries(head, _head_pooling(module))
    theirs = {entry.theirs for entry in entries}
    backbone = families.get(config.family).converter("params_from_hf")(
        {k: v for k, v in tensors.items() if k not in theirs}, config)
    layers = params_from_hf({k: v for k, v in tensors.items() if k in theirs}, config, {"head": entries},
                            head_shapes(module, head), f"{config.family} {head} head")
    return {"encoder": backbone["encoder"], **layers}


def checkpoint_labels(tensors: Mapping[str, np.ndarray], head: str, pooling: str) -> int:
    """The classes of a fine-tuned checkpoint's classifier (a torch Linear's output rows); 2 where it has none."""
    weight = next((entry.theirs for entry in head_entries(head, pooling) if entry.ours == "classifier/kernel"), None)
    return int(tensors[weight].shape[0]) if weight in tensors else 2


def task_params_to_hf(params: Mapping, config: TransformerConfig, head: str, num_labels: int = 2,
                      pooling: str | None = None) -> dict[str, np.ndarray]:
    """A Hugging Face fine-tuned model's tensors from our head's tree (its vocabulary padding stripped)."""
    config, tree = padded_vocab(config, plain(params), 1)
    module = head_module(config, head, num_labels, pooling)
    layers = unflatten({path: value for path, value in flatten(tree) if not path.startswith("encoder/")})
    tensors = families.get(config.family).converter("params_to_hf")({"encoder": tree["encoder"]}, config)
    return tensors | params_to_hf(layers, config, {"head": head_entries(head, _head_pooling(module))},
                                  head_shapes(module, head), f"{config.family} {head} head")

