"""jaxlm prepare for BERT pairs: shards, manifest, held-out split, errors, resuming, and per-process batches."""
import datetime
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from array_record.python.array_record_data_source import ArrayRecordDataSource
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

import jaxlm.data.prepare as prep
from jaxlm.config import ConfigError
from jaxlm.data import pieces, tokenized
from jaxlm.corpora.models import bert_vocab_path
from jaxlm.corpora.registry import fetch_demo_corpus
from jaxlm.data.pipeline import PretrainingData
from jaxlm.data.layouts import Row, decode_row, encode_row, record_dtype
from jaxlm.data.prepare import partial_dir, prepare
from jaxlm.data.records import ShardedRecords, write_shards
from jaxlm.data.sources import resolve_corpus
from jaxlm.corpora.text import text_documents as read_documents
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer

SEQ = 128


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(bert_vocab_path())


@pytest.fixture(scope="module")
def austen():
    return [p for p in fetch_demo_corpus() if p.name == "austen.txt"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tokenizer, austen):
    out = tmp_path_factory.mktemp("prepare") / "bert"
    manifest = prepare(austen, out, tokenizer, max_seq_length=SEQ, short_seq_prob=0.1,
                       dupe_factor=1, valid_fraction=0.1, seed=5, shard_size=3000, progress=False)
    return out, manifest


def _records(directory, names):
    source = ArrayRecordDataSource([str(directory / n) for n in names])
    dtype = json.loads((directory / "manifest.json").read_text())["record_dtype"]
    return [decode_row(source[i], dtype)[:3] for i in range(len(source))]


def test_manifest_counts_match_shards(prepared, austen):
    out, manifest = prepared
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["sources"][0]["bytes"] == austen[0].stat().st_size
    total_docs = 0
    for split, info in manifest["splits"].items():
        assert sorted(p.name for p in out.glob(f"{split}-*.array_record")) == info["shards"]
        assert info["shards"][0] == f"{split}-00000-of-{len(info['shards']):05d}.array_record"
        records = _records(out, info["shards"])
        assert len(records) == info["examples"] > 0
        assert sum(len(t) for t, _, _ in records) == info["tokens"]
        assert sum(r for _, _, r in records) == info["random_next"]
        total_docs += info["documents"]
    assert total_docs == manifest["sources"][0]["documents"] == len(read_documents(austen[0]))
    assert len(manifest["splits"]["train"]["shards"]) > 1


def test_examples_are_well_formed(prepared, tokenizer):
    out, manifest = prepared
    for info in manifest["splits"].values():
        for tokens, len_a, _ in _records(out, info["shards"]):
            assert len(tokens) <= SEQ and tokens[0] == tokenizer.cls_id
            seps = np.flatnonzero(tokens == tokenizer.sep_id)
            assert seps.tolist() == [len_a - 1, len(tokens) - 1]
            assert len_a >= 3 and len(tokens) - len_a >= 2


def _sentence_keys(sentence_ids):
    return {" " + " ".join(map(str, s)) + " " for s in sentence_ids if 12 <= len(s) <= 40}


def test_valid_documents_never_reach_train(prepared, tokenizer, austen):
    out, manifest = prepared
    split = json.loads((out / "documents.json").read_text())
    train = {tuple(d) for d in split["train"]}
    valid = {tuple(d) for d in split["valid"]}
    docs = read_documents(austen[0])
    assert not train & valid and len(train | valid) == len(docs)
    assert len(valid) == manifest["splits"]["valid"]["documents"] == round(0.1 * len(docs))

    def keys(which):
        return _sentence_keys(tokenizer.encode_batch([s for _, d in sorted(which) for s in docs[d]]))

    train_keys, valid_keys = keys(train), keys(valid)
    valid_only = valid_keys - train_keys
    train_text = "|".join(" " + " ".join(map(str, t)) + " "
                          for t, _, _ in _records(out, manifest["splits"]["train"]["shards"]))
    assert len(valid_only) > 500
    assert not [k for k in sorted(valid_only)[:500] if k in train_text]
    sample = sorted(train_keys)[:300]
    assert sum(k in train_text for k in sample) > 0.6 * len(sample)  # the check can see leaks


def test_missing_file_is_named(tmp_path, tokenizer, austen):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        prepare([austen[0], missing], tmp_path / "out", tokenizer, progress=False)
    assert not (tmp_path / "out").exists()


def test_empty_corpus_names_the_files(tmp_path, tokenizer):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    with pytest.raises(ValueError, match="empty corpus.*empty.txt"):
        prepare([empty], tmp_path / "out", tokenizer, progress=False)
    one = tmp_path / "one.txt"
    one.write_text("A single document.\nWith two sentences.\n")
    with pytest.raises(ValueError, match="at least 2"):
        prepare([one], tmp_path / "out", tokenizer, progress=False)


def test_a_corpus_source_listed_twice_is_refused(tmp_path):
    """`data.corpus=[c.txt, ../a/c.txt]` prepared each document twice, and a document's copies fell on both sides
    of the held-out split."""
    text = tmp_path / "c.txt"
    text.write_text("One.\n\nTwo.\n")
    again = tmp_path / ".." / tmp_path.name / "c.txt"
    with pytest.raises(ConfigError, match=rf"data\.corpus lists '{text}' and '{again}', one source twice: .* list it "
                                          "once"):
        resolve_corpus((str(text), str(again)))
    with pytest.raises(ConfigError, match="lists 'demo:austen' and 'demo:austen', one source twice"):
        resolve_corpus(("demo:austen", "demo:wikipedia", "demo:austen"), fetch=False)
    assert resolve_corpus((str(text),)) == [text]


def test_an_output_dir_that_is_a_file_names_the_setting_and_is_kept(tmp_path, tokenizer, austen):
    blocked = tmp_path / "prepared"
    blocked.write_text("keep me")
    with pytest.raises(FileExistsError, match=r"prepared is a file, not a directory; choose another output_dir "
                                              r"\(data\.prepared_dir\)"):
        prepare(austen, blocked, tokenizer, progress=False)
    assert blocked.read_text() == "keep me"


def test_existing_output_is_kept_unless_overwrite(tmp_path, tokenizer):
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here.\nAnother one.\n\nSecond document.\nIt ends.\n\n"
                      "Third document.\nWith more.\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    for overwrite in (False, True):  # not a prepared dataset: --overwrite does not delete it either
        with pytest.raises(FileExistsError, match="holds files and is not a prepared dataset"):
            prepare([corpus], out, tokenizer, progress=False, overwrite=overwrite)
    assert (out / "keep.txt").read_text() == "precious"
    (out / "keep.txt").unlink()
    prepare([corpus], out, tokenizer, progress=False)
    (out / "keep.txt").write_text("beside the shards")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        prepare([corpus], out, tokenizer, progress=False)
    manifest = prepare([corpus], out, tokenizer, valid_fraction=0.3, progress=False, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "manifest.json").exists()
    inside = out / "c.txt"
    inside.write_text(corpus.read_text())
    with pytest.raises(FileExistsError, match="holds the input .*c.txt, which preparing would delete"):
        prepare([inside], out, tokenizer, progress=False, overwrite=True)
    assert inside.exists()
    inside.unlink()
    assert manifest["splits"]["valid"]["documents"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "out"]


def test_interrupted_prepare_continues_where_it_stopped(tmp_path, tokenizer, austen, monkeypatch):
    """Ctrl-C while tokenizing leaves the output untouched and the finished pieces on disk; the
    same call continues from them and writes exactly what an uninterrupted run writes."""
    kwargs = dict(valid_fraction=0.1, seed=4, shard_size=5000, piece_mb=0.15, progress=False)
    wiki = [p for p in fetch_demo_corpus() if p.name == "wikipedia.txt"]
    inputs = austen + wiki
    reference = prepare(inputs, tmp_path / "reference", tokenizer, **kwargs)
    calls, real_tokenize = [], prep.tokenize_piece

    def interrupted_after_three(*args, **kw):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        return real_tokenize(*args, **kw)

    out = tmp_path / "data" / "out"
    monkeypatch.setattr(prep, "tokenize_piece", interrupted_after_three)
    with pytest.raises(KeyboardInterrupt):
        prepare(inputs, out, tokenizer, **kwargs)
    assert not out.exists() and len(list(partial_dir(out).glob("piece-*.documents"))) == 3

    calls.clear()
    monkeypatch.setattr(prep, "tokenize_piece", lambda *a, **kw: calls.append(1) or real_tokenize(*a, **kw))
    manifest = prepare(inputs, out, tokenizer, **kwargs)
    total_pieces = sum(len(pieces.plan_pieces(s, path, piece_mb=0.15)) for s, path in enumerate(inputs))
    assert total_pieces > 6 and len(calls) == total_pieces - 3
    assert not partial_dir(out).exists() and sorted(p.name for p in out.parent.iterdir()) == ["out"]
    assert manifest["splits"] == reference["splits"]
    for split, info in manifest["splits"].items():
        for name in info["shards"]:
            got, want = _records(out, [name]), _records(tmp_path / "reference", [name])
            assert [(t.tolist(), a, r) for t, a, r in got] == [(t.tolist(), a, r) for t, a, r in want]


def test_interrupted_prepare_with_other_settings_starts_over(tmp_path, tokenizer, monkeypatch):
    corpus = tmp_path / "in" / "c.txt"
    corpus.parent.mkdir()
    corpus.write_text("One sentence.\nTwo.\n\nAnother document.\nEnds here.\n")
    out = tmp_path / "data" / "out"

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "write_shards", boom)
    with pytest.raises(KeyboardInterrupt):
        prepare([corpus], out, tokenizer, progress=False)
    assert not out.exists() and partial_dir(out).is_dir()
    monkeypatch.undo()
    manifest = prepare([corpus], out, tokenizer, max_seq_length=64, progress=False)
    assert manifest["max_seq_length"] == 64 and not partial_dir(out).exists()


def test_manifest_mismatches_and_missing_dir(prepared, tokenizer, tmp_path):
    out, _ = prepared
    with pytest.raises(ValueError, match=f"tokenizer_fingerprint.*{tokenizer.fingerprint()}.*deadbeef.*jaxlm prepare"):
        PretrainingData(out, "train", seed=0, max_predictions=20, tokenizer_fingerprint="deadbeef")
    with pytest.raises(ValueError, match="vocab_size.*30522.*1000"):
        PretrainingData(out, "train", seed=0, max_predictions=20, vocab_size=1000)
    with pytest.raises(ValueError, match="max_seq_length.*128.*512"):
        PretrainingData(out, "train", seed=0, max_predictions=20, max_seq_length=512)
    with pytest.raises(ValueError, match="available"):
        PretrainingData(out, "test", seed=0, max_predictions=20)
    with pytest.raises(FileNotFoundError, match="jaxlm prepare CONFIG"):
        PretrainingData(tmp_path / "absent", "train", seed=0, max_predictions=20)


@pytest.fixture(scope="module")
def train(prepared):
    return PretrainingData(prepared[0], "train", seed=9, max_predictions=20)


def test_process_slices_concatenate_to_the_global_batch(train):
    for step in (0, 3):
        whole = train.local_batch(step, 16, 0, 1)
        parts = [train.local_batch(step, 16, p, 2) for p in range(2)]
        for key in whole:
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
    assert whole["input_ids"].shape == (16, SEQ) and whole["nsp_label"].shape == (16,)
    with pytest.raises(ValueError, match="divisible"):
        train.local_batch(0, 16, 0, 3)


def test_batch_indices_permute_each_epoch(train):
    gb = 64
    per_epoch = len(train) // gb
    seen = [train.batch_indices(s, gb) for s in range(per_epoch)]
    assert {e for e, _ in seen} == {0}
    flat = np.concatenate([i for _, i in seen])
    assert len(np.unique(flat)) == len(flat) == per_epoch * gb and flat.max() < len(train)
    epoch, first = train.batch_indices(per_epoch, gb)
    assert epoch == 1 and not np.array_equal(first, seen[0][1])
    np.testing.assert_array_equal(train.batch_indices(5, gb)[1], seen[5][1])
    with pytest.raises(ValueError, match="larger than"):
        train.batch_indices(0, len(train) + 1)


def test_iterate_resumes_from_any_step(train):
    stream = train.iterate(4, 8, 1, 2, prefetch=2)
    for step in (4, 5, 6):
        got, want = next(stream), train.local_batch(step, 8, 1, 2)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    stream.close()


def test_show_is_json_friendly(train, tokenizer):
    rows = train.show(2, tokenizer)
    line = json.dumps(rows[0])
    assert json.loads(line)["input_tokens"][0] == "[CLS]"
    assert rows[0]["input_ids"] == train.local_batch(0, 2)["input_ids"][0].tolist()


def test_ctrl_c_stops_prepare_between_batches(tmp_path, austen, monkeypatch):
    """A real SIGINT while tokenizing stops prepare at the next batch even when Python handles it
    inside a garbage-collection hook (where JAX ignores exceptions); the finished pieces stay."""
    import gc
    import os
    import signal

    monkeypatch.setattr(tokenized, "TOKENIZE_BATCH", 256)

    def interrupt_in_gc_hook(*_):
        gc.callbacks.remove(interrupt_in_gc_hook)
        os.kill(os.getpid(), signal.SIGINT)

    class Interrupting(WordPieceTokenizer):
        calls = 0

        def encode_batch(self, batch):
            self.calls += 1
            if self.calls == 30:
                gc.callbacks.append(interrupt_in_gc_hook)
                gc.collect()
            return super().encode_batch(batch)

    out = tmp_path / "out"
    # a job started in the background inherits SIGINT ignored, and prepare rightly leaves it so
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            prepare(austen, out, Interrupting(bert_vocab_path()), piece_mb=0.04, progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    kept = len(list(partial_dir(out).glob("piece-*.documents")))
    assert not out.exists() and 0 < kept < len(pieces.plan_pieces(0, austen[0], piece_mb=0.04))
    assert prepare(austen, out, WordPieceTokenizer(bert_vocab_path()), piece_mb=0.04, progress=False)["splits"]["train"]["examples"] > 0


def test_sharded_records_read_what_grain_reads(prepared):
    """ShardedRecords (the loader's reader) against grain's ArrayRecordDataSource, across shards, with repeats,
    from threads at once; shards are written uncompressed."""
    out, manifest = prepared
    names, count = manifest["splits"]["train"]["shards"], manifest["splits"]["train"]["examples"]
    records = ShardedRecords([out / n for n in names], manifest["shard_size"], count)
    grains = ArrayRecordDataSource([str(out / n) for n in names])
    indices = np.random.default_rng(0).integers(0, count, 500)
    expected = [grains[int(i)] for i in indices]
    assert len(records) == count and records.read(indices) == expected and records[count - 1] == grains[count - 1]
    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(records.read, np.array_split(indices, 20)), []) == expected
    assert "uncompressed" in ArrayRecordReader(str(out / names[0])).writer_options_string()
    with pytest.raises(IndexError, match=rf"\[0, {count}\)"):
        records.read([count])
    with pytest.raises(ValueError, match="listed.*re-run `jaxlm prepare"):
        ShardedRecords([out / n for n in names[:-1]], manifest["shard_size"], count)
    with pytest.raises(ValueError, match=f"{names[0]} holds 3000 records where its manifest needs 2999"):
        ShardedRecords([out / n for n in names], 2999, count - len(names) + 1).check()


def test_a_shard_cut_short_or_missing_fails_its_check(prepared, tmp_path):
    out, manifest = prepared
    names, count = manifest["splits"]["train"]["shards"], manifest["splits"]["train"]["examples"]
    for name in names:
        shutil.copy(out / name, tmp_path / name)
    records = ShardedRecords([tmp_path / n for n in names], manifest["shard_size"], count)
    records.check()
    cut = tmp_path / names[-1]
    cut.write_bytes(cut.read_bytes()[:cut.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"^{cut} cannot be read \(.+\); if the "
                                         r"file is damaged, re-run `jaxlm prepare CONFIG --overwrite`$"):
        ShardedRecords([tmp_path / n for n in names], manifest["shard_size"], count).check()
    cut.unlink()
    with pytest.raises(ValueError, match=rf"^{cut} cannot be read \(open\(\) failed: No such file or directory"):
        ShardedRecords([tmp_path / n for n in names], manifest["shard_size"], count).check()


def test_rows_are_stored_in_uint16_where_they_fit_and_int32_data_still_loads(prepared, train, tmp_path):
    """BERT's 30,522 ids fit uint16; data of the earlier format (jaxlm.rows.v1: int32 rows, zstd shards, no
    record_dtype) gives the same batches."""
    out, manifest = prepared
    assert manifest["format"] == "jaxlm.rows.v2" and manifest["record_dtype"] == "<u2"
    assert [record_dtype(v, s) for v, s in ((30522, 512), (65536, 65535), (65537, 128), (32000, 65536))] == [
        "<u2", "<u2", "<i4", "<i4"]
    old = tmp_path / "v1"
    shutil.copytree(out, old)
    v1 = {k: v for k, v in manifest.items() if k != "record_dtype"} | {"format": "jaxlm.rows.v1"}
    (old / "manifest.json").write_text(json.dumps(v1))
    for split in manifest["splits"].values():
        for name in split["shards"]:
            rows = [decode_row(r, "<u2") for r in ArrayRecordReader(str(out / name)).read_all()]
            writer = ArrayRecordWriter(str(old / name), "group_size:1")
            for row in rows:
                writer.write(encode_row(row))
            writer.close()
    assert "zstd" in ArrayRecordReader(str(old / name)).writer_options_string()
    again = PretrainingData(old, "train", seed=9, max_predictions=20)
    for step in (0, 5):
        got, want = again.local_batch(step, 16), train.local_batch(step, 16)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def test_sharded_records_open_more_shards_than_the_soft_limit_on_files(tmp_path):
    """Every shard read stays open: a split of more shards than the soft limit on open files (often 1,024) is
    read whole, the limit raised as far as the hard one allows."""
    records = [encode_row(Row(np.array([i, i + 1], np.int32)), "<u2") for i in range(300)]
    names = write_shards(records, tmp_path, "train", shard_size=1, progress=False)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        shards = ShardedRecords([tmp_path / n for n in names], 1, len(records))
        assert shards.read(range(300)) == records
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > 300
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


UNDER_A_HARD_LIMIT = """
import pathlib, resource, sys
import numpy as np
from jaxlm.data.records import ShardedRecords
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
directory, names, count = pathlib.Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
shards = ShardedRecords([directory / n for n in names], 1, count)
order = np.random.default_rng(0).integers(0, count, 2 * count)
in_order, at_random = b"".join(shards.read(range(count))).hex(), b"".join(shards.read(order)).hex()
print(len(shards._readers), shards._max_open, in_order, at_random)
"""


def test_sharded_records_read_more_shards_than_the_hard_limit_on_files(tmp_path):
    """A split of more shards than the hard limit on open files lets a process hold: the least recently read
    are closed, and every record still reads right, in order and at random."""
    records = [encode_row(Row(np.array([i, i + 1], np.int32)), "<u2") for i in range(300)]
    names = write_shards(records, tmp_path, "train", shard_size=1, progress=False)
    child = subprocess.run([sys.executable, "-c", UNDER_A_HARD_LIMIT, str(tmp_path), ",".join(names), "300"],
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-2000:]
    held, max_open, in_order, at_random = child.stdout.split()
    order = np.random.default_rng(0).integers(0, 300, 600)
    assert 32 < int(held) == int(max_open) < 128
    assert in_order == b"".join(records).hex() and at_random == b"".join(records[k] for k in order).hex()


def test_a_source_that_changed_since_the_preparation_is_named(tmp_path):
    """The same `jaxlm prepare` again on an edited corpus: it once said "already prepared" and kept the rows of the
    old text. The manifest records each file's size and mtime; one that differs is named before any work. A manifest
    from before mtimes were recorded is still taken, by size alone; an edit that kept the size was once not seen."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence.\n")
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    settings = {"family": "bert"}
    (prepared / prep.MANIFEST).write_text(json.dumps(settings | {"sources": [
        {"path": str(corpus.resolve()), "bytes": corpus.stat().st_size, "documents": 1}]}))
    assert prep.already_prepared(prepared, settings)
    corpus.write_text("One sentence.\nAnd another, appended.\n")
    with pytest.raises(ValueError, match=r"corpus.txt has changed since .*prepared was prepared from it \(14 bytes, "
                                         r"now 37\); pass --overwrite"):
        prep.already_prepared(prepared, settings)
    (prepared / prep.MANIFEST).write_text(json.dumps(settings | {"sources": [
        {"path": str(corpus.resolve()), "bytes": corpus.stat().st_size, "documents": 1}]}))
    corpus.write_text("One sentence.\nAnd another, Appended.\n")
    assert prep.already_prepared(prepared, settings)  # the manifest records no mtime: the size is the same
    recorded = corpus.stat()
    (prepared / prep.MANIFEST).write_text(json.dumps(settings | {"sources": [
        pieces.source_info(corpus) | {"documents": 1}]}))
    assert prep.already_prepared(prepared, settings)
    os.utime(corpus, ns=(recorded.st_atime_ns, recorded.st_mtime_ns + 2_000_000_000))
    then, now = (datetime.datetime.fromtimestamp(t / 1e9).isoformat(sep=" ", timespec="milliseconds")
                 for t in (recorded.st_mtime_ns, corpus.stat().st_mtime_ns))
    with pytest.raises(ValueError) as refused:
        prep.already_prepared(prepared, settings)
    assert str(refused.value) == (f"{corpus.resolve()} has changed since {prepared} was prepared from it (modified "
                                  f"{then}, now {now}); pass --overwrite to rebuild it")


def test_a_manifest_that_is_not_an_object_asks_for_overwrite(tmp_path):
    """An AttributeError's traceback."""
    (tmp_path / prep.MANIFEST).write_text("[]")
    with pytest.raises(ValueError, match="is not a JSON object: the prepared data is damaged; re-run .jaxlm prepare"):
        prep.already_prepared(tmp_path, {"family": "bert"})


def test_a_file_that_shrank_below_a_piece_is_named_with_its_real_size(tmp_path):
    """A file cut short after it was planned: the message once gave the piece's start (where the seek past the end
    left the file position) as the byte the file ended at."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A sentence of a document.\n\n" * 4000)
    planned = pieces.plan_pieces(0, corpus, piece_mb=0.05)
    assert len(planned) > 1
    corpus.write_text("Short now.\n")
    with pytest.raises(FileNotFoundError) as refused:
        list(pieces.text_piece_documents(corpus, planned[-1]))
    assert str(refused.value).startswith(f"{corpus} ended at byte 11 while it was being read (it was "
                                         f"{planned[-1].stop} bytes or more when the preparation started)")



def test_a_split_that_comes_out_empty_is_refused_and_no_manifest_written(tmp_path):
    """A corpus of a few lines whose train documents make no rows (the second one only control characters, which the
    tokenizer drops): `jaxlm prepare` once exited 0 with a manifest whose train split had 0 examples."""
    from conftest import run_cli, write_config

    corpus = tmp_path / "few.txt"
    corpus.write_text("A real sentence here.\n\n\x01\x02\n")
    out = tmp_path / "out"
    config = write_config(tmp_path, {"data": {"corpus": [str(corpus)], "valid_fraction": 0.3}})
    proc = run_cli("prepare", config, f"data.prepared_dir={out}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "jaxlm prepare: error: the train split came out empty: its 1 document(s) of the corpus's 2 made 0 rows; "
        "give data.corpus more text")
    assert not (out / prep.MANIFEST).exists()
    assert prep._empty_split("valid", 1, 2, 0.05).endswith("or a larger data.valid_fraction (now 0.05)")


def test_a_second_preparation_of_one_folder_is_refused_while_the_first_runs(tmp_path, tokenizer):
    """Two preparations of one folder at once wrote each other's pieces and rows; the second is now refused before
    any work, and the lock goes with its holder, even one killed (SIGKILL)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here.\nAnother one.\n\nSecond document.\nIt ends.\n\nThird document.\nMore.\n")
    out, lock = tmp_path / "out", prep.lock_path(tmp_path / "out")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, sys, time; from jaxlm import file_lock; "
         "file_lock.take(pathlib.Path(sys.argv[1])); print('held', flush=True); time.sleep(600)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ValueError) as refused:
            prepare([corpus], out, tokenizer, progress=False)
        assert str(refused.value) == (f"{out} is being prepared by process {holder.pid} on {socket.gethostname()} "
                                      f"(its lock {lock}); wait for it to end, or give another data.prepared_dir")
        assert not out.exists() and not partial_dir(out).exists()
    finally:
        holder.kill()
        holder.wait()
    prepare([corpus], out, tokenizer, valid_fraction=0.3, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "out"]
