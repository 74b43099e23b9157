"""Every objective's pipeline end to end on real text (Jane Austen): `prepare` -> `PretrainingData`
-> batches, checked against the objective's declared batch and each corruption's definition."""
import dataclasses
import errno
import gc
import hashlib
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import psutil
import pytest

from jaxlm import config as jaxlm_config
from jaxlm.corpora.registry import fetch_austen
from jaxlm.corpora.text import text_documents
from jaxlm.data import records, transfer
from jaxlm.data.denoising import t5_lengths
from jaxlm.data.layouts import encode_row
from jaxlm.data.pipeline import PretrainingData
from jaxlm.data.prepare import WORD_STARTS, partial_dir, prepare
from jaxlm.data.seeds import row_generators, seed_states
from jaxlm.data.sources import model_tokenizer
from jaxlm.families import make_objective

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAMILIES = ("bert", "roberta", "albert", "spanbert", "gpt2", "t5", "bart")
CHAPTERS = 80
SHARD_SIZE = 500
BATCH = 16
SEED = 7


# ------------------------------------------------------------------------------------ fixtures

@dataclasses.dataclass
class Prepared:
    family: str
    config: object
    tokenizer: object
    path: pathlib.Path
    manifest: dict

    def open(self, split="train", seed=SEED, **settings):
        return PretrainingData(self.path, split, seed=seed, family=self.family,
                               tokenizer_fingerprint=self.tokenizer.fingerprint(),
                               vocab_size=self.tokenizer.vocab_size,
                               max_seq_length=self.config.data.max_seq_length, data=self.config.data, **settings)

    @property
    def special(self):
        return self.manifest["special_ids"]


def load_config(family):
    return jaxlm_config.load(ROOT / "configs" / f"{family}-tiny.yaml",
                             ["data.valid_fraction=0.1", f"data.shard_size={SHARD_SIZE}", "data.seed=3"])


@pytest.fixture(scope="module")
def austen_chapters():
    """The first CHAPTERS chapters of Austen, as the lines of each (one sentence a line)."""
    blocks = fetch_austen().read_text(encoding="utf-8").strip("\n").split("\n\n")
    return [block.split("\n") for block in blocks[:CHAPTERS]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, austen_chapters):
    path = tmp_path_factory.mktemp("corpus") / "austen80.txt"
    path.write_text("\n\n".join("\n".join(c) for c in austen_chapters) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def build(tmp_path_factory, corpus):
    """build(family, **prepare overrides) -> Prepared, each prepared once per module."""
    cache = {}
    root = tmp_path_factory.mktemp("prepared")

    def get(family, **overrides):
        key = (family, tuple(sorted(overrides.items())))
        if key not in cache:
            config = load_config(family)
            config = dataclasses.replace(config, data=dataclasses.replace(config.data, **overrides))
            tokenizer = model_tokenizer(config)
            path = root / f"{family}-{len(cache)}"
            manifest = prepare([corpus], path, tokenizer, family=family, data=config.data, progress=False)
            cache[key] = Prepared(family, config, tokenizer, path, manifest)
        return cache[key]

    return get


@pytest.fixture(scope="module", params=FAMILIES)
def prepared(request, build):
    return build(request.param)


def stored_rows(data):
    return [data.raw(i) for i in range(len(data))]


def unmasked(ex):
    """The example's input with every masked target put back."""
    ids = ex["input_ids"].copy()
    chosen = ex["masked_weights"] > 0
    ids[ex["masked_positions"][chosen]] = ex["masked_labels"][chosen]
    return ids[:int(ex["input_mask"].sum())]


# -------------------------------------------------------------------- every family: the batches

def test_batches_match_the_declared_fields(prepared):
    objective = make_objective(prepared.config.model, prepared.config.data)
    shapes = objective.batch_shapes(BATCH)
    assert len(prepared.manifest["splits"]["train"]["shards"]) > 1  # batches gather across shards
    for split in ("train", "valid"):
        data = prepared.open(split)
        per_epoch = data.steps_per_epoch(BATCH)
        # train: the first batch of epochs 0 and 1; valid: every batch of epoch 0 (every row)
        for step in ((0, per_epoch) if split == "train" else range(per_epoch)):
            batch = data.local_batch(step, BATCH)
            assert sorted(batch) == sorted(shapes), (prepared.family, split)
            for name, spec in shapes.items():
                assert batch[name].shape == spec.shape, (prepared.family, name)
                assert batch[name].dtype == np.dtype(spec.dtype), (prepared.family, name, batch[name].dtype)


def _long_rows(data, minimum, count=6):
    """Indices of rows long enough that two epochs' corruptions cannot plausibly coincide."""
    found = [i for i in range(len(data)) if len(data.raw(i).tokens) >= minimum][:count]
    assert len(found) == count
    return found


def _equal(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_examples_are_deterministic(prepared):
    first, second = prepared.open(), prepared.open()
    indices = _long_rows(first, prepared.config.data.max_seq_length // 2)
    for index in indices:
        for epoch in (0, 1, 5):
            assert _equal(first.example(index, epoch), second.example(index, epoch)), (index, epoch)
        same = _equal(first.example(index, 0), first.example(index, 1))
        if prepared.family == "gpt2":
            assert same, "causal LM examples have no randomness"
        else:
            assert not same, (prepared.family, index, "epoch 1 repeats epoch 0's corruption")
    other = prepared.open(seed=SEED + 1)
    for step in (0, 1, first.steps_per_epoch(BATCH)):
        epoch, a = first.batch_indices(step, BATCH)
        again = second.batch_indices(step, BATCH)
        assert again[0] == epoch and np.array_equal(again[1], a)
        assert not np.array_equal(other.batch_indices(step, BATCH)[1], a)
    assert not np.array_equal(first.permutation(0), first.permutation(1))
    assert sorted(first.permutation(0)) == list(range(len(first)))


def test_process_slices_make_the_global_batch(prepared):
    data = prepared.open()
    for step in (1, data.steps_per_epoch(BATCH) + 2):
        whole = data.local_batch(step, BATCH, 0, 1)
        parts = [data.local_batch(step, BATCH, p, 2) for p in (0, 1)]
        for name in whole:
            assert parts[0][name].shape[0] == BATCH // 2
            assert np.array_equal(np.concatenate([p[name] for p in parts]), whole[name]), name


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_resumes_at_any_step_with_any_number_of_workers(prepared, workers):
    """grain's loader, in a thread or in 2 worker processes: each process's slice of the batches from any
    step on, across an epoch's end, exactly as built in place; the workers' batches come through their
    shared-memory slots (each slot reused: more batches than slots, all kept until the end)."""
    data = prepared.open()
    start = data.steps_per_epoch(BATCH) - 2  # crosses into epoch 1
    steps = 2 * transfer.SLOTS_PER_WORKER + 2 if workers else 4
    for process in (0, 1):
        stream = data.iterate(start, BATCH, process, 2, workers=workers)
        try:
            got = [next(stream) for _ in range(steps)]
        finally:
            stream.close()
        for k, batch in enumerate(got):
            assert _equal(batch, data.local_batch(start + k, BATCH, process, 2)), (process, k)
            assert transfer.layout(batch)[1] <= data.slot_bytes(BATCH // 2)  # it fit in a slot
    assert not _slots_left()


def _slots_left(trainer_pid: int | None = None) -> list[str]:
    """The shared-memory blocks of a trainer's loaders (this process's by default) still on the shared-memory
    filesystem."""
    return [p.name for p in pathlib.Path("/dev/shm").glob(f"jaxlm-{trainer_pid or os.getpid()}-*")]


def test_a_worker_waits_for_its_slot_and_a_closed_loader_frees_it(build, monkeypatch):
    """One slot per worker: the worker waits until the trainer has copied each batch out before sending the
    next, and the batches are still the right ones; a loader closed while its worker waits closes at once
    (grain would wait 25 s before it killed the worker) and leaves no shared memory behind."""
    monkeypatch.setattr(transfer, "SLOTS_PER_WORKER", 1)
    data = build("bert").open()
    stream = data.iterate(0, BATCH, workers=1)
    got = [next(stream) for _ in range(4)]
    time.sleep(1.0)  # the worker fills its slot and waits for it
    started = time.perf_counter()
    stream.close()
    assert time.perf_counter() - started < 20
    for k, batch in enumerate(got):
        assert _equal(batch, data.local_batch(k, BATCH))
    assert not _slots_left()


def test_the_trainer_reads_a_batch_in_its_slot_while_the_batch_lives(monkeypatch):
    """A received batch is a view of its slot, not a copy: the slot stays the trainer's while any of the batch's
    arrays lives and goes back to the worker after. Past LEASES_PER_WORKER held batches the next are copied out,
    so a consumer that keeps every batch never leaves its worker without a slot. A batch kept past the loader's
    end stays readable, and the slots' names are gone."""
    monkeypatch.setattr(transfer, "worker_index", 0)  # this process is the worker too
    sent = [{"ids": np.arange(12, dtype=np.int32).reshape(3, 4) + k, "weights": np.full(5, k, np.float32)}
            for k in range(2 * transfer.SLOTS_PER_WORKER)]
    ring = transfer.SlotRing(1, transfer.layout(sent[0])[1])
    slots = [np.frombuffer(block.buf, np.uint8) for block in ring._blocks[0]]

    def slot_of(batch: dict) -> list[int]:
        return [s for s, memory in enumerate(slots) if np.shares_memory(batch["ids"], memory)]

    got = [ring.receive(ring.send(batch)) for batch in sent]
    assert all(_equal(a, b) for a, b in zip(sent, got))
    leases = transfer.LEASES_PER_WORKER
    assert [slot_of(batch) for batch in got[:leases + 1]] == [[0], [1], []]  # two leased, the next copied
    full = [s for s, block in enumerate(ring._blocks[0]) if block.buf[transfer.STATE] == transfer.FULL]
    assert full == [0, 1]
    weights = got[0]["weights"]
    del got[0]
    assert ring._blocks[0][0].buf[transfer.STATE] == transfer.FULL  # one of its arrays lives on
    del weights
    assert ring._blocks[0][0].buf[transfer.STATE] == transfer.FREE
    assert len(slot_of(ring.receive(ring.send(sent[0])))) == 1  # a lease was freed: leased again
    on_device = jax.device_put(got[0]["ids"])  # jax on the CPU reads the slot in place: it holds the lease
    del got[0]
    assert ring._blocks[0][1].buf[transfer.STATE] == transfer.FULL and np.array_equal(on_device, sent[1]["ids"])
    del on_device
    gc.collect()  # jax lets go of the host memory it read in place through a reference cycle
    assert ring._blocks[0][1].buf[transfer.STATE] == transfer.FREE
    kept = ring.receive(ring.send(sent[3]))
    assert len(slot_of(kept)) == 1
    slots.clear()  # their views of the blocks would keep the blocks from closing
    ring.close()
    ring.unlink()
    assert not _slots_left()
    assert _equal(kept, sent[3]) and _equal(got[0], sent[2])  # leased, and copied: both readable


TRAINER = """
import sys, psutil
from jaxlm.data.pipeline import PretrainingData
stream = PretrainingData(sys.argv[1], "train", seed=0).iterate(0, 4, workers=2)
next(stream)
print(*[p.pid for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())], flush=True)
input()
"""


def test_the_workers_exit_when_their_trainer_is_killed(build):
    """SIGKILL to the trainer: its workers, which grain would leave waiting to hand over a batch, exit (one
    may still be starting: it exits once started), and the resource tracker removes their shared memory."""
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(build("bert").path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, cwd=ROOT)
    workers = [psutil.Process(int(pid)) for pid in trainer.stdout.readline().split()]
    assert len(workers) == 2
    trainer.kill()
    trainer.wait()
    gone, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive
    deadline = time.time() + 60
    while _slots_left(trainer.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _slots_left(trainer.pid)


def test_without_room_for_slots_the_batches_are_pickled(build, monkeypatch):
    """A shared-memory filesystem too small for the slots: the workers' batches come through grain's pipe,
    the same batches."""
    monkeypatch.setattr(transfer, "_shm_free_bytes", lambda: 1 << 20)
    data = build("gpt2").open()
    assert transfer.SlotRing.for_batches(2, data.slot_bytes(BATCH)) is None
    stream = data.iterate(0, BATCH, workers=2)
    try:
        for k in range(3):
            assert _equal(next(stream), data.local_batch(k, BATCH))
    finally:
        stream.close()


def test_a_worker_that_cannot_build_its_batch_fails_the_loader_with_its_error(build, tmp_path):
    """The split's directory loses its word table after opening: a worker, which opens its own copy, fails,
    and the trainer's next() raises that error rather than waiting or passing on a batch."""
    prepared = build("bert")
    copy = tmp_path / "copy"
    shutil.copytree(prepared.path, copy)
    data = dataclasses.replace(prepared, path=copy).open()
    (copy / WORD_STARTS).unlink()
    stream = data.iterate(0, BATCH, workers=1)
    with pytest.raises(ValueError, match=WORD_STARTS):
        next(stream)
    stream.close()



# Digests of every stored row (train and valid) and of the train batches of steps 0, 1 and the first of
# epoch 1, per family, pinned before the data work of issue 13 (streaming and Beam preparation, grain
# loading, vectorised transforms): that work must not change one example. GPT-2's changed since, once: its byte-level
# BPE now reads the space between a document's sentences (" The", not "The", after a full stop).
PINNED = {"bert": {"rows": "8823bb100164a08f", "batches": "dcb63f4842ce5ed3"},
          "roberta": {"rows": "08103bb8bd4c9374", "batches": "be1f66d70230cdfe"},
          "albert": {"rows": "aabc1d10f7da5111", "batches": "a660c91fc1376e8e"},
          "spanbert": {"rows": "08103bb8bd4c9374", "batches": "939e1006e9906448"},
          "gpt2": {"rows": "4f69e63a9a0e93a5", "batches": "e2b24c609e8133a8"},
          "t5": {"rows": "0ee4a1c11e2f1f36", "batches": "34bbda811e590ac5"},
          "bart": {"rows": "ba2ab6467a4a05f3", "batches": "1fea7bdc369ca189"}}


def _digest(arrays) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def test_rows_and_batches_are_the_pinned_ones(prepared):
    train, valid = prepared.open("train"), prepared.open("valid")
    rows = _digest(np.frombuffer(encode_row(data.raw(i)), np.uint8) for data in (train, valid)
                   for i in range(len(data)))
    batches = [train.local_batch(step, BATCH) for step in (0, 1, train.steps_per_epoch(BATCH))]
    got = {"rows": rows, "batches": _digest(batch[name] for batch in batches for name in sorted(batch))}
    assert got == PINNED[prepared.family], (prepared.family, got)


# ------------------------------------------------------------------------------ causal (gpt2)

def _split_documents(prepared, corpus, split):
    """The split's documents tokenized here, in prepare's order, each a flat token list: a document's text (its
    sentences as the one text they were, a space between) read whole by the tokenizer."""
    documents = text_documents(corpus)
    chosen = json.loads((prepared.path / "documents.json").read_text())[split]
    assert all(source == 0 for source, _ in chosen)
    out = []
    for _, d in chosen:
        tokens = prepared.tokenizer.encode(" ".join(documents[d]))
        if tokens:
            out.append(tokens)
    return out


def test_causal_packed_rows(build, corpus):
    prepared = build("gpt2")
    seq, eos = prepared.config.data.max_seq_length, prepared.special["eos"]
    for split in ("train", "valid"):
        data = prepared.open(split)
        rows = stored_rows(data)
        for index, row in enumerate(rows):
            tokens = row.tokens
            assert len(tokens) <= seq + 1
            ex = data.example(index, 0)
            n = min(len(tokens), seq)
            inputs = tokens[:n]
            assert np.array_equal(ex["input_ids"][:n], inputs)
            is_eos = inputs == eos
            weights = ex["target_weights"]
            assert np.array_equal(weights[:n] == 0, is_eos) and not weights[n:].any()
            predicted = np.flatnonzero(~is_eos)
            assert (predicted + 1 < len(tokens)).all(), "a weighted position has its next token in the row"
            assert np.array_equal(ex["targets"][predicted], tokens[predicted + 1])
            segments = ex["segment_ids"]
            assert segments[0] == 1 and not segments[n:].any()
            steps = np.diff(segments[:n])
            assert np.array_equal(steps, is_eos[:-1].astype(steps.dtype)), "segments change exactly after EOS"
        # the rows, minus the lookahead token, are the split's stream cut in max_seq_length pieces
        documents = _split_documents(prepared, corpus, split)
        stream = np.concatenate([np.r_[d, eos] for d in documents]).astype(np.int32)
        assert sum(min(len(r.tokens), seq) for r in rows) == len(stream)
        expected = sorted(stream[i:i + seq + 1].tobytes() for i in range(0, len(stream), seq))
        assert sorted(r.tokens.astype(np.int32).tobytes() for r in rows) == expected


def test_causal_unpacked_rows_hold_one_document(build, corpus):
    prepared = build("gpt2", packed=False)
    assert prepared.manifest["packed"] is False
    seq, eos = prepared.config.data.max_seq_length, prepared.special["eos"]
    data = prepared.open("train")
    documents = _split_documents(prepared, corpus, "train")
    rows = stored_rows(data)
    assert len(rows) == len(documents)
    expected = sorted(np.r_[d, eos].astype(np.int32)[:seq + 1].tobytes() for d in documents)
    assert sorted(r.tokens.astype(np.int32).tobytes() for r in rows) == expected
    for index in range(len(data)):
        ex = data.example(index, 0)
        assert set(np.unique(ex["segment_ids"])) <= {0, 1}


# ------------------------------------------------------------------------------------------ t5

def test_a_run_whose_settings_did_not_make_the_rows_is_refused(build):
    """A T5 run with another noise density than its prepared rows' crashed after its compile (the targets' length is
    the run's); a BERT run may change what only T5 reads."""
    t5, bert = build("t5"), build("bert")
    message = (f"the data in {t5.path} was prepared with other settings (data.noise_density: prepared 0.15, this run "
               "0.3; data.seed: prepared 3, this run 4); re-run `jaxlm prepare CONFIG --overwrite`, or give this run "
               "the prepared values")
    with pytest.raises(ValueError) as raised:
        PretrainingData(t5.path, "train", seed=SEED, family="t5",
                        data=dataclasses.replace(t5.config.data, noise_density=0.3, seed=4))
    assert str(raised.value) == message
    data = PretrainingData(bert.path, "train", seed=SEED, family="bert",
                           data=dataclasses.replace(bert.config.data, noise_density=0.3))
    assert data.settings.short_seq_prob == bert.config.data.short_seq_prob


def test_t5_span_corruption(build):
    prepared = build("t5")
    seq = prepared.config.data.max_seq_length
    raw, target_length = t5_lengths(prepared.config.data)
    eos = prepared.special["eos"]
    sentinels = prepared.special["sentinels"]
    sentinel_set = set(sentinels)
    data = prepared.open()
    noise = total = spans = full = 0
    for epoch in (0, 1):
        for index in range(len(data)):
            row = data.raw(index).tokens
            assert not sentinel_set & set(row.tolist())
            ex = data.example(index, epoch)
            inputs = ex["input_ids"][ex["input_mask"] > 0]
            targets = ex["targets"][ex["target_weights"] > 0]
            assert len(targets) <= target_length
            assert np.array_equal(ex["decoder_input_ids"][1:], ex["targets"][:-1])
            assert ex["decoder_input_ids"][0] == prepared.config.model.decoder_start_token_id
            if len(row) == raw:
                full += 1
                assert ex["input_mask"].sum() == seq == len(ex["input_ids"]), "a full chunk fills the input"
            assert inputs[-1] == eos and targets[-1] == eos
            # targets: sentinel_i span_i ... EOS; inputs: kept tokens with sentinel_i for span_i, EOS
            bounds = [j for j, t in enumerate(targets) if t in sentinel_set] + [len(targets) - 1]
            fill = {int(targets[a]): targets[a + 1:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])}
            assert list(fill) == sentinels[:len(fill)] and all(fill.values())
            rebuilt = [t for x in inputs[:-1].tolist() for t in (fill.pop(x) if x in sentinel_set else [x])]
            assert not fill, "every sentinel of the targets appears in the inputs"
            assert rebuilt == row.tolist()
            noise += len(targets) - (len(bounds) - 1) - 1
            spans += len(bounds) - 1
            total += len(row)
    density, mean_span = noise / total, noise / spans
    print(f"\nt5: {full} full chunks of {raw} tokens, noise fraction {density:.4f}, mean span {mean_span:.3f}")
    assert full > 5000
    assert abs(density - 0.15) < 0.01
    assert abs(mean_span - 3.0) < 0.2


# ---------------------------------------------------------------------------------------- bart

def _sentences(row):
    bounds = np.r_[row.sentence_starts, len(row.tokens) - 1]
    return [row.tokens[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]


def _as_permutation(tokens, sentences):
    """An order of `sentences` whose concatenation is `tokens`, or None."""
    def search(position, left):
        if position == len(tokens):
            return [] if not left else None
        for i in sorted(left):
            s = sentences[i]
            if tokens[position:position + len(s)] == s:
                rest = search(position + len(s), left - {i})
                if rest is not None:
                    return [i, *rest]
        return None
    return search(0, frozenset(range(len(sentences))))


def _glob_removed(inputs, original, mask_id):
    """Tokens of `original` that `inputs` replaced by masks, when every run of non-mask input tokens
    is an unchanged piece of `original` in order and every gap between them sits at a mask; else None."""
    pieces, current = [], []
    for t in inputs:
        if t == mask_id:
            pieces.append(current)
            current = []
        else:
            current.append(t)
    pieces.append(current)
    if len(pieces) == 1:
        return 0 if pieces[0] == original else None
    first, *middle, last = pieces
    if original[:len(first)] != first or len(first) + len(last) > len(original):
        return None
    if last and original[len(original) - len(last):] != last:
        return None
    position, end = len(first), len(original) - len(last)
    for piece in middle:  # leftmost match of each middle piece (glob matching with '*')
        found = next((p for p in range(position, end - len(piece) + 1) if original[p:p + len(piece)] == piece), None)
        if found is None:
            return None
        position = found + len(piece)
    return len(original) - sum(map(len, pieces))


def test_bart_targets_are_the_stored_row(build):
    prepared = build("bart")
    data = prepared.open()
    for index in range(len(data)):
        row, ex = data.raw(index), data.example(index, 0)
        assert np.array_equal(ex["targets"][ex["target_weights"] > 0], row.tokens)
        assert np.array_equal(ex["decoder_input_ids"][1:], ex["targets"][:-1])
        assert ex["decoder_input_ids"][0] == prepared.config.model.decoder_start_token_id


def test_bart_sentence_permutation(build):
    prepared = build("bart")
    bos, eos = prepared.special["bos"], prepared.special["eos"]
    data = prepared.open(mask_ratio=0.0)
    reordered = multi = 0
    expected = variance = 0.0
    for index in range(len(data)):
        row, ex = data.raw(index), data.example(index, 0)
        inputs = ex["input_ids"][ex["input_mask"] > 0]
        assert len(inputs) == len(row.tokens) and inputs[0] == bos and inputs[-1] == eos
        sentences = _sentences(row)
        order = _as_permutation(inputs[1:-1].tolist(), sentences)
        assert order is not None, index
        if len(sentences) > 1:
            multi += 1
            reordered += order != list(range(len(sentences)))
            p = 1 - 1 / math.factorial(len(sentences))  # a uniform permutation moves something
            expected += p
            variance += p * (1 - p)
    print(f"\nbart: {reordered} of {multi} multi-sentence rows reordered ({reordered / multi:.3f}; "
          f"a uniform permutation: {expected / multi:.3f})")
    # repeated sentences can hide a move, so a little below a uniform permutation's rate is fine
    assert multi > 1000
    assert expected - 4 * math.sqrt(variance) - 0.01 * multi < reordered < expected + 4 * math.sqrt(variance)


def test_bart_text_infilling(build):
    prepared = build("bart")
    mask = prepared.special["mask"]
    data = prepared.open(permute_sentences=False)
    removed = inner = masks = 0
    for epoch in (0, 1):
        for index in range(len(data)):
            row, ex = data.raw(index), data.example(index, epoch)
            original = row.tokens[1:-1].tolist()
            assert mask not in original
            inputs = ex["input_ids"][ex["input_mask"] > 0]
            assert inputs[0] == row.tokens[0] and inputs[-1] == row.tokens[-1]
            gone = _glob_removed(inputs[1:-1].tolist(), original, mask)
            assert gone is not None, (index, "kept tokens changed or a removed span has no [MASK]")
            assert gone == round(0.3 * len(original)), index
            removed += gone
            inner += len(original)
            masks += int((inputs == mask).sum())
    ratio, per_token = removed / inner, masks / inner
    print(f"\nbart: removed {ratio:.4f} of the inner tokens, {per_token:.4f} [MASK] per inner token "
          f"({removed / masks:.3f} removed tokens per [MASK])")
    assert abs(ratio - 0.3) < 0.01
    # one [MASK] per Poisson(3) span: about 0.3 / 3 per token, plus the last (cut) span of each row
    assert 0.095 < per_token < 0.115


# -------------------------------------------------------------------------------------- albert

def test_albert_sentence_order(build):
    prepared = build("albert")
    cls, sep = prepared.special["cls"], prepared.special["sep"]
    data = prepared.open()
    swapped = count = 0
    for epoch in range(1):
        for index in range(len(data)):
            row, ex = data.raw(index), data.example(index, epoch)
            a, b = row.tokens[1:row.len_a - 1].tolist(), row.tokens[row.len_a:-1].tolist()
            tokens = unmasked(ex).tolist()
            label = int(ex["nsp_label"])
            first, second = (b, a) if label else (a, b)
            assert tokens == [cls, *first, sep, *second, sep], (index, epoch, label)
            n = len(tokens)
            assert ex["segment_ids"][:n].tolist() == [0] * (len(first) + 2) + [1] * (len(second) + 1)
            swapped += label
            count += 1
    rate = swapped / count
    print(f"\nalbert: {swapped} of {count} examples swapped ({rate:.4f})")
    assert count > 5000 and abs(rate - 0.5) < 0.02


# ------------------------------------------------------------------------------------ spanbert

def test_spanbert_spans(build):
    prepared = build("spanbert")
    specials = [prepared.special[k] for k in ("pad", "cls", "sep", "mask")]
    data = prepared.open()
    chosen = candidates = spans = 0
    for epoch in (0,):
        for index in range(len(data)):
            row, ex = data.raw(index), data.example(index, epoch)
            n = len(row.tokens)
            assert np.array_equal(unmasked(ex), row.tokens)
            live = ex["masked_weights"] > 0
            positions = ex["masked_positions"][live]
            pairs, offsets = ex["pair_positions"][live], ex["span_offsets"][live]
            masked = set(positions.tolist())
            assert len(masked) == len(positions) and np.all(np.diff(positions) > 0)
            assert not np.isin(row.tokens[positions], specials).any()
            for (left, right), position, offset in zip(pairs, positions, offsets):
                assert 0 <= left < position < right < n
                assert left not in masked and right not in masked
                assert set(range(left + 1, right)) <= masked
                assert offset == position - left - 1
            spans += len({tuple(p) for p in pairs.tolist()})
            chosen += len(positions)
            candidates += int((~np.isin(row.tokens, specials)).sum())
    rate = chosen / candidates
    print(f"\nspanbert: {rate:.4f} of the non-special tokens chosen, {chosen / spans:.3f} tokens per span")
    assert abs(rate - 0.15) < 0.01


# ------------------------------------------------------------------------------------- roberta

def _split_words(ex, row, continuation, specials):
    """How many chosen positions break a word: a continuation piece chosen without the piece before
    it, or a piece chosen without the continuation after it."""
    tokens = row.tokens
    chosen = np.zeros(len(tokens) + 1, bool)
    chosen[ex["masked_positions"][ex["masked_weights"] > 0]] = True
    cont = continuation[tokens] & ~np.isin(np.r_[-1, tokens[:-1]], specials)
    cont = np.r_[cont, False]
    broken = (chosen[1:] != chosen[:-1]) & cont[1:]  # a word boundary runs between i and i + 1
    return int(broken.sum())


def test_roberta_whole_word_masking(build):
    prepared = build("roberta")
    specials = [prepared.special[k] for k in ("pad", "cls", "sep", "mask")]
    pieces = prepared.tokenizer.convert_ids_to_tokens(range(prepared.tokenizer.vocab_size))
    continuation = np.array([p.startswith("##") for p in pieces])
    whole, plain = prepared.open(whole_word_masking=True), prepared.open()
    chosen = candidates = broken_plain = 0
    for index in range(len(whole)):
        row = whole.raw(index)
        ex = whole.example(index, 0)
        assert "segment_ids" not in ex
        assert np.array_equal(unmasked(ex), row.tokens)
        assert _split_words(ex, row, continuation, specials) == 0, index
        broken_plain += _split_words(plain.example(index, 0), row, continuation, specials)
        chosen += int(ex["masked_weights"].sum())
        candidates += int((~np.isin(row.tokens, specials)).sum())
    print(f"\nroberta: whole-word masking chose {chosen / candidates:.4f} of the tokens; token masking "
          f"split {broken_plain} words over the same rows")
    assert broken_plain > 100  # the check sees split words
    assert abs(chosen / candidates - 0.15) < 0.01


# -------------------------------------------------------------------------------------- errors

def test_data_of_another_layout_is_refused(build):
    prepared = build("gpt2")
    with pytest.raises(ValueError, match=r"prepared for model\.family=gpt2 \(causal rows\).*"
                                         r"model\.family=bert.*re-run `jaxlm prepare"):
        PretrainingData(prepared.path, "train", seed=0, family="bert")


def _edit_manifest(change):
    """A damage: `change` done to the manifest's contents."""
    def damage(directory):
        manifest = json.loads((directory / "manifest.json").read_text())
        change(manifest)
        (directory / "manifest.json").write_text(json.dumps(manifest))
    return damage


AGAIN = "re-run `jaxlm prepare CONFIG --overwrite`"
# damage done to a copy of prepared data ({d}; {shard}: its first train shard), and the error that opening it gives
DAMAGED = {
    "manifest not an object": (lambda d: (d / "manifest.json").write_text("[]"),
                               "{d}/manifest.json holds [], not a JSON object: " + AGAIN),
    "no splits": (_edit_manifest(lambda m: m.pop("splits")), "{d}/manifest.json has no splits: " + AGAIN),
    "examples not a number": (_edit_manifest(lambda m: m["splits"]["train"].update(examples="many")),
                              "{d}/manifest.json has splits.train.examples='many', not a whole number of 0 or more: "
                              + AGAIN),
    "record_dtype not numpy's": (_edit_manifest(lambda m: m.update(record_dtype="<f9")),
                                 "{d}/manifest.json has record_dtype='<f9', not one of <u2, <i4: " + AGAIN),
    "no record_dtype": (_edit_manifest(lambda m: m.pop("record_dtype")),
                        "{d}/manifest.json has no record_dtype: " + AGAIN),
    "word starts missing": (lambda d: (d / WORD_STARTS).unlink(),
                            f"{{d}}/{WORD_STARTS} cannot be read (No such file or directory); " + AGAIN),
    "word starts junk": (lambda d: (d / WORD_STARTS).write_bytes(b"junk" * 16),
                         f"{{d}}/{WORD_STARTS} cannot be read (not a NumPy array file); if the file is damaged, "
                         + AGAIN),
    "shard missing": (lambda d: sorted(d.glob("train-*"))[0].unlink(),
                      "{shard} cannot be read (open() failed: No such file or directory; opening {shard}); " + AGAIN),
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_damaged_prepared_data_is_named_with_what_to_do(build, tmp_path, damage):
    """Each was a traceback (AttributeError, KeyError, TypeError), a silent misreading (rows of uint16 read as int32),
    numpy's own words ("pickled (object) data ... allow_pickle") or an error without its fix; `<f9` passed preflight."""
    prepared = build("bert")
    copy = tmp_path / "copy"
    shutil.copytree(prepared.path, copy)
    do, expected = DAMAGED[damage]
    shard = sorted(copy.glob("train-*"))[0]
    do(copy)
    with pytest.raises(ValueError) as refused:
        dataclasses.replace(prepared, path=copy).open().check_shards()
    assert str(refused.value) == expected.format(d=copy, shard=shard)


def test_a_shard_its_user_may_not_read_is_named_with_that_fix(build, monkeypatch):
    """A shard the operating system would not open for its permissions said "if the file is damaged, re-run `jaxlm
    prepare`". Root reads every file, so the reader's and the system's refusals are simulated."""
    prepared = build("bert")
    shard = prepared.path / prepared.manifest["splits"]["train"]["shards"][0]

    class Refused:  # ArrayRecordReader of a file this user may not read
        def __init__(self, path, *args, **kwargs):
            self.path = path

        def ok(self):
            return False

        def seek(self, position):
            raise RuntimeError(f"open() failed: Permission denied; opening {self.path}")

    def refuse(path, *args):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(records, "ArrayRecordReader", Refused)
    monkeypatch.setattr(records, "open", refuse, raising=False)  # records' own `open`, not the builtin
    with pytest.raises(ValueError) as refused:
        prepared.open().check_shards()
    assert str(refused.value) == (f"{shard} cannot be read (open() failed: Permission denied; opening {shard}); "
                                  "give the user running jaxlm read access to it")


def test_byte_level_bpe_data_prepared_before_its_sentences_kept_their_spaces_is_refused(build, tmp_path):
    """Byte-level BPE rows once joined a document's sentences with no space ("end.The"); such data, whose manifest
    lacks the mark, trained on silently, and `jaxlm prepare` called it prepared."""
    from jaxlm.config import ConfigError
    from jaxlm.data.pipeline import open_data
    from jaxlm.data.prepare import SPACED, already_prepared, preparation_settings

    gpt2 = build("gpt2")
    assert gpt2.manifest[SPACED] is True and SPACED not in build("bert").manifest
    old = tmp_path / "gpt2-before"
    shutil.copytree(gpt2.path, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest[SPACED]
    (old / "manifest.json").write_text(json.dumps(manifest))
    config = dataclasses.replace(gpt2.config, data=dataclasses.replace(gpt2.config.data, prepared_dir=str(old)))
    with pytest.raises(ConfigError) as refused:
        open_data(config)
    assert str(refused.value) == (f"the data in {old} was prepared before byte-level BPE kept the space between a "
                                  "document's sentences (GPT-2 read \"end.The\"); re-run `jaxlm prepare CONFIG "
                                  "--overwrite`")
    with pytest.raises(ValueError, match="sentences_spaced: prepared None, config True"):
        already_prepared(old, preparation_settings(manifest["inputs"], gpt2.tokenizer, "gpt2", config.data))


def test_tokenizer_without_the_roles_is_refused(tmp_path, corpus):
    from jaxlm.data.tokenizers.load import load_tokenizer

    out = tmp_path / "bert-with-gpt2"
    with pytest.raises(ValueError, match=r"model\.family=bert needs a tokenizer with cls, sep, mask token"):
        prepare([corpus], out, load_tokenizer("gpt2"), family="bert", progress=False)
    assert not out.exists() and not partial_dir(out).exists()
    assert list(tmp_path.iterdir()) == []


def test_t5_with_fewer_sentinels_than_its_noise_spans_is_refused_before_preparing(tmp_path, corpus):
    """`jaxlm prepare configs/t5-tiny.yaml data.sentinels=3 model.vocab_size=1003` once prepared the whole corpus,
    and only the run on it was refused; the fix (more sentinels) changes the tokenizer, so all of it was lost."""
    from jaxlm.data.tokenizers.load import load_tokenizer

    data = dataclasses.replace(load_config("t5").data, sentinels=3)
    out = tmp_path / "t5"
    with pytest.raises(ValueError, match=r"makes 7 noise spans in a row of 141 tokens.* the tokenizer has 3; set "
                                         r"data\.sentinels=7 or more"):
        prepare([corpus], out, load_tokenizer(data.vocab, sentinels=3), family="t5", data=data, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_spanbert_max_span_beyond_the_row_is_refused(build):
    """`jaxlm data show configs/spanbert-tiny.yaml data.max_span=2147483647` built a span-length table of 2**31
    entries and was killed for its memory; no span of more words than a row's tokens can be placed."""
    prepared = build("spanbert")
    seq = prepared.config.data.max_seq_length
    with pytest.raises(ValueError, match=rf"data\.max_span=2147483647 exceeds data\.max_seq_length={seq}: .* give "
                                         rf"at most {seq}"):
        PretrainingData(prepared.path, "train", seed=SEED, family="spanbert", max_seq_length=seq,
                        tokenizer_fingerprint=prepared.tokenizer.fingerprint(),
                        vocab_size=prepared.tokenizer.vocab_size,
                        data=dataclasses.replace(prepared.config.data, max_span=2**31 - 1))


# ------------------------------------------------------------------------------------- sources

def test_jsonl_source(tmp_path, austen_chapters):
    path = tmp_path / "austen.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, chapter in enumerate(austen_chapters):
            f.write(json.dumps({"id": i, "body": " ".join(chapter)}) + "\n")
    config = load_config("roberta")
    tokenizer = model_tokenizer(config)
    settings = dict(family="roberta", data=config.data, text_field="body")
    manifest = prepare([path], tmp_path / "out", tokenizer, progress=False, **settings)
    assert manifest["sources"][0]["documents"] == len(austen_chapters)
    assert sum(s["documents"] for s in manifest["splits"].values()) == len(austen_chapters)
    assert manifest["text_field"] == "body"

    bad = tmp_path / "bad.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[2] = json.dumps({"id": 2, "text": "No body here."})
    bad.write_text("\n".join(lines[:5]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3 has no 'body' field.*data\.text_field"):
        prepare([bad], tmp_path / "bad-out", tokenizer, progress=False, **settings)
    assert not (tmp_path / "bad-out").exists()


@pytest.mark.parametrize(("line", "said"), [
    ('{"text": null}', "field 'text' holds null, not text; give it a JSON string"),
    ('{"text": 5}', "field 'text' holds 5, not text"),
    ('{"text": ["a", "b"]}', r'field .text. holds \["a", "b"\], not text'),
    ('{"text": "half \\ud800 a pair"}', "half a surrogate pair .* or set data.undecodable=skip"),
    ('{"text": ' + "[" * 100000 + "]" * 100000 + "}", r"is not valid JSON \(nested too deeply\)"),
])
def test_a_jsonl_line_whose_text_is_not_text_is_named(tmp_path, austen_chapters, line, said):
    """A null, number or list was prepared as the text 'None', '5' or "['a', 'b']"; half a surrogate pair and
    nesting deeper than Python's recursion were a TypeError's and a RecursionError's traceback."""
    good = [json.dumps({"text": " ".join(chapter)}) for chapter in austen_chapters[:6]]
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join([*good[:4], line, *good[4:]]) + "\n", encoding="utf-8")
    config = load_config("roberta")
    with pytest.raises(ValueError, match=rf"odd\.jsonl:5:? .*{said}"):
        prepare([path], tmp_path / "out", model_tokenizer(config), family="roberta", data=config.data, progress=False)
    if "surrogate" in said:
        manifest = prepare([path], tmp_path / "out", model_tokenizer(config), family="roberta", data=config.data,
                           undecodable="skip", progress=False)
        assert manifest["sources"][0]["documents"] == 6


def test_tfds_source_gives_the_rows_of_the_text_file(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    config = load_config("bert")
    tokenizer = model_tokenizer(config)
    settings = dict(family="bert", data=config.data, dupe_factor=1, shard_size=3000)
    tfds = prepare(["tfds:jaxlm_demo_corpus/austen"], tmp_path / "tfds-out", tokenizer, progress=False,
                   tfds_data_dir=str(tmp_path / "tfds"), **settings)
    text = prepare([fetch_austen()], tmp_path / "text-out", tokenizer, progress=False, **settings)
    assert tfds["splits"] == text["splits"]
    assert tfds["sources"][0]["documents"] == text["sources"][0]["documents"]
    assert (tmp_path / "tfds-out/documents.json").read_text() == (tmp_path / "text-out/documents.json").read_text()
    for split in ("train", "valid"):
        a = PretrainingData(tmp_path / "tfds-out", split, seed=0)
        b = PretrainingData(tmp_path / "text-out", split, seed=0)
        assert len(a) == len(b) > 0
        for i in range(len(a)):
            x, y = a.raw(i), b.raw(i)
            assert np.array_equal(x.tokens, y.tokens) and x.len_a == y.len_a and x.label == y.label, (split, i)


def test_roberta_pad_id_must_match_the_tokenizer():
    from jaxlm.config import ConfigError

    config = jaxlm_config.load(ROOT / "configs" / "roberta-tiny.yaml", ["model.pad_token_id=1", "model.position_offset=2"])
    with pytest.raises(ConfigError, match="pad_token_id=1 but the tokenizer's pad id is 0.*pad_token_id=0"):
        model_tokenizer(config)
    # the rule follows position_offset, not the family: BART's learned positions sit after an offset too
    config = jaxlm_config.load(ROOT / "configs" / "bart-tiny.yaml", ["model.pad_token_id=1"])
    with pytest.raises(ConfigError, match="pad_token_id=1 but the tokenizer's pad id is 0"):
        model_tokenizer(config)
    config = jaxlm_config.load(ROOT / "configs" / "roberta-tiny.yaml", ["model.pad_token_id=1", "model.position_offset=0"])
    assert model_tokenizer(config).vocab_size == 30522


def test_row_generators_are_default_rng_of_seed_epoch_index():
    edges = [0, 1, 7, 2**16 - 1, 2**31 + 7, 2**32 - 1]
    for seed, epoch, indices in ((3, 0, [0, 5, 2**31 + 7]), (2**32 - 1, 2**32 - 1, edges), (0, 0, list(range(300))),
                                 (2**40, 1, [4]), (7, 2, [2**33])):
        generators = row_generators(seed, epoch, indices)
        expected = [np.random.default_rng([seed, epoch, i]) for i in indices]
        assert [g.bit_generator.state for g in generators] == [g.bit_generator.state for g in expected]
        assert [g.random(4).tolist() for g in generators] == [g.random(4).tolist() for g in expected]


def test_seed_states_are_numpys_seed_sequence():
    keys = np.random.default_rng(0).integers(0, 2**32, (500, 3), dtype=np.uint64).astype(np.uint32)
    keys[:4] = [[0, 0, 0], [2**32 - 1] * 3, [1, 0, 0], [0, 0, 1]]
    assert (seed_states(keys) == [np.random.SeedSequence(k).generate_state(4, np.uint64) for k in keys]).all()
    assert (seed_states(keys[:, :2]) == [np.random.SeedSequence(k).generate_state(4, np.uint64) for k in keys[:, :2]]).all()
