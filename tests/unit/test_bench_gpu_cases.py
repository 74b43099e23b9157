"""bench/gpu.py without a GPU: every case is a valid config (a rare GPU session must not lose a case to a
typo), its tables, and its compiling ahead."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from jaxlm import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
bench_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gpu)


@pytest.mark.parametrize("case", sorted(bench_gpu.CASES))
def test_case_config_loads(case):
    config, overrides, peer_case = bench_gpu.CASES[case]
    loaded = config_lib.load(ROOT / config, overrides)
    assert loaded.train.global_batch > 0 and peer_case


def test_a_case_adds_its_xla_flags_to_the_callers():
    assert set(bench_gpu.CASE_XLA_FLAGS) <= set(bench_gpu.CASES)
    flags = bench_gpu.CASE_XLA_FLAGS["t5notriton"]
    assert bench_gpu.case_env("t5", {"A": "1"}) == {"A": "1"}
    assert bench_gpu.case_env("t5notriton", {"A": "1"}) == {"A": "1", "XLA_FLAGS": flags}
    assert bench_gpu.case_env("t5notriton", {"XLA_FLAGS": "--x=1"}) == {"XLA_FLAGS": f"--x=1 {flags}"}


def test_profile_table_puts_each_bound_beside_its_measurement():
    """bench/gpu.py's profile table runs only on a GPU; its shape is checked here, with and without bounds."""
    measured = dict.fromkeys(("matmuls", "attention", "host gaps"), 2.0)
    top = [{"op": "loop_convert_multiply_fusion.11", "class": "norms and elementwise", "ms": 3.9, "launches": 12,
            "bound_ms": 1.5}, {"op": "nvjet_sm90", "class": "matmuls", "ms": 1.0, "launches": 24}]
    rows = {"bert128": {"profile": {"ms_per_step": measured, "traced_ms_per_step": 6.5,
                                    "bound_ms_per_step": {"matmuls": 1.25, "attention": 0.5},
                                    "kernels_per_step": {"matmuls": 230, "attention": 24, "host gaps": 0},
                                    "top_ops": top}},
            "gpt2": {"profile": {"ms_per_step": measured, "traced_ms_per_step": 6.0}},
            "t5": {"profile_error": "ValueError: no trace"}}
    text = bench_gpu.profile_table(["bert128", "gpt2", "t5"], rows)
    assert "| bert128 | 2.00 (1.25) [230] | 2.00 (0.50) [24] | 2.00 [0] | 6.50 |" in text
    assert "| gpt2 | 2.00 | 2.00 | 2.00 | 6.00 |" in text
    assert ("bert128: loop_convert_multiply_fusion.11 (norms and elementwise) 3.900 ms in 12, bound 1.500; "
            "nvjet_sm90 (matmuls) 1.000 ms in 24") in text
    assert "jaxlm t5 profile: ValueError: no trace" in text


def test_table_gives_the_ratio_mfu_and_where_each_process_spent_its_time():
    """The main table with one H200 row of both sides (jaxlm 575,021 tokens/s, the peer 512,340)."""
    ours = {"bert128": {"global_batch": 256, "seq_len": 128, "step_ms": 56.99, "tokens_per_s": 575020.7,
                        "gflops_per_token": 0.546320232, "mfu": 0.3176, "peak": "989 TFLOP/s", "compile_s": 45.0,
                        "process_s": 101.4},
            "t5": {"error": "out of memory (all of it in t5.log)", "process_s": 12.0}}
    theirs = {"bert128": {"batch": 256, "seq": 128, "step_ms": 63.96, "tokens_per_s": 512340, "model_tflops": 344.5,
                          "warmup_s": 35.7}}
    text = bench_gpu.table(["bert128", "t5"], ours, theirs, {"tflops": 792.7, "gpu": "NVIDIA H200"})
    assert "| bert128 | 256 | 128 | 57.0 | 575,021 | 64.0 | 512,340 | 1.12 | 31.8% / 39.6% | 43.5% | 45 / 101 | 36 |" in text
    assert "| t5 | n/a | n/a | n/a |" in text and "jaxlm t5: out of memory" in text


def test_precompile_fills_the_cache_the_timed_processes_read(tmp_path, monkeypatch):
    """bench/gpu.py's compiling ahead: two cases (tiny configs on the CPU) in two processes at once, each
    row its compile time and the cache, the cache holding each one's train step, and with --train's folder that of
    each one's `jaxlm train` run too (its schedule's length makes it another step)."""
    monkeypatch.setitem(bench_gpu.CASES, "bert-tiny", ("configs/bert-tiny.yaml", ["data.max_seq_length=128"],
                                                        "bert128"))
    monkeypatch.setitem(bench_gpu.CASES, "gpt2-tiny", ("configs/gpt2-tiny.yaml", ["data.max_seq_length=128"], "gpt2"))
    cache = tmp_path / "cache"
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    rows = bench_gpu.precompile(["bert-tiny", "gpt2-tiny"], ["train.global_batch=8"], tmp_path, env, jobs=2,
                                train_dir=tmp_path / "data")
    assert sorted(rows) == ["bert-tiny", "gpt2-tiny", "train bert-tiny", "train gpt2-tiny"]
    assert all(rows[case]["compile_s"] > 0 and rows[case]["cache"] == str(cache) for case in rows), rows
    assert len(list(cache.glob("jit_train_step-*"))) == 4
    assert (tmp_path / "compile-bert-tiny.log").is_file() and (tmp_path / "compile-train-gpt2-tiny.log").is_file()


def test_a_case_the_peer_gave_no_row_for_is_an_error(tmp_path):
    """A peer that stopped after its first case once left the second out of the table without a word."""
    script = tmp_path / "peer.py"
    script.write_text('print(\'{"gpu": "G", "tflops": 1.0}\')\nprint(\'{"tokens_per_s": 5}\')\n')
    matmul, rows = bench_gpu.peer(["bert128", "gpt2"], script, tmp_path, dict(os.environ))
    assert matmul == {"gpu": "G", "tflops": 1.0} and rows["bert128"] == {"tokens_per_s": 5}
    log = tmp_path / "peer.log"
    assert rows["gpt2"] == {"error": f"no row from the peer for this case (all of its output in {log})"}
    assert bench_gpu.failed_cases(["bert128", "gpt2"], {"bert128": {"tokens_per_s": 4}}, rows) == ["gpt2"]


def test_a_failed_case_makes_the_call_exit_nonzero_after_its_tables(tmp_path, monkeypatch, capsys):
    """bench/gpu.py exited 0 with a case's error in its table: a script or CI step calling it took that as done."""
    script = tmp_path / "peer.py"
    script.write_text("")
    monkeypatch.setattr(bench_gpu, "ours", lambda case, *_: {"tokens_per_s": 4.0, "gflops_per_token": 1.0}
                        if case == "bert128" else {"error": "out of memory (all of it in t5.log)"})
    monkeypatch.setattr(bench_gpu, "peer", lambda cases, *_: ({}, {"bert128": {"tokens_per_s": 2.0},
                                                                    "t5": {"error": "peer died"}}))
    monkeypatch.setattr("sys.argv", ["gpu.py", "--cases", "bert128,t5", "--peer", str(script), "--compile-jobs", "0",
                                     "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        bench_gpu.main()
    assert stopped.value.code == "gpu.py: 1 of 2 cases failed (t5): their errors are above"
    out = capsys.readouterr().out
    assert "| bert128 |" in out and "jaxlm t5: out of memory" in out and "peer t5: peer died" in out


@pytest.mark.parametrize(("options", "expected"), [
    (["--plan", "--prepare", "DIR"], "--plan and --prepare are separate runs: give one of them"),
    (["--plan", "--train", "DIR"], "--plan compiles each case for an H100 here and ignores --train: drop --train, "
                                   "or leave out --plan"),
    (["--plan", "--profile"], "--plan compiles each case for an H100 here and ignores --profile: drop --profile, "
                              "or leave out --plan"),
    (["--plan", "--peer", "peers_torch.py"], "--plan compiles each case for an H100 here and ignores --peer: drop "
                                             "--peer, or leave out --plan"),
    (["--prepare", "DIR", "--profile"], "--prepare only prepares the cases' data and ignores --profile: drop "
                                        "--profile, or leave out --prepare"),
    (["--prepare", "DIR", "--train", "DIR"], "--prepare only prepares the cases' data and ignores --train: drop "
                                             "--train, or leave out --prepare"),
    (["--prepare", "DIR", "--set", "bench.steps=5"], "--prepare only prepares the cases' data and ignores --set: "
                                                      "drop --set, or leave out --prepare")])
def test_options_another_mode_would_ignore_are_refused_before_any_work(options, expected, tmp_path):
    """--plan and --prepare each ran and silently dropped the other mode's options (a --profile, a --train DIR)."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "bench/gpu.py", *options, "--out", str(out)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.endswith(f"gpu.py: error: {expected}\n"), proc.stderr
    assert not out.exists() and not (ROOT / "DIR").exists()


@pytest.mark.parametrize("case", ["bert128", "gpt2"])
def test_train_data_names_a_staged_copy_of_the_packaged_tokenizer(case, tmp_path):
    """The GPU machine cannot fetch the packages BERT's and GPT-2's tokenizers come from: --prepare copies them
    into DIR, and the cases' preparation and training name that copy, which tokenizes as the packaged one."""
    from jaxlm.data.tokenizers.load import load_tokenizer

    config = bench_gpu.CASES[case][0]
    bench_gpu.stage_tokenizer(config, tmp_path)
    staged = bench_gpu.staged_tokenizer(config, tmp_path)
    assert f"data.vocab={staged}" in bench_gpu.data_overrides(case, tmp_path)
    text = "The quick brown fox. Isn't it?"
    packaged = load_tokenizer(config_lib.load(ROOT / config).data.vocab)
    assert load_tokenizer(staged).encode(text) == packaged.encode(text)


def test_a_failed_preparation_is_named_and_ends_the_call(tmp_path, monkeypatch, capsys):
    """--prepare printed a failed `jaxlm prepare`'s last line as if it were its summary, and exited 0."""
    taken = tmp_path / bench_gpu.data_name("bert128")
    taken.mkdir(parents=True)
    (taken / "notes.txt").write_text("not prepared data")
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--prepare", str(tmp_path), "--cases", "bert128",
                                      "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as stopped:
        bench_gpu.main()
    assert stopped.value.code == f"gpu.py: preparing {taken.name} failed: the errors are above"
    out = capsys.readouterr().out
    assert f"prepare {taken}: failed: jaxlm prepare: error: output_dir {taken} holds files and is not a prepared" in out
    assert (taken / "notes.txt").read_text() == "not prepared data"
