"""`jaxlm eval` over the checkpoints of real tiny runs: selection, the run's own final evaluation
reproduced, other device counts, watching a run while it trains, resuming an interrupted sweep."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, kill_when, run_cli, write_config, xla_flags
from jaxlm.eval import results
from jaxlm.train.metrics import read_jsonl

STEPS, EVERY = 20, 5
RUN = {"train": {"steps": STEPS, "checkpoint_every": EVERY, "keep_checkpoints": 10, "eval_batches": 2}}


def make_config(directory, prepared_dir, run_dir, name="config.yaml"):
    extra = {"data": {"prepared_dir": str(prepared_dir)}, "train": {**RUN["train"], "run_dir": str(run_dir)}}
    return write_config(directory, extra, name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, prepared_dir):
    """(run directory, its config) of a tiny BERT trained alone for 20 steps, a checkpoint every 5."""
    directory = tmp_path_factory.mktemp("eval-run")
    config = make_config(directory, prepared_dir, directory / "run")
    run_cli("train", config)
    return directory / "run", config


def records_of(out):
    return results.read_records(out)


def heldout(out, step):
    return {r["metric"]: r["value"] for r in records_of(out) if r["step"] == step and r["task"] == "heldout"}


def final_eval(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "eval"][-1]


def test_all_checkpoints_one_row_each_and_the_latest_is_the_runs_own_final_evaluation(trained, tmp_path):
    run_dir, _ = trained
    out = tmp_path / "eval"
    proc = run_cli("eval", run_dir, "--select", "all", "--out", out)
    steps = sorted({r["step"] for r in records_of(out)})
    assert steps == [5, 10, 15, 20]
    final = final_eval(run_dir)
    assert final["step"] == STEPS
    ours = heldout(out, STEPS)
    for key in ("loss", "mlm_acc", "mlm_loss", "nsp_acc", "nsp_loss"):
        assert ours[key] == final[key], key
    assert {r["examples"] for r in records_of(out)} == {final["examples"]}
    baselines = {r["metric"]: r["baseline"] for r in records_of(out) if "baseline" in r}
    assert baselines["nsp_acc"] == 0.5 and 0 < baselines["mlm_acc"] < 1
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 and rows[0].startswith("run,step,heldout/loss")
    assert (out / "curves.png").stat().st_size > 0
    assert "heldout" in proc.stdout and "items/s" in proc.stdout
    assert not any(p.name.startswith("eval") for p in run_dir.iterdir()), "nothing is written into the run"


@pytest.mark.parametrize("select, expected", [("latest", [20]), ("every:10", [10, 20]), ("steps:5,15", [5, 15])])
def test_selection_picks_what_it_says(trained, tmp_path, select, expected):
    from jaxlm.eval.sources import open_source, parse_selection
    source = open_source(trained[0], [])
    assert source.committed_steps() == [5, 10, 15, 20]
    assert parse_selection(select).pick(source.committed_steps()) == expected


def test_a_run_trained_on_8_devices_evaluates_the_same_on_1_and_4(trained, tmp_path):
    run_dir, _ = trained
    got = {}
    for devices in (1, 4):
        out = tmp_path / f"eval{devices}"
        run_cli("eval", run_dir, "--select", "steps:10,20", "--out", out, devices=devices)
        got[devices] = {step: heldout(out, step) for step in (10, 20)}
    final = final_eval(run_dir)
    for devices, by_step in got.items():
        for key in ("loss", "mlm_acc", "nsp_acc"):
            assert by_step[20][key] == pytest.approx(final[key], rel=1e-5, abs=1e-6), (devices, key)
        assert by_step[10] == pytest.approx(got[1][10], rel=1e-5, abs=1e-6)


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags())


def test_watch_evaluates_each_checkpoint_once_while_the_run_trains_and_leaves_it_unaffected(
        trained, tmp_path, prepared_dir):
    alone, _ = trained
    run_dir = tmp_path / "watched"
    config = make_config(tmp_path, prepared_dir, run_dir)
    out = tmp_path / "eval"
    trainer = subprocess.Popen([sys.executable, "-m", "jaxlm.cli", "train", str(config)], cwd=ROOT, env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watcher = subprocess.run([sys.executable, "-m", "jaxlm.cli", "eval", str(run_dir), "--watch", "--poll", "0.2",
                              "--idle-timeout", "600", "--out", str(out)], cwd=ROOT, env=_env(),
                             capture_output=True, text=True, timeout=900)
    _, train_err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, train_err[-2000:]
    assert watcher.returncode == 0, watcher.stderr[-3000:]
    evaluated = [(r["step"], r["metric"]) for r in records_of(out) if r["metric"] == "loss"]
    assert sorted(evaluated) == [(5, "loss"), (10, "loss"), (15, "loss"), (20, "loss")]  # each once
    losses = lambda d: {r["step"]: r["loss"] for r in read_jsonl(d / "metrics.jsonl") if r["split"] == "train"}
    assert losses(run_dir) == losses(alone)
    assert heldout(out, STEPS)["loss"] == final_eval(run_dir)["loss"]


def test_an_interrupted_sweep_resumes_with_only_the_missing_checkpoints(trained, tmp_path):
    run_dir, _ = trained
    out = tmp_path / "eval"
    sweep = subprocess.Popen([sys.executable, "-m", "jaxlm.cli", "eval", str(run_dir), "--out", str(out)],
                             cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(sweep, lambda: bool(records_of(out)))
    assert sweep.returncode == -signal.SIGKILL, "the sweep ended before it could be interrupted"
    before = sorted({r["step"] for r in records_of(out)})
    assert before and before != [5, 10, 15, 20]
    again = run_cli("eval", run_dir, "--out", out)
    redone = sorted(int(line.split(" step ")[1].split()[0]) for line in (again.stdout + again.stderr).splitlines()
                    if line.startswith("jaxlm eval: ") and " step " in line)
    assert redone == [s for s in (5, 10, 15, 20) if s not in before]
    keys = [(r["step"], r["metric"]) for r in records_of(out)]
    assert len(keys) == len(set(keys)) and sorted({s for s, _ in keys}) == [5, 10, 15, 20]


def test_ctrl_c_to_a_watch_leaves_the_table_and_plot_of_what_it_evaluated(trained, tmp_path):
    """A --watch is stopped by Ctrl-C or waits out its --idle-timeout; Ctrl-C left results.jsonl alone, without
    results.csv and curves.png."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained[0], run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "20")  # the run has not written its final step: the watch goes on
    out = tmp_path / "eval"
    command = [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "from jaxlm.cli import main; sys.exit(main(sys.argv[1:]))", "eval", str(run_dir), "--watch",
               "--poll", "0.2", "--idle-timeout", "600", "--out", str(out)]
    watch = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.time() + 600
    while {r["step"] for r in records_of(out)} != {5, 10, 15} and watch.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    watch.send_signal(signal.SIGINT)
    output = watch.communicate(timeout=120)[0]
    assert watch.returncode == 130 and output.rstrip().endswith("jaxlm eval: interrupted"), output[-3000:]
    assert "Traceback" not in output
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0].startswith("run,step,heldout/loss") and [row.split(",")[1] for row in rows[1:]] == ["5", "10", "15"]
    assert (out / "curves.png").stat().st_size > 0


def test_a_line_cut_short_does_not_swallow_the_next_sweeps_first_record(tmp_path):
    """The next append was glued to a line an interruption cut short: its first metric was lost with it, while the
    others marked that step and task done, so it was never evaluated again (a hole in results.csv)."""
    def record(step, metric):
        return {"run": "r", "source": "/r", "step": step, "task": "heldout", "metric": metric, "value": 1.0}

    results.append_records(tmp_path, [record(5, "loss"), record(5, "acc")])
    with open(tmp_path / results.RESULTS, "a", encoding="utf-8") as stream:
        stream.write('{"run": "r", "source": "/r", "st')
    results.append_records(tmp_path, [record(10, "loss"), record(10, "acc")])
    assert [(r["step"], r["metric"]) for r in records_of(tmp_path)] == [(5, "loss"), (5, "acc"), (10, "loss"),
                                                                       (10, "acc")]


# ---------------------------------------------------------------- bad input: a message, no compute, nothing written

def _snapshot(directory):
    return {p.relative_to(directory): p.stat().st_mtime_ns for p in sorted(directory.rglob("*")) if p.is_file()}


def bad_cases(run_dir, tmp_path, minilm):
    not_bigbench = tmp_path / "task.json"
    not_bigbench.write_text(json.dumps({"examples": [{"input": "2 + 2 =", "target": "4"}]}))
    lines = tmp_path / "lines.txt"
    lines.write_text("a line of text\n")
    (tmp_path / "empty").mkdir()
    no_tokens = tmp_path / "controls.txt"
    no_tokens.write_text("\x01\x03\n\x02\n")  # lines WordPiece keeps no token of: their perplexity was 1.0
    empty_choice = tmp_path / "empty_choice.json"  # scored 0, the highest log-likelihood, "" was always chosen
    empty_choice.write_text(json.dumps({"examples": [{"input": "Is it?", "target_scores": {"": 1, "no": 0}}]}))
    another_run = shutil.copytree(run_dir, tmp_path / "another", ignore=shutil.ignore_patterns("compile-cache"))
    too_long = tmp_path / "long_choice.json"  # refused once the heldout step had compiled and --out was made
    too_long.write_text(json.dumps({"examples": [{"input": "Is it?", "target_scores": {"yes " * 100: 1, "no": 0}}]}))
    (tmp_path / "a directory" / "results.jsonl").mkdir(parents=True)  # failed after the whole evaluation
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "results.jsonl").write_bytes(b"\xff\xfe{}\n")  # Python's codec error, unexplained
    return {
        "no checkpoint": ([tmp_path / "empty"], ["holds no committed checkpoint"]),
        "a file for a run": ([lines], [f"{lines} is a file; a checkpoint is a directory"]),  # was "no such directory"
        "results.jsonl a directory": ([run_dir, "--out", tmp_path / "a directory"],
                                      [f"{tmp_path / 'a directory' / 'results.jsonl'} is a directory where the "
                                       "evaluation writes its results.jsonl: move it or choose another --out"]),
        "results.jsonl not text": ([run_dir, "--out", tmp_path / "binary"],
                                   [f"{tmp_path / 'binary' / 'results.jsonl'} is not UTF-8 text, so not the results "
                                    "of a `jaxlm eval`: move it or choose another --out"]),
        "selection matches none": ([run_dir, "--select", "every:7"],
                                   ["--select every:7 matches none", "5, 10, 15, 20"]),
        "a selected step missing": ([run_dir, "--select", "steps:10,7"],  # once evaluated step 10 alone, silently
                                    ["--select steps:10,7: step 7 is not among", "5, 10, 15, 20"]),
        "unknown task": ([run_dir, "--tasks", "heldout,bleu"], ["unknown task 'bleu'", "ppl:FILE"]),
        "not BIG-bench JSON": ([run_dir, "--tasks", f"choice:{not_bigbench}"],
                               ["not a BIG-bench JSON task", "examples[0] has no 'target_scores'"]),
        "no way to score": ([minilm, "--tasks", f"ppl:{lines}"], ["cannot score text", "no mlm parameters"]),
        "heldout of a converted checkpoint": ([minilm], ["heldout needs a training run"]),
        "shape-changing override": ([run_dir, "model.hidden_size=32"],
                                    ["change the parameters' shapes", "['encoder']"]),
        "out inside the run": ([run_dir, "--out", run_dir / "eval"], ["lies inside", "never writes into a run"]),
        # another run's curves.png was replaced and results written among its files
        "out in another run": ([run_dir, "--out", another_run], [f"lies inside {another_run}", "never writes into"]),
        # it said the run "was trained on" the override's directory
        "prepared data overridden to nowhere": ([run_dir, f"data.prepared_dir={tmp_path / 'nope'}"],
                                                [f"heldout: data.prepared_dir={tmp_path / 'nope'} is not a directory; "
                                                 f"give the prepared data of {run_dir}"]),
        "out where nothing can be written": ([run_dir, "--out", "/sys/eval"],
                                             ["--out /sys/eval: cannot write in /sys"]),
        "bad selection": ([run_dir, "--select", "every:0"], ["--select 'every:0'", "every:N"]),
        "lines without a token": ([run_dir, "--tasks", f"ppl:{no_tokens}"],
                                  ["ppl:controls: no line of", "holds a token to score", "give lines of text"]),
        "a choice without a token": ([run_dir, "--tasks", f"choice:{empty_choice}"],
                                     ["empty_choice.json: examples[0] has the choice ''",
                                      "give every choice some text"]),
        "a choice longer than the model reads": ([run_dir, "--tasks", f"heldout,choice:{too_long}"],
                                                 ["choice:long_choice@0: item 0: a continuation of",
                                                  "more than the model's 64"]),
        "an encoder input nothing reads": ([run_dir, "--tasks", f"ppl:{lines}", "--encoder-input", "summarize:"],
                                           ["--encoder-input 'summarize:' is read by ppl tasks of encoder-decoders",
                                            "would ignore it: remove it"]),  # was ignored, silently
    }


CASE_NAMES = ["no checkpoint", "a file for a run", "results.jsonl a directory", "results.jsonl not text",
              "selection matches none", "a selected step missing", "unknown task",
              "not BIG-bench JSON", "no way to score", "heldout of a converted checkpoint", "shape-changing override",
              "out inside the run", "out in another run", "prepared data overridden to nowhere",
              "out where nothing can be written", "bad selection", "lines without a token",
              "a choice without a token", "a choice longer than the model reads", "an encoder input nothing reads"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_is_refused_with_a_message_before_any_compute(case, trained, tmp_path, minilm_converted, capsys):
    from jaxlm.cli import main
    run_dir, _ = trained
    args, expected = bad_cases(run_dir, tmp_path, minilm_converted)[case]
    before = _snapshot(run_dir)
    out = tmp_path / "out"
    argv = ["eval", *map(str, args)]
    if "--out" not in argv:
        argv += ["--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (run_dir / "eval").exists()
    assert _snapshot(run_dir) == before


def test_two_processes_evaluate_as_one(trained, tmp_path):
    run_dir, _ = trained
    out = tmp_path / "eval"
    env = dict(os.environ, JAXLM_TOTAL_DEVICES="4", JAXLM_COMMAND="eval",
               JAXLM_BIN=str(ROOT / ".venv" / "bin" / "jaxlm"))
    env["XLA_FLAGS"] = xla_flags(None)
    proc = subprocess.run(["bash", str(ROOT / "launch" / "local_multiprocess.sh"), "2", str(run_dir),
                           "--select", "latest", "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["step"] for r in records_of(out) if r["metric"] == "loss"] == [STEPS]  # process 0 alone writes
    final = final_eval(run_dir)
    for key in ("loss", "mlm_acc", "nsp_acc"):
        assert heldout(out, STEPS)[key] == pytest.approx(final[key], rel=1e-5, abs=1e-6), key


def test_each_function_compiles_once_per_shape_not_once_per_checkpoint(trained, tmp_path):
    from jaxlm.eval import sweep
    from jaxlm.eval.scoring import compiled_scorer
    run_dir, _ = trained
    lines = tmp_path / "lines.txt"
    lines.write_text("It is a truth universally acknowledged.\nThat a single man in possession of a good fortune, "
                     "must be in want of a wife.\n")
    plan = sweep.plan([str(run_dir)], [f"heldout,ppl:{lines}"], "steps:5", str(tmp_path / "one"))
    sweep.run(plan)
    source = plan.sources[0]
    evaluator = sweep.SourceEvaluator(source, plan.tasks, plan.batch_size, "")
    jitted = compiled_scorer(source.config.model, evaluator.mesh, tuple(evaluator.rules)).jitted
    after_one = jitted._cache_size()
    assert after_one >= 1
    progress = sweep.run(sweep.plan([str(run_dir)], [f"heldout,ppl:{lines}"], "all", str(tmp_path / "four")))
    assert sorted({r["step"] for r in progress.records}) == [5, 10, 15, 20]
    assert jitted._cache_size() == after_one


def test_a_broken_checkpoint_is_reported_and_skipped(trained, tmp_path, capsys):
    import shutil
    from jaxlm.cli import main
    run_dir = tmp_path / "run"
    shutil.copytree(trained[0], run_dir)
    for data in (run_dir / "checkpoints" / "10" / "state").rglob("d/*"):
        data.write_bytes(b"")
    (run_dir / "checkpoints" / "15" / "state" / "_METADATA").unlink()
    out = tmp_path / "eval"
    assert main(["eval", str(run_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "skipped:" in printed and "run step 10: could not restore" in printed
    assert f"run step 15: could not restore (ValueError: {run_dir / 'checkpoints'}: checkpoint 15 cannot be " \
           "read" in printed and "train.init_from" not in printed  # as if the command had a train.init_from
    assert sorted({r["step"] for r in records_of(out)}) == [5, 20]
    alone = tmp_path / "alone"  # nothing evaluated: an error, and no results files named
    assert main(["eval", str(run_dir), "--select", "steps:10", "--out", str(alone)]) == 2
    printed = capsys.readouterr()
    assert "results:" not in printed.out and not records_of(alone)
    expected = "error: no checkpoint could be evaluated (1 skipped, the first: run step 10: could not restore"
    assert expected in printed.err


def test_one_checkpoint_directory_is_evaluated_alone(trained, tmp_path):
    from jaxlm.eval import sweep
    progress = sweep.run(sweep.plan([str(trained[0] / "checkpoints" / "10")], ["heldout"], "all", str(tmp_path)))
    assert {r["step"] for r in progress.records} == {10}
    assert {r["run"] for r in progress.records} == {"run"}


def test_runs_in_folders_of_the_same_name_keep_their_own_rows(trained, tmp_path):
    """Two runs named run in a/runs and b/runs: labelled apart by as many parent folders as it takes (the parent
    alone, runs, once gave both one label, and the second run's rows replaced the first's)."""
    from jaxlm.eval import sweep
    copies = [tmp_path / side / "runs" / "run" for side in ("a", "b")]
    for copy in copies:
        shutil.copytree(trained[0] / "checkpoints", copy / "checkpoints")
    out = tmp_path / "eval"
    plan = sweep.plan([*map(str, copies), str(copies[0] / "checkpoints" / "20")], ["heldout"], "latest", str(out))
    assert [s.label for s in plan.sources] == ["run@a/runs", "run@b/runs", "run@a/runs"]
    sweep.run(plan)
    rows = (out / "results.csv").read_text().splitlines()[1:]
    assert sorted(row.split(",")[0] for row in rows) == ["run@a/runs", "run@b/runs"]
    apart = tmp_path / "apart"  # one call each into one --out: the second's rows replaced the first's
    for copy in copies:
        sweep.run(sweep.plan([str(copy)], ["heldout"], "latest", str(apart)))
    rows = (apart / "results.csv").read_text().splitlines()[1:]
    assert sorted(row.split(",")[0] for row in rows) == ["run", "run@b/runs"]
    again = sweep.plan([str(copies[0] / "checkpoints" / "20"), str(copies[1])], ["heldout"], "latest", str(apart))
    assert [s.label for s in again.sources] == ["run", "run@b/runs"]  # each keeps the label of its results


def test_a_watch_for_a_run_without_checkpoints_says_it_waits(tmp_path, capsys):
    """A mistyped run directory under --watch waited --idle-timeout (30 minutes by default) without a word."""
    from jaxlm.eval import sweep
    from jaxlm.eval.sources import NoCheckpointYet
    with pytest.raises(NoCheckpointYet, match="no such directory"):
        sweep.plan([str(tmp_path / "rnu")], ["heldout"], out=str(tmp_path / "eval"), watch=True, idle_timeout=0.3,
                   poll=0.1)
    assert capsys.readouterr().out == (f"jaxlm eval: {tmp_path / 'rnu'}: no such directory; waiting up to 0.3 s for "
                                       "its first checkpoint\n")


def test_a_checkpoint_written_again_at_its_step_is_evaluated_again(trained, tmp_path):
    """A run trained anew at the same path got the first run's results back from --out, silently: records were
    matched on the path and step alone."""
    from jaxlm.eval import sweep
    run, out = tmp_path / "run", tmp_path / "eval"
    shutil.copytree(trained[0] / "checkpoints" / "20", run / "checkpoints" / "20")

    def losses():
        sweep.run(sweep.plan([str(run)], ["heldout"], "latest", str(out)))
        return [r["value"] for r in records_of(out) if r["metric"] == "loss"]

    first = losses()
    shutil.rmtree(run / "checkpoints" / "20")  # other weights at step 20, committed at another time
    shutil.copytree(trained[0] / "checkpoints" / "15", run / "checkpoints" / "20")
    again = losses()
    assert len(first) == 1 and len(again) == 2 and again[1] != first[0]
    assert losses() == again  # the new checkpoint's results are reused
    assert (out / "results.csv").read_text().splitlines()[1].split(",")[2] == repr(again[1])


def test_out_is_reused_only_for_the_same_inputs(trained, tmp_path):
    """Results are reused where the task's file, the overrides and the encoder input are those they were made
    with: a file of the same name elsewhere, or another override, once got the first results back, silently."""
    from jaxlm.eval import sweep
    run_dir, out = str(trained[0]), str(tmp_path / "eval")
    first, other = tmp_path / "a" / "lines.txt", tmp_path / "b" / "lines.txt"
    for path, text in ((first, "It is a truth universally acknowledged.\n"), (other, "Emma Woodhouse was rich.\n")):
        path.parent.mkdir()
        path.write_text(text)
    sweep.run(sweep.plan([run_dir], [f"ppl:{first}"], "latest", out))
    assert sweep.plan([run_dir], [f"ppl:{first}"], "latest", out).inputs  # the same: reused
    for tasks, overrides in (([f"ppl:{other}"], []), ([f"ppl:{first}"], ["model.attention_kernel=xla"])):
        with pytest.raises(ValueError, match=r"holds ppl:lines of run evaluated on another file or with other "
                                             r"overrides or --encoder-input; give another --out"):
            sweep.plan([run_dir], tasks, "latest", out, overrides)


def test_a_finetune_task_records_the_downstream_metrics_of_each_checkpoint(trained, tmp_path):
    import yaml
    run_dir, _ = trained
    config = tmp_path / "polarity.yaml"
    config.write_text(yaml.safe_dump({
        "mesh": {"data": -1}, "optim": {"peak_lr": 1.0e-3}, "train": {"global_batch": 16, "log_every": 5},
        "finetune": {"task": "sequence_classification", "train": "polarity:train", "dev": "polarity:dev",
                     "test": "polarity:test", "epochs": 1, "max_length": 32}}))
    out = tmp_path / "eval"
    run_cli("eval", run_dir, "--select", "every:10", "--tasks", f"finetune:{config}", "--out", out)
    rows = [r for r in records_of(out) if r["task"] == "finetune:polarity"]
    assert sorted({r["step"] for r in rows}) == [10, 20]
    by_metric = {(r["step"], r["metric"]): r for r in rows}
    for step in (10, 20):
        summary = json.loads((out / run_dir.name / f"finetune-polarity-{step}" / "summary.json").read_text())
        assert by_metric[step, "dev_accuracy"]["value"] == summary["dev"]["accuracy"]
        assert by_metric[step, "test_accuracy"]["baseline"] == summary["test_baseline"]["accuracy"]
        assert summary["train_records"] == 140


def test_a_run_trained_on_8_devices_fine_tunes_on_1(trained, tmp_path):
    import yaml
    run_dir, _ = trained
    config = tmp_path / "polarity.yaml"
    config.write_text(yaml.safe_dump({
        "mesh": {"data": -1}, "train": {"global_batch": 16, "run_dir": str(tmp_path / "tuned")},
        "finetune": {"task": "sequence_classification", "init_from": str(run_dir), "train": "polarity:train[:32]",
                     "dev": "polarity:dev", "epochs": 1, "max_length": 32}}))
    proc = run_cli("finetune", config, devices=1)
    assert "best dev accuracy" in proc.stdout
    assert json.loads((tmp_path / "tuned" / "summary.json").read_text())["train_records"] == 32
