"""Every objective end to end through the command line, on the CPU: `jaxlm prepare` then `jaxlm
train` with its configs/<family>-tiny.yaml on real text, and the held-out loss falls well below its
value at step 0 (the trainer evaluates before the first step).

To keep 7 runs cheap their models are one layer deep (as the other tests' tiny models: conftest's TINY) and the
WordPiece families use a 2,000-piece vocabulary that `jaxlm tokenizer train` learns from the same novels first;
T5 keeps its config's real SentencePiece model. BERT reads the novels through our TFDS builder
(`tfds:jaxlm_demo_corpus/austen`), the others from the text file."""
from __future__ import annotations

import json

import pytest

from jaxlm.cli import main
from jaxlm.corpora.registry import fetch_austen

FAMILIES = ("bert", "roberta", "albert", "spanbert", "gpt2", "t5", "bart")
VOCAB = 2000
COMMON = ["model.num_layers=1", "data.max_seq_length=64", "data.max_predictions=10", "data.dupe_factor=1",
          "train.steps=60", "train.global_batch=16", "train.log_every=20", "train.eval_every=1000",
          "train.eval_batches=8", "train.checkpoint_every=1000", "optim.warmup_steps=10"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    assert main(["tokenizer", "train", "--input", str(fetch_austen()), "--vocab-size", str(VOCAB),
                 "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == VOCAB
    return out


def eval_losses(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "eval"}


@pytest.mark.parametrize("family", FAMILIES)
def test_objective_trains_from_its_config(family, vocab, tmp_path, capsys):
    config = f"configs/{family}-tiny.yaml"
    corpus = ["data.corpus=[tfds:jaxlm_demo_corpus/austen]", f"data.tfds_data_dir={tmp_path / 'tfds'}"]
    overrides = COMMON + [f"data.prepared_dir={tmp_path / 'data'}", f"train.run_dir={tmp_path / 'run'}",
                          *(corpus if family == "bert" else ["data.corpus=[demo:austen]"])]
    if family != "t5":
        overrides += [f"data.vocab={vocab}", f"model.vocab_size={VOCAB}"]
    assert main(["prepare", config, *overrides]) == 0
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert manifest["family"] == family and manifest["splits"]["valid"]["examples"] >= 8 * 16
    assert manifest["inputs"] == (["tfds:jaxlm_demo_corpus/austen"] if family == "bert" else [str(fetch_austen().resolve())])
    assert main(["train", config, *overrides]) == 0
    assert "held-out loss" in capsys.readouterr().out
    losses = eval_losses(tmp_path / "run")
    first, last = losses[0], losses[60]
    with capsys.disabled():
        print(f"\n{family}: held-out loss {first:.3f} at step 0 -> {last:.3f} at step 60")
    assert last < 0.8 * first, (family, first, last)
