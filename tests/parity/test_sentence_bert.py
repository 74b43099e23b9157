"""Sentence-BERT against sentence-transformers (PyTorch, CPU, fp32) on the real all-MiniLM-L6-v2 and real
sentence pairs (consecutive sentences of the news corpus): SentenceEncoder's vectors equal `encode`'s
(mean pooling, before normalisation); the three objectives' losses and gradients (encoder and classifier)
equal SoftmaxLoss', CosineSimilarityLoss' and MultipleNegativesRankingLoss' `backward()`. Ours run jitted
with the batch split over 8 devices and two padding rows (pair_weight 0) that theirs never see."""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

torch = pytest.importorskip("torch")
sentence_transformers = pytest.importorskip("sentence_transformers")

from sentence_transformers.sentence_transformer import losses as st_losses  # noqa: E402

from jaxlm.convert import hf  # noqa: E402
from jaxlm.corpora.models import minilm_dir  # noqa: E402
from jaxlm.corpora.registry import fetch_news  # noqa: E402
from jaxlm.corpora.text import text_documents  # noqa: E402
from jaxlm.data.tokenizers.load import load_tokenizer  # noqa: E402
from jaxlm.models.sentence_bert import SentenceEncoder, SiameseClassifier  # noqa: E402
from jaxlm.objectives.sentence_pairs import (CosineSimilarityObjective, RankingObjective,  # noqa: E402
                                             SoftmaxPairObjective)
from jaxlm.parallel.rules import rules_for  # noqa: E402
from jaxlm.sentence_embedding import pad_batch  # noqa: E402

PAIRS = 6  # real pairs; two padding rows make a batch of 8, one per device
PADDING = 2
LABELS = np.array([0, 2, 1, 1, 0, 2])
SCORES = np.array([0.9, 0.2, 0.55, 0.75, 0.1, 0.4], np.float32)
RTOL = 1e-5  # losses and vectors
GRAD_RTOL = 5e-5  # each gradient tensor, relative to its largest entry (fp32 through six layers)


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """The news corpus' sentences, one document after another."""
    return [s for doc in text_documents(fetch_news()) for s in doc]


@pytest.fixture(scope="module")
def pairs(sentences) -> tuple[list[str], list[str]]:
    """(texts A, texts B): sentence 2k and sentence 2k+1 of the first documents, PAIRS + PADDING of them."""
    picked = sentences[:2 * (PAIRS + PADDING)]
    return picked[0::2], picked[1::2]


@pytest.fixture(scope="module")
def minilm():
    """(our config, our SentenceEncoder params) of all-MiniLM-L6-v2, float32, through the converter."""
    config, params = hf.load_hf_bert(minilm_dir(), dtype="float32")
    return config, {"encoder": params["encoder"]}


@pytest.fixture(scope="module")
def theirs():
    """sentence-transformers' all-MiniLM-L6-v2 without its Normalize module (Transformer + mean Pooling)."""
    full = sentence_transformers.SentenceTransformer(str(minilm_dir()), device="cpu",
                                                     model_kwargs={"attn_implementation": "eager"})
    assert type(full[1]).__name__ == "Pooling" and full[1].pooling_mode == "mean"
    return sentence_transformers.SentenceTransformer(modules=[full[0], full[1]], device="cpu").eval()


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.asarray(jax.devices()).reshape(-1, 1, 1), ("data", "fsdp", "tensor"))


def test_sentence_encoder_equals_encode(minilm, theirs, sentences):
    """Our tokenizer and SentenceEncoder on 40 real sentences give sentence-transformers' `encode` vectors."""
    config, params = minilm
    texts = sentences[:40]
    tokenizer = load_tokenizer(minilm_dir())
    rows = [tokenizer.encode(s, add_special_tokens=True) for s in texts]
    ids, mask = pad_batch(rows, len(rows), max(map(len, rows)), config.pad_token_id)
    ours = np.asarray(jax.jit(SentenceEncoder(config).apply)({"params": params}, ids, None, mask))
    reference = theirs.encode(texts, batch_size=16, normalize_embeddings=False, convert_to_numpy=True)
    error = np.abs(ours - reference).max() / np.abs(reference).max()
    print(f"SentenceEncoder vs encode on {len(texts)} news sentences: max abs diff / max abs {error:.2e}")
    assert ours.shape == reference.shape == (40, 384)
    assert error < RTOL


# ---------------------------------------------------------------- losses and gradients

def features(model, texts: list[str]) -> dict:
    return {k: v for k, v in model.preprocess(texts).items() if isinstance(v, torch.Tensor)}


def our_batch(theirs, pairs, extra: dict) -> dict:
    """Both columns as sentence-transformers tokenises them, padded to one length; the last PADDING rows
    are real sentences too, but weighted 0."""
    a, b = (features(theirs, side) for side in pairs)
    length = max(a["input_ids"].shape[1], b["input_ids"].shape[1])
    widen = lambda x: np.pad(x.numpy(), ((0, 0), (0, length - x.shape[1]))).astype(np.int32)
    weights = np.r_[np.ones(PAIRS), np.zeros(PADDING)].astype(np.float32)
    padded = {k: np.r_[v, np.zeros(PADDING, v.dtype)] for k, v in extra.items()}
    return {"input_ids_a": widen(a["input_ids"]), "input_mask_a": widen(a["attention_mask"]),
            "input_ids_b": widen(b["input_ids"]), "input_mask_b": widen(b["attention_mask"]),
            "pair_weight": weights} | padded


def our_loss_and_grads(objective, params, batch, mesh):
    """The objective's deterministic loss and gradient, jitted with the batch's rows split over the mesh."""
    loss_fn = lambda p, b: objective.summarize(objective.stats(p, b, None, deterministic=True))["loss"]
    rows = {k: NamedSharding(mesh, PartitionSpec("data")) for k in batch}
    replicated = NamedSharding(mesh, PartitionSpec())
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules_for("dp")):
        compute = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(replicated, rows))
        loss, grads = compute(params, batch)
    return float(loss), jax.tree.map(np.asarray, grads)


def their_loss_and_grads(loss_module, theirs, pairs, labels) -> tuple[float, dict]:
    """sentence-transformers' loss on the first PAIRS pairs, and the gradients of the encoder (named as
    transformers' BertModel names them) and of any head the loss owns (prefixed `loss.`)."""
    loss_module.zero_grad()
    theirs.zero_grad()
    columns = [features(theirs, side[:PAIRS]) for side in pairs]
    loss = loss_module(columns, torch.tensor(labels))
    loss.backward()
    encoder = theirs[0].model
    grads = {name: p.grad.numpy().copy() for name, p in encoder.named_parameters() if p.grad is not None}
    owned = {f"loss.{name}": p.grad.numpy().copy() for name, p in loss_module.named_parameters()
             if p.grad is not None and not name.startswith("model.")}
    return loss.item(), grads | owned


def check_gradients(config, ours: dict, reference: dict) -> None:
    """Every encoder tensor's gradient (and the classifier's, if any) within GRAD_RTOL of its largest entry; the
    attention key biases', zero in exact arithmetic (softmax ignores a shift shared by all keys), ~0 on
    both sides."""
    converted = hf.bert_params_to_hf({"encoder": ours["encoder"]}, config)
    named = {name.removeprefix("bert."): value for name, value in converted.items()}
    if "classifier" in ours:
        named |= {"loss.classifier.weight": ours["classifier"]["kernel"].T, "loss.classifier.bias":
                  ours["classifier"]["bias"]}
    assert set(reference) <= set(named), sorted(set(reference) - set(named))
    shift_free = [k for k in reference if k.endswith("attention.self.key.bias")]
    assert len(shift_free) == config.num_layers
    scale = max(np.abs(v).max() for v in reference.values())
    assert max(max(np.abs(named[k]).max(), np.abs(reference[k]).max()) for k in shift_free) < 1e-6 * scale
    worst = max((np.abs(named[k] - v).max() / np.abs(v).max(), k) for k, v in reference.items() if k not in shift_free)
    print(f"  {len(reference)} gradient tensors, worst max abs diff / max abs: {worst[0]:.2e} ({worst[1]})")
    assert worst[0] < GRAD_RTOL


def test_softmax_pair_loss_and_gradients(minilm, theirs, pairs, mesh):
    config, params = minilm
    torch.manual_seed(0)
    loss_module = st_losses.SoftmaxLoss(theirs, 384, num_labels=3)
    weight = loss_module.classifier.weight.detach().numpy()
    bias = loss_module.classifier.bias.detach().numpy()
    params = params | {"classifier": {"kernel": weight.T.copy(), "bias": bias.copy()}}
    batch = our_batch(theirs, pairs, {"label": LABELS})
    objective = SoftmaxPairObjective(config, batch["input_ids_a"].shape[1],
                                     functools.partial(SiameseClassifier, num_labels=3))
    loss, grads = our_loss_and_grads(objective, params, batch, mesh)
    reference_loss, reference = their_loss_and_grads(loss_module, theirs, pairs, LABELS)
    print(f"SoftmaxLoss: ours {loss:.8f}, theirs {reference_loss:.8f}")
    assert loss == pytest.approx(reference_loss, rel=RTOL)
    assert {"loss.classifier.weight", "loss.classifier.bias"} <= set(reference)
    check_gradients(config, grads, reference)


def test_cosine_similarity_loss_and_gradients(minilm, theirs, pairs, mesh):
    config, params = minilm
    loss_module = st_losses.CosineSimilarityLoss(theirs)
    batch = our_batch(theirs, pairs, {"score": SCORES})
    objective = CosineSimilarityObjective(config, batch["input_ids_a"].shape[1], SentenceEncoder)
    loss, grads = our_loss_and_grads(objective, params, batch, mesh)
    reference_loss, reference = their_loss_and_grads(loss_module, theirs, pairs, SCORES)
    print(f"CosineSimilarityLoss: ours {loss:.8f}, theirs {reference_loss:.8f}")
    assert loss == pytest.approx(reference_loss, rel=RTOL)
    check_gradients(config, grads, reference)


def test_ranking_loss_and_gradients_ignore_padding_rows(minilm, theirs, pairs, mesh):
    """The padding rows are real sentences: were they anchors or negatives, the loss would differ."""
    config, params = minilm
    loss_module = st_losses.MultipleNegativesRankingLoss(theirs)
    assert loss_module.scale == RankingObjective.scale
    batch = our_batch(theirs, pairs, {})
    objective = RankingObjective(config, batch["input_ids_a"].shape[1], SentenceEncoder)
    loss, grads = our_loss_and_grads(objective, params, batch, mesh)
    reference_loss, reference = their_loss_and_grads(loss_module, theirs, pairs, np.zeros(PAIRS))
    unweighted, _ = our_loss_and_grads(objective, params, batch | {"pair_weight": np.ones(8, np.float32)}, mesh)
    print(f"MultipleNegativesRankingLoss: ours {loss:.8f}, theirs {reference_loss:.8f}; "
          f"with the padding rows counted {unweighted:.8f}")
    assert loss == pytest.approx(reference_loss, rel=RTOL)
    assert abs(unweighted - reference_loss) > 1e-2
    check_gradients(config, grads, reference)
