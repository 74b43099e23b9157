"""`jaxlm embed` on all-MiniLM-L6-v2 (converted with `jaxlm convert from-hf`) against transformers' BertModel
(PyTorch, CPU, fp32) on the first 300 sentences of the news corpus (gensim's Lee corpus)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import minilm_tokenizer, minilm_transformers  # noqa: E402
from jaxlm.cli import main  # noqa: E402
from jaxlm.corpora.models import minilm_dir  # noqa: E402
from jaxlm.corpora.registry import fetch_news  # noqa: E402

SENTENCES = 300
MAX_LENGTH = 256
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(converted checkpoint, sentence file, the sentences) with every line a sentence of real news text."""
    root = tmp_path_factory.mktemp("embed")
    assert main(["convert", "from-hf", str(minilm_dir()), str(root / "minilm")]) == 0
    sentences = [line for line in fetch_news().read_text(encoding="utf-8").splitlines() if line.strip()][:SENTENCES]
    (root / "news.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return root, sentences


@pytest.fixture(scope="module")
def reference(setup):
    """transformers' last hidden states, pooled in float64: (mean over the attention mask, L2-normalised; [CLS])."""
    _, sentences = setup
    tokenizer, model = minilm_tokenizer(), minilm_transformers()
    means, first = [], []
    for start in range(0, len(sentences), 64):
        batch = tokenizer(sentences[start:start + 64], padding=True, truncation=True, max_length=MAX_LENGTH,
                          return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state.double().numpy()
        mask = batch["attention_mask"].numpy()[..., None]
        means.append((hidden * mask).sum(1) / mask.sum(1))
        first.append(hidden[:, 0])
    mean = np.concatenate(means)
    return mean / np.linalg.norm(mean, axis=-1, keepdims=True), np.concatenate(first)


def run_embed(setup, name: str, *args, checkpoint: str = "minilm") -> np.ndarray:
    root, sentences = setup
    output = root / f"{name}.npy"
    assert main(["embed", str(root / checkpoint), "--input", str(root / "news.txt"), "--output", str(output),
                 "--max-length", str(MAX_LENGTH), *args]) == 0
    vectors = np.load(output)
    assert vectors.dtype == np.float32 and vectors.shape == (len(sentences), 384)
    return vectors


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_mean_pooled_normalised_embeddings_match_transformers(setup, reference, capsys):
    vectors = run_embed(setup, "mean", "--pooling", "mean", "--normalize", "--batch-size", "64")
    assert "shape (300, 384) float32" in capsys.readouterr().out
    theirs, _ = reference
    cos = cosines(vectors, theirs)
    print(f"all-MiniLM-L6-v2 mean+L2 on {len(cos)} news sentences: min cosine {cos.min():.8f}, "
          f"max abs diff {np.abs(vectors - theirs).max():.2e}")
    assert cos.min() >= MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-6)
    # Neighbours are a property of the text: sentences of one article sit closer than random pairs.
    assert (vectors[:-1] * vectors[1:]).sum(-1).mean() > (vectors[:-150] * vectors[150:]).sum(-1).mean()


def test_cls_pooled_embeddings_match_transformers(setup, reference):
    vectors = run_embed(setup, "cls", "--pooling", "cls", "--batch-size", "128")
    _, theirs = reference
    cos = cosines(vectors, theirs)
    print(f"all-MiniLM-L6-v2 [CLS] on {len(cos)} news sentences: min cosine {cos.min():.8f}, "
          f"max abs diff {np.abs(vectors - theirs).max():.2e}")
    assert cos.min() >= MIN_COSINE
    assert np.abs(vectors - theirs).max() < 1e-4


def test_a_batch_larger_than_the_input_and_the_step_folder_give_the_same_vectors(setup, reference):
    """Every batch was padded to --batch-size rows: 10^8 of them ended in an XLA abort (SIGABRT). The step folder
    (minilm/0) was said to have no tokenizer, which lies beside the steps."""
    vectors = run_embed(setup, "huge", "--pooling", "cls", "--batch-size", str(10 ** 8), checkpoint="minilm/0")
    assert np.abs(vectors - reference[1]).max() < 1e-4


def test_long_sentences_are_truncated_as_transformers_truncates(setup, tmp_path):
    """Lines longer than --max-length keep their first tokens and the closing [SEP]."""
    root, sentences = setup
    lines = [" ".join(sentences[:6]), " ".join(sentences[6:9]), sentences[9]]
    (tmp_path / "long.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "long.npy"
    assert main(["embed", str(root / "minilm"), "--input", str(tmp_path / "long.txt"), "--output", str(output),
                 "--max-length", "40", "--pooling", "mean", "--normalize"]) == 0
    batch = minilm_tokenizer()(lines, padding=True, truncation=True, max_length=40, return_tensors="pt")
    assert batch["attention_mask"].sum(1).tolist()[:2] == [40, 40]
    with torch.no_grad():
        hidden = minilm_transformers()(**batch).last_hidden_state.double().numpy()
    mask = batch["attention_mask"].numpy()[..., None]
    theirs = (hidden * mask).sum(1) / mask.sum(1)
    assert cosines(np.load(output), theirs).min() >= MIN_COSINE
