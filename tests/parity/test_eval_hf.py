"""`jaxlm eval` log-likelihoods against transformers (PyTorch, CPU, fp32). The real sweep (jaxlm.eval.sweep:
plan, run) on converted checkpoints of SmolLM2-135M (from its GGUF), a random GPT-2 with GPT-2's own BPE and
a random BertForMaskedLM with bert-base-uncased's WordPiece, over a real choice task (0- and
2-shot) and a ppl file of Austen lines: every per-item log-likelihood in the examples files equals the one
transformers computes from the same token ids within 1e-4 relative (encoders: the pseudo-log-likelihood,
each continuation token masked in turn), and the accuracy recomputed from transformers' log-likelihoods
equals the one results.jsonl records. Also the library call jaxlm.eval.loglikelihoods on params in memory."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import pathlib

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import DECODERS, random_model, smollm2_transformers, torch_tensors  # noqa: E402
from jaxlm.convert import hf as hf_bert  # noqa: E402
from jaxlm.convert import registry, store  # noqa: E402
from jaxlm.corpora.models import bert_vocab_path, gpt2_tokenizer_dir, smollm2_gguf_path  # noqa: E402
from jaxlm.corpora.registry import fetch_austen  # noqa: E402
from jaxlm.data.tokenizers.load import load_tokenizer  # noqa: E402
from jaxlm.eval import Item, choice_accuracy, loglikelihoods, perplexity, sweep  # noqa: E402
from jaxlm.parallel.rules import MESH_AXES, rules_for  # noqa: E402

RTOL = 1e-4
TASK = "basic_arithmetic"  # the arithmetic_task fixture: 8 examples, 4 choices each
GPT2_POSITIONS = 64  # so that the long Austen line takes several windows, and 2-shot prompts lose their start
BERT_POSITIONS = 128
GPT2_EOS = 50256
BERT = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=BERT_POSITIONS, type_vocab_size=2, hidden_act="gelu")


# ---------------------------------------------------------------- inputs

@pytest.fixture(scope="session")
def choice_path(arithmetic_task) -> pathlib.Path:
    return arithmetic_task


@pytest.fixture(scope="session")
def austen_lines() -> dict[str, list[str]]:
    """Short lines of Emma (a few words to a sentence), and one long line (several GPT-2 windows of 64)."""
    lines = [line for line in fetch_austen().read_text(encoding="utf-8").splitlines() if line.strip()]
    short = [line for line in lines if 30 <= len(line) <= 120][:4]
    long = next(line for line in lines if 700 <= len(line) <= 800)
    return {"short": short, "with_long": short[:3] + [long]}


@pytest.fixture(scope="session")
def texts(tmp_path_factory, austen_lines) -> dict[str, pathlib.Path]:
    directory = tmp_path_factory.mktemp("ppl")
    paths = {}
    for name, lines in austen_lines.items():
        paths[name] = directory / f"austen_{name}.txt"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def task_specs(choice_path: pathlib.Path, ppl_path: pathlib.Path) -> list[str]:
    return [f"choice:{choice_path}@0,choice:{choice_path}@2,ppl:{ppl_path}"]


# ---------------------------------------------------------------- the sweep, and what it wrote

@dataclasses.dataclass
class Swept:
    """What one sweep over one converted checkpoint wrote: results.jsonl, and the examples rows by task."""

    results: list[dict]
    examples: dict[str, list[dict]]  # task name (choice:NAME@K, ppl:STEM) -> rows
    kinds: dict[str, str]  # task name -> choice or ppl
    errors: list[str]  # checkpoints the sweep reported and skipped


def read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run_sweep(checkpoint: pathlib.Path, specs: list[str], out: pathlib.Path, batch_size: int) -> Swept:
    plan = sweep.plan([str(checkpoint)], specs, out=str(out), batch_size=batch_size)
    progress = sweep.run(plan)
    label = plan.sources[0].label
    paths = {task.name: out / label / f"examples-{task.file_name}-0.jsonl" for task in plan.tasks}
    return Swept(read_jsonl(out / "results.jsonl") if (out / "results.jsonl").is_file() else [],
                 {name: read_jsonl(path) for name, path in paths.items() if path.is_file()},
                 {task.name: task.kind for task in plan.tasks}, progress.errors)


def record(swept: Swept, task: str, metric: str) -> dict:
    found = [r for r in swept.results if r["task"] == task and r["metric"] == metric]
    assert len(found) == 1, (task, metric, swept.results)
    return found[0]


# ---------------------------------------------------------------- transformers' side

@contextlib.contextmanager
def one_thread():
    """PyTorch on one intra-op thread: on a small machine shared with other work its thread pool
    stalls (SmolLM2's 2-shot prompts took 10x longer on two busy cores than on one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def causal_logliks(model, rows: list[dict], limit: int | None) -> list[np.ndarray]:
    """Per row, log p(continuation token | everything before it) under a transformers causal LM, from
    the row's own context + continuation ids; where the whole does not fit the model's `limit`
    positions, the context loses its start (the model reads the last `limit` tokens before each target).
    Consecutive rows with the same context (an example's choices) share one forward pass over it: the
    token after it from its last logits, the rest of each continuation on a copy of its KV cache."""
    out, shared = [], None
    for row in rows:
        assert row["context"] and row["continuation"]
        tokens = row["context"] + row["continuation"]
        tokens = tokens if limit is None else tokens[-(limit + 1):]
        count = len(row["continuation"])
        prefix, continuation = tuple(tokens[:-count]), tokens[-count:]
        with torch.no_grad(), one_thread():
            if shared is None or shared[0] != prefix:
                result = model(input_ids=torch.tensor([prefix]), use_cache=True)
                shared = prefix, torch.log_softmax(result.logits[0, -1].float(), dim=-1), result.past_key_values
            values = [float(shared[1][continuation[0]])]
            if count > 1:
                logits = model(input_ids=torch.tensor([continuation[:-1]]), past_key_values=copy.deepcopy(shared[2]),
                               use_cache=True).logits[0]
                log_probs = torch.log_softmax(logits.float(), dim=-1)
                values += log_probs[torch.arange(count - 1), continuation[1:]].tolist()
        out.append(np.array(values, np.float64))
    return out


def pseudo_logliks(model, rows: list[dict], mask_id: int) -> list[np.ndarray]:
    """Per row, BertForMaskedLM's log p(token | the whole context + continuation + suffix with that token
    masked) for each continuation token (token types 0, every position attended)."""
    out = []
    for row in rows:
        sequence = row["context"] + row["continuation"] + row.get("suffix", [])
        count, first = len(row["continuation"]), len(row["context"])
        positions = torch.arange(first, first + count)
        ids = torch.tensor(sequence).repeat(count, 1)
        ids[torch.arange(count), positions] = mask_id
        with torch.no_grad(), one_thread():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           token_type_ids=torch.zeros_like(ids)).logits
        log_probs = torch.log_softmax(logits[torch.arange(count), positions].float(), dim=-1).numpy()
        out.append(log_probs[np.arange(count), row["continuation"]].astype(np.float64))
    return out


# ---------------------------------------------------------------- the checks

def relative(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    return np.abs(ours - theirs) / np.abs(theirs)


def check_rows(name: str, task: str, rows: list[dict], theirs: list[np.ndarray]) -> float:
    """Every row's summed log-likelihood within RTOL of transformers'; ppl rows' token_logliks add up to it.
    Returns the largest relative difference."""
    assert rows and len(rows) == len(theirs)
    ours = np.array([row["loglik"] for row in rows])
    expected = np.array([t.sum() for t in theirs])
    assert (expected < 0).all()
    rel = relative(ours, expected)
    worst = int(np.argmax(rel))
    print(f"{name} {task}: {len(rows)} rows, {sum(len(r['continuation']) for r in rows)} tokens, max relative "
          f"difference {rel.max():.2e} (row {worst}: ours {ours[worst]:.6f}, transformers {expected[worst]:.6f})")
    assert rel.max() <= RTOL, (task, rows[worst], ours[worst], expected[worst])
    for row, their_tokens in zip(rows, theirs):
        if "token_logliks" in row:
            assert len(row["token_logliks"]) == len(row["continuation"]) == len(their_tokens)
            np.testing.assert_allclose(np.sum(row["token_logliks"], dtype=np.float64), row["loglik"], rtol=1e-6)
    return float(rel.max())


def check_choices(name: str, swept: Swept, task: str, choice_path: pathlib.Path, tokenizer,
                  theirs: list[np.ndarray]) -> None:
    """The rows hold each example's choices in the file's order; the accuracy recomputed from transformers'
    log-likelihoods (argmax per example is a highest-scored choice) equals results.jsonl's, and so do the
    rows' chosen / example_correct flags."""
    examples = json.loads(choice_path.read_text(encoding="utf-8"))["examples"]
    rows = swept.examples[task]
    assert [(r["example"], r["choice"]) for r in rows] == [
        (e, c) for e, example in enumerate(examples) for c in range(len(example["target_scores"]))]
    hits = []
    for index, example in enumerate(examples):
        picked = [i for i, r in enumerate(rows) if r["example"] == index]
        choices, scores = list(example["target_scores"]), list(example["target_scores"].values())
        assert [tokenizer.decode(rows[i]["continuation"]).strip() for i in picked] == choices
        pick = int(np.argmax([theirs[i].sum() for i in picked]))
        hits.append(scores[pick] == max(scores))
        assert [rows[i]["chosen"] for i in picked] == [c == pick for c in range(len(picked))], (task, index)
        assert all(rows[i]["example_correct"] == hits[-1] for i in picked)
    accuracy = record(swept, task, "accuracy")
    print(f"{name} {task}: accuracy {accuracy['value']:.3f} (transformers {np.mean(hits):.3f})")
    assert accuracy["examples"] == len(examples)
    assert accuracy["value"] == float(np.mean(hits))


def check_sweep(name: str, swept: Swept, choice_path: pathlib.Path, tokenizer, score) -> float:
    """Every task of a sweep against `score(rows) -> transformers' per-token log-likelihoods`; returns the
    largest relative difference."""
    worst = 0.0
    assert not swept.errors, swept.errors
    assert sorted(swept.kinds.values()) == ["choice", "choice", "ppl"] and set(swept.examples) == set(swept.kinds)
    for task, rows in swept.examples.items():
        theirs = score(rows)
        worst = max(worst, check_rows(name, task, rows, theirs))
        if swept.kinds[task] == "choice":
            check_choices(name, swept, task, choice_path, tokenizer, theirs)
    print(f"{name}: max relative difference over every row {worst:.2e}")
    return worst


# ---------------------------------------------------------------- SmolLM2-135M from its GGUF

@pytest.fixture(scope="session")
def smollm2_checkpoint(tmp_path_factory) -> pathlib.Path:
    """`jaxlm convert from-gguf` in process (float32, scanned layers: one compiled layer, not thirty)."""
    config, params, files = registry.from_gguf(smollm2_gguf_path(), scan_layers=True, dtype="float32")
    return store.save_converted(tmp_path_factory.mktemp("smollm2") / "ckpt", config, params, tokenizer_files=files,
                                source="gguf")


def test_smollm2_sweep_matches_transformers(smollm2_checkpoint, choice_path, texts, tmp_path):
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate installed")
    swept = run_sweep(smollm2_checkpoint, task_specs(choice_path, texts["short"]), tmp_path / "eval", batch_size=16)
    model = smollm2_transformers()
    tokenizer = load_tokenizer(smollm2_checkpoint / "tokenizer")
    check_sweep("SmolLM2-135M", swept, choice_path, tokenizer, lambda rows: causal_logliks(model, rows, None))


# ---------------------------------------------------------------- a random GPT-2 with GPT-2's BPE

@pytest.fixture(scope="session")
def gpt2():
    """(transformers model, our config, our params) of a small random GPT-2 with
    GPT-2's 50257-token vocabulary and 64 positions."""
    family = DECODERS["gpt2"]
    model = family.random_model(vocab_size=50257, n_positions=GPT2_POSITIONS, bos_token_id=GPT2_EOS,
                                eos_token_id=GPT2_EOS)
    config = family.config_from_hf(model.config.to_dict(), dtype="float32")
    params = family.params_from_hf(torch_tensors(model), config)
    return model, config, params


@pytest.fixture(scope="session")
def gpt2_checkpoint(gpt2, tmp_path_factory) -> pathlib.Path:
    """The random GPT-2 as a converted checkpoint; GPT-2's encoder.json / vocab.bpe under Hugging Face's
    names (vocab.json / merges.txt), which a converted checkpoint's tokenizer/ keeps."""
    _, config, params = gpt2
    source = gpt2_tokenizer_dir()
    files = {"vocab.json": (source / "encoder.json").read_text(encoding="utf-8"),
             "merges.txt": (source / "vocab.bpe").read_text(encoding="utf-8")}
    return store.save_converted(tmp_path_factory.mktemp("gpt2") / "ckpt", config, params, tokenizer_files=files,
                                source="random gpt2")


@pytest.fixture(scope="session")
def gpt2_hf_tokenizer(gpt2_checkpoint):
    """transformers' GPT-2 tokenizer, read from the converted checkpoint's tokenizer/ directory."""
    return transformers.GPT2Tokenizer.from_pretrained(str(gpt2_checkpoint / "tokenizer"))


def test_random_gpt2_sweep_matches_transformers(gpt2, gpt2_checkpoint, gpt2_hf_tokenizer, choice_path, texts,
                                                 austen_lines, tmp_path):
    model = gpt2[0]
    swept = run_sweep(gpt2_checkpoint, task_specs(choice_path, texts["with_long"]), tmp_path / "eval", batch_size=8)

    # The ppl items: transformers' GPT-2 ids of each line (no BOS), every id after the first scored once,
    # in windows of 64 predicted ids, each conditioned on the one id before it.
    rows = swept.examples["ppl:austen_with_long"]
    expected = []
    for number, line in enumerate(austen_lines["with_long"]):
        ids = gpt2_hf_tokenizer(line)["input_ids"]
        starts = range(0, len(ids) - 1, GPT2_POSITIONS)
        expected += [(number, w, ids[i:i + 1], ids[i + 1:i + 1 + GPT2_POSITIONS]) for w, i in enumerate(starts)]
    assert [(r["line"], r["window"], r["context"], r["continuation"]) for r in rows] == expected
    assert sum(len(r["continuation"]) for r in rows) == sum(len(gpt2_hf_tokenizer(line)["input_ids"]) - 1
                                                             for line in austen_lines["with_long"])
    assert max(r["window"] for r in rows) >= 2
    # 2-shot prompts are longer than the model reads: their context loses its start
    assert any(len(r["context"]) + len(r["continuation"]) > GPT2_POSITIONS + 1
               for r in swept.examples[f"choice:{TASK}@2"])

    tokenizer = load_tokenizer(gpt2_checkpoint / "tokenizer")
    check_sweep("random GPT-2", swept, choice_path, tokenizer,
                lambda rows: causal_logliks(model, rows, GPT2_POSITIONS))


def test_loglikelihoods_on_params_in_memory_match_transformers(gpt2, gpt2_hf_tokenizer):
    """jaxlm.eval.loglikelihoods on the converted tree as held (no checkpoint): short and long contexts,
    one- and many-token continuations, one item longer than the model's 64 positions."""
    model, config, params = gpt2
    encode = lambda text: tuple(gpt2_hf_tokenizer(text)["input_ids"])
    long = encode(" ".join(["It is a truth universally acknowledged, that a single man in possession"] * 8))
    items = [Item(encode("The capital of France is"), encode(" Paris")),
             Item(encode("1 + 4 ="), encode(" 5")),
             Item((GPT2_EOS,), encode("Emma Woodhouse, handsome, clever, and rich")),
             Item(encode("She was the youngest"), encode(" of the two daughters of a most affectionate father")),
             Item(long[:-10], long[-10:])]
    assert len(items[-1].context) + len(items[-1].continuation) > GPT2_POSITIONS + 1
    ours = loglikelihoods(config, params, items)
    assert ours.dtype == np.float64 and ours.shape == (len(items),)
    rows = [{"context": list(i.context), "continuation": list(i.continuation)} for i in items]
    theirs = np.array([t.sum() for t in causal_logliks(model, rows, GPT2_POSITIONS)])
    rel = relative(ours, theirs)
    print(f"loglikelihoods (random GPT-2, params in memory): max relative difference {rel.max():.2e}")
    assert rel.max() <= RTOL, (ours, theirs)
    explicit = jax.make_mesh((2, 2, 2), MESH_AXES, axis_types=(AxisType.Explicit,) * 3)  # once a sharding type error
    np.testing.assert_allclose(loglikelihoods(config, params, items, mesh=explicit, rules=rules_for("fsdp")), ours,
                               rtol=1e-5)


def test_library_tasks_on_params_in_memory_equal_the_sweeps(gpt2, gpt2_checkpoint, choice_path, texts,
                                                             austen_lines, tmp_path):
    """jaxlm.eval.perplexity and choice_accuracy on the tree as held give the sweep's numbers."""
    _, config, params = gpt2
    tokenizer = load_tokenizer(gpt2_checkpoint / "tokenizer")
    swept = run_sweep(gpt2_checkpoint, task_specs(choice_path, texts["with_long"]), tmp_path / "eval", batch_size=8)
    ppl = perplexity(config, params, tokenizer, austen_lines["with_long"])
    assert ppl["perplexity"] == pytest.approx(record(swept, "ppl:austen_with_long", "perplexity")["value"], rel=1e-6)
    assert ppl["tokens"] == record(swept, "ppl:austen_with_long", "tokens")["value"]
    metrics, rows = choice_accuracy(config, params, tokenizer, choice_path, 2)
    assert metrics["accuracy"] == record(swept, f"choice:{TASK}@2", "accuracy")["value"]
    assert [r["loglik"] for r in rows] == pytest.approx([r["loglik"] for r in swept.examples[f"choice:{TASK}@2"]],
                                                         rel=1e-6)


# ---------------------------------------------------------------- a random BertForMaskedLM

@pytest.fixture(scope="session")
def bert_checkpoint(tmp_path_factory):
    """(transformers BertForMaskedLM, checkpoint directory): a small random one with bert-base-uncased's
    WordPiece vocabulary, converted (encoder and MLM head; it has no pooler and no NSP head)."""
    model = random_model(transformers.BertForMaskedLM, transformers.BertConfig(**BERT, attn_implementation="eager"))
    config = hf_bert.bert_config_from_hf(model.config.to_dict(), dtype="float32")
    params = hf_bert.bert_params_from_hf(torch_tensors(model), config)
    assert hf_bert.missing_groups(params, config) == ["pooler", "nsp"]
    directory = store.save_converted(tmp_path_factory.mktemp("bert") / "ckpt", config, params,
                                     tokenizer_dir=bert_vocab_path(), source="random BertForMaskedLM")
    return model, directory


def test_random_bert_pseudo_logliks_match_transformers(bert_checkpoint, choice_path, texts, tmp_path):
    model, checkpoint = bert_checkpoint
    swept = run_sweep(checkpoint, task_specs(choice_path, texts["with_long"]), tmp_path / "eval", batch_size=64)
    assert not swept.errors
    tokenizer = load_tokenizer(checkpoint / "tokenizer")
    mask_id = tokenizer.token_to_id("[MASK]")
    rows = swept.examples["ppl:austen_with_long"]
    # [CLS] window [SEP], the long line in windows of the 126 tokens between them
    assert all(r["context"] == [tokenizer.token_to_id("[CLS]")] and r["suffix"] == [tokenizer.token_to_id("[SEP]")]
               for r in rows)
    assert max(r["window"] for r in rows) >= 1 and max(len(r["continuation"]) for r in rows) == BERT_POSITIONS - 2
    check_sweep("random BERT (MLM)", swept, choice_path, tokenizer, lambda rows: pseudo_logliks(model, rows, mask_id))
