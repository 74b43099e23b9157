"""jaxlm prepare at corpus scale: on Apache Beam's direct runner with 1 and 2 worker processes the same
files as in-process; a Ctrl-C to a Beam preparation and the same command again give the same output;
memory bounded on a corpus far beyond what the in-memory path held; bad input named (a line that is
not UTF-8, a source that disappears, a worker that dies)."""
import hashlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

import jaxlm.data.prepare as prep
from conftest import ROOT, run_cli, write_config
from jaxlm.corpora.registry import fetch_demo_corpus
from jaxlm.corpora.text import write_repeated
from jaxlm.data.beam import direct_workers
from jaxlm.data.pieces import plan_pieces
from jaxlm.data.prepare import partial_dir, prepare
from jaxlm.data.tokenized import TokenizationFailed
from jaxlm.data.tokenizers.load import load_tokenizer

SETTINGS = dict(dupe_factor=1, valid_fraction=0.1, seed=3, shard_size=4000, piece_mb=0.5, progress=False)


@pytest.fixture(scope="module")
def demo_files():
    return [p for p in fetch_demo_corpus() if p.name in ("austen.txt", "wikipedia.txt")]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("bert-base-uncased")


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, demo_files, tokenizer):
    out = tmp_path_factory.mktemp("in-process") / "bert"
    prepare(demo_files, out, tokenizer, **SETTINGS)
    return out


def files(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("workers", [1, 2])
def test_beam_writes_what_the_in_process_preparation_writes(tmp_path, demo_files, tokenizer, in_process, workers):
    manifest = prepare(demo_files, tmp_path / "beam", tokenizer, runner="direct", beam_args=direct_workers(workers),
                       **SETTINGS)
    assert len(manifest["splits"]["train"]["shards"]) > 1 and manifest["splits"]["train"]["random_next"] > 0
    assert files(tmp_path / "beam") == files(in_process)


def _pieces_done(out):
    return len(list(partial_dir(out).glob("piece-*.documents")))


def _beam_preparation(config, out):
    """`jaxlm prepare` on Beam with 2 workers, in a session of its own, once it has tokenized 3 more pieces than
    `out` held; Ctrl-C's handler as in a terminal, even where the suite runs as a background job (SIGINT ignored)."""
    start = _pieces_done(out)
    command = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "from jaxlm.cli import main; sys.exit(main(sys.argv[1:]))", "prepare", str(config),
               f"data.prepared_dir={out}", "--runner", "direct", "--workers", "2"]
    proc = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while _pieces_done(out) < start + 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    return proc


def test_ctrl_c_or_sigterm_to_a_beam_preparation_and_the_same_command_again_finish_with_the_same_output(
        tmp_path, demo_files):
    """Ctrl-C to the command and its workers, then SIGTERM to the command alone (as a job scheduler stops it): each
    stops it with its tokenized pieces kept. SIGTERM once ended the command at once, silent, its workers running."""
    config = write_config(tmp_path, {"data": {"corpus": [str(p) for p in demo_files], "dupe_factor": 1,
                                              "piece_mb": 0.05, "valid_fraction": 0.1, "seed": 3}})
    reference, out = tmp_path / "reference", tmp_path / "data" / "beam"
    run_cli("prepare", config, f"data.prepared_dir={reference}")
    proc = _beam_preparation(config, out)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the command and its workers
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130 and "interrupted (the same command continues where this one stopped)" in output
    assert "Traceback" not in output and not out.exists()
    kept = _pieces_done(out)
    assert kept >= 3

    proc = _beam_preparation(config, out)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert workers, "the preparation started no worker processes"
    os.kill(proc.pid, signal.SIGTERM)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "stopped by SIGTERM (the same command continues where this one stopped)" in output
    assert "Traceback" not in output and not out.exists()
    assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert f"continuing an interrupted preparation: {kept} tokenized piece(s)" in output
    kept = _pieces_done(out)

    again = run_cli("prepare", config, f"data.prepared_dir={out}", "--runner", "direct", "--workers", "2")
    assert f"continuing an interrupted preparation: {kept} tokenized piece(s)" in again.stdout
    assert files(out) == files(reference) and not partial_dir(out).exists()


def test_memory_stays_bounded_on_a_corpus_the_in_memory_path_could_not_hold(tmp_path, demo_files):
    """24 MB of text (the demo corpora repeated): the preparation before streaming grew by 371 MB on it
    (every token a Python int, every row in a list), streaming by about 46 MB (a piece, offsets)."""
    corpus = tmp_path / "large.txt"
    write_repeated(demo_files, corpus, 24 << 20)
    config = write_config(tmp_path, {"data": {"corpus": [str(corpus)], "dupe_factor": 1, "piece_mb": 4}})
    script = ("import resource, sys; from jaxlm.cli import main; peak = lambda: resource.getrusage("
              "resource.RUSAGE_SELF).ru_maxrss; base = peak(); code = main(sys.argv[1:]); "
              "print('grew', (peak() - base) // 1024); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", script, "prepare", str(config), f"data.prepared_dir={tmp_path / 'out'}"],
                          cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grown_mb = int(proc.stdout.split("grew")[-1])
    splits = json.loads((tmp_path / "out" / "manifest.json").read_text())["splits"]
    assert sum(s["examples"] for s in splits.values()) > 90_000
    assert grown_mb < 150, f"preparing 24 MB of text took {grown_mb} MB more memory"


@pytest.fixture
def bad_line_corpus(tmp_path):
    good = "One sentence here.\nAnother one.\n\nA second document.\nIt ends.\n\nA third.\nLast line.\n"
    path = tmp_path / "corpus.txt"
    path.write_bytes(good.encode().replace(b"It ends.", b"It \xff\xfe ends."))
    clean = tmp_path / "clean.txt"
    clean.write_text(good.replace("It ends.\n", ""))
    return path, clean


@pytest.mark.parametrize("runner", [None, "direct"])
def test_a_line_that_is_not_utf8_is_named_and_fatal_or_skipped(tmp_path, bad_line_corpus, tokenizer, runner, capsys):
    """Skipped, the line is named on stderr once, by either runner: Beam's workers once said it in beam.log only,
    deleted with the work directory."""
    path, clean = bad_line_corpus
    settings = dict(SETTINGS, valid_fraction=0.3, runner=runner)
    with pytest.raises(ValueError, match=rf"{path}:5: not UTF-8 .*set data.undecodable=skip"):
        prepare([path], tmp_path / "out", tokenizer, **settings)
    assert not (tmp_path / "out").exists() and not list(partial_dir(tmp_path / "out").glob("piece-*.documents"))
    capsys.readouterr()
    prepare([path], tmp_path / "skipped", tokenizer, undecodable="skip", **settings)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: {path}:5: not UTF-8 (byte 3 of the line: invalid start byte); line left out "
                        "(data.undecodable=skip)"]
    prepare([clean], tmp_path / "clean", tokenizer, undecodable="skip", **settings)
    shards = lambda d: {k: v for k, v in files(d).items() if k.endswith(".array_record")}
    assert shards(tmp_path / "skipped") == shards(tmp_path / "clean")


def test_the_command_names_the_undecodable_line(tmp_path, bad_line_corpus):
    path, _ = bad_line_corpus
    config = write_config(tmp_path, {"data": {"corpus": [str(path)], "valid_fraction": 0.3}})
    proc = run_cli("prepare", config, f"data.prepared_dir={tmp_path / 'out'}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"jaxlm prepare: error: {path}:5: not UTF-8")


def test_a_source_that_disappears_mid_preparation_is_named(tmp_path, demo_files, tokenizer, monkeypatch):
    inputs = [tmp_path / p.name for p in demo_files]
    for source, copy in zip(demo_files, inputs):
        copy.write_bytes(source.read_bytes())
    real = prep.tokenize_piece

    def remove_the_second_source(*args, **kwargs):
        inputs[1].unlink(missing_ok=True)
        return real(*args, **kwargs)

    monkeypatch.setattr(prep, "tokenize_piece", remove_the_second_source)
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=rf"{inputs[1]} disappeared while it was being prepared; restore it"):
        prepare(inputs, out, tokenizer, **SETTINGS)
    assert not out.exists() and _pieces_done(out) > 0


def _prepare_with_a_dying_worker(connection, demo_files, out, fatal):
    """`prepare` on Beam with a worker that dies at `fatal`, in a process of its own, sending back its
    TokenizationFailed's message. The direct runner's pipeline then waits forever with its gRPC threads up: in
    pytest's own process they outlived the test, and a later test's native code aborted that process."""
    from dying_tokenizer import DyingTokenizer  # noqa: E402 - tests/ is on the workers' path
    try:
        prepare(demo_files, out, DyingTokenizer("bert-base-uncased", fatal), runner="direct",
                beam_args=direct_workers(2), **SETTINGS)
        connection.send("finished")
    except TokenizationFailed as err:
        connection.send(str(err))
    os._exit(0)  # the runner's threads never end


def test_a_worker_that_dies_fails_the_preparation_and_no_piece_is_taken_for_complete(tmp_path, demo_files,
                                                                                     monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    documents = demo_files[1].read_text().split("\n\n")
    fatal = documents[len(documents) // 2].splitlines()[0]
    out = tmp_path / "out"
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=_prepare_with_a_dying_worker, args=(theirs, demo_files, out, fatal))
    child.start()
    deadline = time.time() + 600
    while not ours.poll(1):
        assert child.is_alive() and time.time() < deadline, "the preparation's process ended or hung, unheard"
    assert re.search("the Beam pipeline failed: worker process .* died", ours.recv())
    child.join(60)
    assert not out.exists()
    planned = sum(len(plan_pieces(s, p, piece_mb=SETTINGS["piece_mb"])) for s, p in enumerate(demo_files))
    assert _pieces_done(out) < planned


@pytest.mark.parametrize(("beam_args", "expected"), [
    ("--no_such_option", "no Beam runner knows --no_such_option; fix --beam-args (the runner's own flags, e.g. "
                         "--beam-args \"--project=P --region=R\" for dataflow)"),
    ("--direct_running_mode=threads", "argument --direct_running_mode: invalid choice: 'threads' (choose from "
                                      "'in_memory', 'multi_threading', 'multi_processing'); fix --beam-args"),
    ("--direct_num_workers 1 stray", "stray follows no option that takes a value; fix --beam-args (give a value as "
                                     "--name=value)")])
def test_beam_args_that_beam_refuses_are_named_before_any_work(tmp_path, bad_line_corpus, beam_args, expected):
    """Beam's option parser exited inside the pipeline's thread: `jaxlm prepare` once ended with status 2 and no
    word on the terminal (Beam's usage went to beam.log, deleted with the work directory); an unknown option was
    dropped with a warning into that log, as was a word no option takes."""
    _, clean = bad_line_corpus
    out = tmp_path / "out"
    config = write_config(tmp_path, {"data": {"corpus": [str(clean)], "valid_fraction": 0.3}})
    proc = run_cli("prepare", config, f"data.prepared_dir={out}", "--runner", "direct", f"--beam-args={beam_args}",
                   check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"jaxlm prepare: error: Beam's options: {expected}"
    assert not out.exists() and not partial_dir(out).exists()
