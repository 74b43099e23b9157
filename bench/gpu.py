"""Training throughput on one GPU, jaxlm next to the Hugging Face peer in the same call: BERT-base at 128 and
512, GPT-2 124M at 1024, T5-base span corruption (512 -> 114). The peer (`peers_torch.py`: transformers,
torch.compile, bf16 autocast, SDPA, fused AdamW) runs its cases before ours are timed, so that a call cut
short by its time limit keeps them; then each jaxlm case runs `jaxlm bench` in its own process. One table of
tokens/s, the ratio, and MFU against the datasheet peak and against the bf16 matmul peak the peer measures on
this GPU.

    python bench/gpu.py [--peer ../shared/bench/peers_torch.py] [--cases bert128,bert512,gpt2,t5] [--set K=V]
                        [--profile] [--train DIR] [--compile-jobs N]
    python bench/gpu.py --prepare DIR [--cases ...]     # here, before: the demo corpus prepared per case
    python bench/gpu.py --plan [--cases ...]             # here, no GPU: each case's roofline plan on an H100

`--train DIR` also runs `jaxlm train` of each case on the data prepared under DIR and compares its tokens/s
with the bench's (the issue's 95%: the input pipeline, metrics and checkpoints must not stall the device).

Before anything is timed, the jaxlm cases compile four at a time (`--compile-jobs`; `jaxlm bench --compile-only`)
into a persistent cache (JAX_COMPILATION_CACHE_DIR, default .bench-gpu/jax-cache), which each case's timed
process then reads instead of compiling, and so does a second call on the same machine (the cache's keys ignore
the ops' source metadata: clear it after renaming a scope that --profile reads); each process's output is kept
in .bench-gpu/<case>.log (compile-<case>.log for the compilation), and with --profile every op's row and the
step's HLO in .bench-gpu/profile-<case>/ (ops.json, step.hlo)."""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import sentencepiece

from jaxlm.train.profile import op_line

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.5


def _bert(batch: int, seq: int) -> list[str]:
    return [f"train.global_batch={batch}", f"data.max_seq_length={seq}", f"data.max_predictions={seq * 20 // 128}",
            "model.attention_kernel=cudnn"]


def _gpt2(batch: int) -> list[str]:
    return [f"train.global_batch={batch}", "data.max_seq_length=1024", "model.attention_kernel=cudnn"]


T5_CONFIG = "configs/t5-base.yaml"
# on our Pallas kernels (T5's bias and its gradient, the padding and the attention dropout inside): 87.7 ms a step
# on an H200 where XLA's attention took 100.4 (the t5xla case)
# AdamW, the peer's optimiser, in place of the config's Adafactor
T5 = ["train.global_batch=64", "data.max_seq_length=512", "data.max_target_length=114", "model.attention_kernel=flash",
      "optim.name=adamw", "optim.b1=0.9", "optim.peak_lr=1e-4"]
T5_VOCABULARY = "t5-demo-unigram.model"  # trained by --prepare into its DIR
NO_DROPOUT = ["model.hidden_dropout=0", "model.attention_dropout=0", "model.activation_dropout=0"]
FLASH_DROPOUT = ["model.attention_kernel=flash", "model.attention_dropout=0.1"]
# name: (config, overrides, the peer's case of the same model, sequence and batch); the b-suffixed cases are
# larger batches, where each side may do better
CASES = {
    "bert128": ("configs/bert-base.yaml", _bert(256, 128), "bert128"),
    "bert512": ("configs/bert-base.yaml", _bert(32, 512), "bert512"),
    "gpt2": ("configs/gpt2-small.yaml", _gpt2(16), "gpt2"),
    "t5": (T5_CONFIG, T5, "t5"),
    # cuDNN's kernel has no attention dropout (the peer keeps T5's 0.1 on the attention weights)
    "t5cudnn": (T5_CONFIG, [*T5, "model.attention_kernel=cudnn", "model.attention_dropout=0"], "t5"),
    # T5 on XLA's attention; BERT and GPT-2 on our Pallas kernels, with the peer's attention dropout of 0.1, which
    # cuDNN's kernel cannot do
    "t5xla": (T5_CONFIG, [*T5, "model.attention_kernel=xla"], "t5"),
    "bert128flash": ("configs/bert-base.yaml", [*_bert(256, 128), *FLASH_DROPOUT], "bert128"),
    "bert512flash": ("configs/bert-base.yaml", [*_bert(32, 512), *FLASH_DROPOUT], "bert512"),
    "gpt2flash": ("configs/gpt2-small.yaml", [*_gpt2(16), *FLASH_DROPOUT], "gpt2"),
    # our kernels take half the temporaries of XLA's attention (16.7 GiB to 30.8 on an H200): room for twice the batch
    "t5b128": (T5_CONFIG, [*T5, "train.global_batch=128"], "t5"),
    "bert128b512": ("configs/bert-base.yaml", _bert(512, 128), "bert128b512"),
    "bert512b64": ("configs/bert-base.yaml", _bert(64, 512), "bert512b64"),
    "gpt2b32": ("configs/gpt2-small.yaml", _gpt2(32), "gpt2b32"),
    "gpt2chunked": ("configs/gpt2-small.yaml", [*_gpt2(16), "model.logits_chunks=8"], "gpt2"),
    "bert128fp8": ("configs/bert-base.yaml", [*_bert(256, 128), "model.fp8=true"], "bert128"),
    "gpt2fp8": ("configs/gpt2-small.yaml", [*_gpt2(16), "model.fp8=true"], "gpt2"),
    # what dropout's masks cost (no dropout: the bound), and with XLA's RngBitGenerator
    "bert128nodrop": ("configs/bert-base.yaml", [*_bert(256, 128), *NO_DROPOUT], "bert128"),
    "bert128rbg": ("configs/bert-base.yaml", [*_bert(256, 128), "train.dropout_rng=rbg"], "bert128"),
    "gpt2nodrop": ("configs/gpt2-small.yaml", [*_gpt2(16), *NO_DROPOUT], "gpt2"),
    "gpt2rbg": ("configs/gpt2-small.yaml", [*_gpt2(16), "train.dropout_rng=rbg"], "gpt2"),
    "t5nodrop": (T5_CONFIG, [*T5, *NO_DROPOUT], "t5"),
    "t5rbg": (T5_CONFIG, [*T5, "train.dropout_rng=rbg"], "t5"),
    # the masks drawn by threefry in kernels of their own and kept a byte an element between the passes, where the
    # default hashes them in the kernels that apply them
    "bert128threefry": ("configs/bert-base.yaml", [*_bert(256, 128), "train.dropout_rng=threefry"], "bert128"),
    "gpt2threefry": ("configs/gpt2-small.yaml", [*_gpt2(16), "train.dropout_rng=threefry"], "gpt2"),
    "t5threefry": (T5_CONFIG, [*T5, "train.dropout_rng=threefry"], "t5"),
    # GPT-2's rows read as one sequence each, as the peer, GPT-2 and nanoGPT read them: no mask for cuDNN to read as a
    # bias [batch, 1, 1024, 1024] in every layer (the packed documents' segments)
    "gpt2crossdoc": ("configs/gpt2-small.yaml", [*_gpt2(16), "model.cross_document_attention=true"], "gpt2"),
    # GPT-2's table and head at 50,257 rows, not the config's 50,304 (model.vocab_multiple=128)
    "gpt2unpadded": ("configs/gpt2-small.yaml", [*_gpt2(16), "model.vocab_multiple=1"], "gpt2"),
    # the layers as one nn.scan: a fifth of the initialiser's compile time on the CPU (T5-base), at what cost
    # to the step?
    "bert128scan": ("configs/bert-base.yaml", [*_bert(256, 128), "model.scan_layers=true"], "bert128"),
    "bert512scan": ("configs/bert-base.yaml", [*_bert(32, 512), "model.scan_layers=true"], "bert512"),
    "gpt2scan": ("configs/gpt2-small.yaml", [*_gpt2(16), "model.scan_layers=true"], "gpt2"),
    "t5scan": (T5_CONFIG, [*T5, "model.scan_layers=true"], "t5"),
    # without XLA's Triton fusions of normalization diamonds (softmax, the norms' backward pass): BERT's and T5's
    # ran at 2.6-2.7x their bound on an H200 (CASE_XLA_FLAGS)
    "bert128notriton": ("configs/bert-base.yaml", _bert(256, 128), "bert128"),
    "t5notriton": (T5_CONFIG, T5, "t5"),
    # every GEMM on cuBLAS, none as XLA's Triton GEMM fusions (GPT-2's head ran at a third of the peak as one)
    "bert128cublas": ("configs/bert-base.yaml", _bert(256, 128), "bert128"),
    "gpt2cublas": ("configs/gpt2-small.yaml", _gpt2(16), "gpt2"),
    "t5cublas": (T5_CONFIG, T5, "t5"),
    # T5's queries, keys and values (cross-attention's keys and values) as separate matmuls, as before
    # model.fused_projections stacked their kernels into one
    "t5unfused": (T5_CONFIG, [*T5, "model.fused_projections=false"], "t5"),
    # XLA's dot merger back (jaxlm.parallel.xla_options.GPU_XLA_OPTIONS turns it off): the queries', keys' and values'
    # projections as one GEMM, sliced for the attention (CASE_XLA_FLAGS)
    "bert512dotmerger": ("configs/bert-base.yaml", _bert(32, 512), "bert512"),
    "gpt2dotmerger": ("configs/gpt2-small.yaml", _gpt2(16), "gpt2"),
}
DEFAULT_CASES = "bert128,bert512,gpt2,t5"
# XLA flags a case adds to XLA_FLAGS, in its compile and its timed process (JAX's compilation cache keys them)
# (a case that names --xla_disable_hlo_passes decides every pass: jaxlm's own choice, dot-merger, steps aside)
CASE_XLA_FLAGS = {**dict.fromkeys(("bert128notriton", "t5notriton"),
                                  "--xla_disable_hlo_passes=triton-softmax-rewriter,dot-merger"),
                  **dict.fromkeys(("bert512dotmerger", "gpt2dotmerger"), "--xla_disable_hlo_passes="),
                  **dict.fromkeys(("bert128cublas", "gpt2cublas", "t5cublas"), "--xla_gpu_enable_triton_gemm=false")}
DEFAULT_PEER = ROOT.parent / "shared" / "bench" / "peers_torch.py"
DEFAULT_COMPILE_JOBS = 4
TRAIN_STEPS, TRAIN_LOG_EVERY = 100, 25  # `jaxlm train`'s rate: the mean of its logged rates after the first


def last_json(text: str) -> dict | None:
    """The last line of `text` that is a JSON object."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def run_logged(command: list[str], log: pathlib.Path, env: dict) -> subprocess.CompletedProcess:
    """Runs `command` from the repository root with its output in `log`; returns its exit status and (as stdout)
    that output."""
    with log.open("w") as out:
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    return subprocess.CompletedProcess(command, done.returncode, log.read_text())


def case_env(case: str, env: dict) -> dict:
    """`env` with the case's XLA flags (CASE_XLA_FLAGS) added to XLA_FLAGS."""
    flags = " ".join(f for f in (env.get("XLA_FLAGS", ""), CASE_XLA_FLAGS.get(case, "")) if f)
    return env | {"XLA_FLAGS": flags} if flags else env


def bench_process(case: str, extra: list[str], options: list[str], log: pathlib.Path, env: dict) -> dict:
    """`jaxlm bench` of the case with `options`, its output in `log`: its JSON row, or why there is none."""
    config, overrides, _ = CASES[case]
    text = run_logged([sys.executable, "-m", "jaxlm.cli", "bench", config, *overrides, *extra, "--json", *options],
                      log, case_env(case, env)).stdout
    return last_json(text) or _failed(text, log)


def ours(case: str, extra: list[str], out_dir: pathlib.Path, env: dict, profile: bool) -> dict:
    trace = ["--profile", str(out_dir / f"profile-{case}")] if profile else []
    started = time.perf_counter()
    row = bench_process(case, extra, trace, out_dir / f"{case}.log", env)
    return row | {"process_s": round(time.perf_counter() - started, 1)}


def precompile(cases: list[str], extra: list[str], out_dir: pathlib.Path, env: dict, jobs: int,
               train_dir: pathlib.Path | None = None) -> dict:
    """Compiles the cases' steps (and state initialisers) in `jobs` processes at once, before anything is
    timed, into the compilation cache that each case's timed process then reads; with `train_dir`, also the
    train steps of their `--train` runs (`train_settings`: another schedule, so another step); {name: its row},
    the case's name or "train CASE". Each process takes GPU memory as it needs it (no preallocation), so that they
    fit side by side."""
    work = [(case, case, extra) for case in cases]
    if train_dir:
        work += [(f"train {case}", case, [*extra, *train_settings(case, train_dir)]) for case in cases]

    def one(job: tuple) -> dict:
        name, case, settings = job
        return bench_process(case, settings, ["--compile-only"], out_dir / f"compile-{name.replace(' ', '-')}.log",
                             env | {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(zip((name for name, *_ in work), pool.map(one, work)))


def plan(case: str, extra: list[str], out_dir: pathlib.Path, env: dict) -> dict:
    """`jaxlm compile --topology h100 --plan` of the case on this machine (no GPU): its compile-only step's
    memory and roofline plan."""
    config, overrides, _ = CASES[case]
    plugin = ROOT / ".venv" / "cuda-plugin"  # where `make install` puts JAX's CUDA plugin, off the main path
    path = os.pathsep.join(p for p in (str(plugin) if plugin.is_dir() else "", env.get("PYTHONPATH", "")) if p)
    text = run_logged([sys.executable, "-m", "jaxlm.cli", "compile", config, *overrides, *extra, "--topology", "h100",
                       "--plan", "--json"], out_dir / f"plan-{case}.log",
                      case_env(case, env) | {"JAX_PLATFORMS": "cpu", "PYTHONPATH": path}).stdout
    return last_json(text) or _failed(text, out_dir / f"plan-{case}.log")


def plan_table(cases: list[str], rows: dict) -> str:
    """Markdown: each case's roofline bound per step on one H100, by op class, with its bytes, kernels and
    the temporary memory XLA plans."""
    done = {c: rows[c] for c in cases if "plan" in rows.get(c, {})}
    failed = [f"plan {c}: {rows[c].get('error') or 'does not fit: ' + json.dumps(rows[c].get('exhausted'))}"
              for c in cases if c not in done]
    if not done:
        return "\n".join(failed)
    classes = [c for c in next(iter(done.values()))["plan"]["classes"] if c != "collectives"]
    lines = ["", "Roofline plan on one H100 (compile-only: cuDNN's attention and our flash kernels counted "
             "by their bytes; bound ms per step by op class):", "",
             "| case | " + " | ".join(classes) + " | bound ms | memory-bound | GB moved | kernels | temp GiB | "
             "bound tokens/s |", "|---" * (len(classes) + 7) + "|"]
    for case, row in done.items():
        total = row["plan"]["total"]
        tokens = row["global_batch"] * row["seq_len"] / row["devices"]
        cells = [f"{row['plan']['classes'][c]['ms']:.2f}" for c in classes] + [
            f"{total['ms']:.2f}", f"{total['memory_bound_ms'] / total['ms']:.0%}", f"{total['gb']:.1f}",
            f"{total['launches']:.0f}", f"{row['memory'].get('temp', 0) / 2**30:.2f}",
            f"{tokens / total['ms'] * 1e3:,.0f}"]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines + failed)


def data_name(case: str) -> str:
    """The prepared directory's name for a case: its config and sequence length (batches share one)."""
    config, overrides, _ = CASES[case]
    seq = next(o.split("=")[1] for o in overrides if o.startswith("data.max_seq_length="))
    return f"{pathlib.Path(config).stem}-{seq}"


def staged_tokenizer(config: str, data_dir: pathlib.Path) -> pathlib.Path:
    """The folder under `data_dir` that holds the config's tokenizer for --train (`stage_tokenizer`)."""
    return data_dir / f"{pathlib.Path(config).stem}-tokenizer"


def stage_tokenizer(config: str, data_dir: pathlib.Path) -> None:
    """Copies the files of the config's packaged tokenizer (BERT's vocab.txt, GPT-2's BPE files) into
    `staged_tokenizer`, which its cases' preparation and training then name: the GPU machine cannot fetch the
    packages they come from."""
    # here, not at the top: on the GPU machine this script runs from the tree, without jaxlm on its path
    from jaxlm.config import load
    from jaxlm.data.tokenizers.load import NAME_IN_A_DIRECTORY, tokenizer_path

    source = tokenizer_path(load(config).data.vocab)
    target = staged_tokenizer(config, data_dir)
    shutil.rmtree(target, ignore_errors=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        target.mkdir(parents=True)
        shutil.copy(source, target / NAME_IN_A_DIRECTORY[source.suffix])


def t5_vocabulary(data_dir: pathlib.Path) -> None:
    """Trains T5_VOCABULARY in `data_dir` unless it is there: a SentencePiece unigram model of T5's size
    (32,028 pieces and 100 sentinels make 32,128) on the demo corpus. T5's own spiece.model is not at hand
    offline, and the step depends on the size alone."""
    # here, not at the top: on the GPU machine this script runs from the tree, without jaxlm on its path
    from jaxlm.corpora.registry import CORPORA

    model = data_dir / T5_VOCABULARY
    if not model.is_file():
        data_dir.mkdir(parents=True, exist_ok=True)
        sentencepiece.SentencePieceTrainer.train(
            input=",".join(str(CORPORA[name].fetch()) for name in ("austen", "wikipedia")),
            model_prefix=str(model.with_suffix("")), vocab_size=32_028, model_type="unigram", pad_id=0, eos_id=1,
            unk_id=2, bos_id=-1, input_sentence_size=2_000_000, shuffle_input_sentence=True, minloglevel=2)


def data_overrides(case: str, data_dir: pathlib.Path) -> list[str]:
    """The case's data settings, for its preparation and its training alike (a run whose settings did not make its
    rows is refused): BERT's sentence pairs made in one pass, and for T5 the vocabulary `t5_vocabulary` trains."""
    config, overrides, _ = CASES[case]
    vocab = [f"data.vocab={data_dir / T5_VOCABULARY if config == T5_CONFIG else staged_tokenizer(config, data_dir)}"]
    one_pass = ["data.dupe_factor=1"] if "bert" in config else []
    return [*(o for o in overrides if o.startswith("data.")), *vocab, *one_pass,
            f"data.prepared_dir={data_dir / data_name(case)}"]


def prepare(cases: list[str], data_dir: pathlib.Path, out_dir: pathlib.Path, env: dict) -> None:
    """Prepares the demo corpus once per data_name of `cases` into `data_dir` (on the CPU, where the corpora
    and tokenizers are at hand), for `--train` on a machine that has neither; exits 1 naming those that failed."""
    failed = []
    for case in dict((data_name(c), c) for c in cases).values():
        if CASES[case][0] == T5_CONFIG:
            t5_vocabulary(data_dir)
        else:
            stage_tokenizer(CASES[case][0], data_dir)
        log = out_dir / f"prepare-{data_name(case)}.log"
        done = run_logged([sys.executable, "-m", "jaxlm.cli", "prepare", CASES[case][0],
                           *data_overrides(case, data_dir)], log, env | {"JAX_PLATFORMS": "cpu"})
        summary = _prepared_summary(done.stdout)
        if done.returncode:
            failed.append(data_name(case))
            summary = f"failed: {_failed(done.stdout, log)['error']}"
        print(f"prepare {data_dir / data_name(case)}: {summary}", flush=True)
    if failed:
        sys.exit(f"gpu.py: preparing {', '.join(failed)} failed: the errors are above")


def _prepared_summary(text: str) -> str:
    """The training split's examples and tokens from `jaxlm prepare`'s closing JSON, or its last line."""
    start = text.rfind("\n{\n")
    try:
        train = json.loads(text[start + 1:])["splits"]["train"]
    except (ValueError, KeyError):
        return _last_line(text)
    return f"{train['examples']:,} training examples, {train['tokens']:,} tokens"


def train_settings(case: str, data_dir: pathlib.Path) -> list[str]:
    """The settings of the case's `--train` run that its train step depends on (`precompile` compiles it with
    them): its data's and its schedule's length."""
    return [*data_overrides(case, data_dir), f"train.steps={TRAIN_STEPS}"]


def train_rate(case: str, extra: list[str], data_dir: pathlib.Path, out_dir: pathlib.Path, env: dict) -> dict:
    """`jaxlm train` of the case on its prepared data for TRAIN_STEPS steps (no checkpoint or evaluation
    between): its tokens/s, the mean of the rates it logged after the first."""
    config, overrides, _ = CASES[case]
    run_dir = out_dir / f"train-{case}"
    shutil.rmtree(run_dir, ignore_errors=True)
    never = 10 * TRAIN_STEPS
    text = run_logged([sys.executable, "-m", "jaxlm.cli", "train", config, *overrides, *extra,
                       *train_settings(case, data_dir), f"train.run_dir={run_dir}",
                       f"train.log_every={TRAIN_LOG_EVERY}", f"train.eval_every={never}",
                       f"train.checkpoint_every={never}", "train.eval_batches=1"],
                      out_dir / f"train-{case}.log", case_env(case, env)).stdout
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    rates = [r["tokens_per_s"] for r in rows if r.get("split") == "train" and "tokens_per_s" in r][1:]
    if not rates:
        return _failed(text, out_dir / f"train-{case}.log")
    return {"tokens_per_s": sum(rates) / len(rates)}


def peer(cases: list[str], script: pathlib.Path, out_dir: pathlib.Path, env: dict) -> tuple[dict, dict]:
    """(the peer's bf16 matmul line, its row per case): it prints the matmul line, then one line per case it
    is given (each of its cases once, however many of ours share it)."""
    theirs = list(dict.fromkeys(CASES[c][2] for c in cases))
    text = run_logged([sys.executable, str(script), *theirs], out_dir / "peer.log", env).stdout
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    if not lines:
        return {}, {c: _failed(text, out_dir / "peer.log") for c in cases}
    rows = dict(zip(theirs, lines[1:]))
    missing = {"error": f"no row from the peer for this case (all of its output in {out_dir / 'peer.log'})"}
    return lines[0], {c: rows.get(CASES[c][2], missing) for c in cases}


def table(cases: list[str], our_rows: dict, peer_rows: dict, matmul: dict) -> str:
    """Markdown: tokens/s of each side, the ratio, and MFU (datasheet peak; measured bf16 matmul peak)."""
    measured = matmul.get("tflops")
    lines = [f"{matmul.get('gpu', 'GPU')}: bf16 matmul peak measured by the peer {measured or 'n/a'} TFLOP/s; "
             f"jaxlm's datasheet peak: {next((r['peak'] for r in our_rows.values() if 'peak' in r), 'n/a')}",
             "",
             "| case | batch | seq | jaxlm step ms | jaxlm tokens/s | peer step ms | peer tokens/s | ratio "
             f"(target {TARGET_RATIO}) | jaxlm MFU datasheet / measured | peer MFU measured | jaxlm compile s / "
             "process s | peer warm-up s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        a, b = our_rows.get(case, {}), peer_rows.get(case, {})
        ratio = a["tokens_per_s"] / b["tokens_per_s"] if "tokens_per_s" in a and "tokens_per_s" in b else None
        our_tflops = a["tokens_per_s"] * a["gflops_per_token"] / 1e3 if "tokens_per_s" in a else None
        cells = [case, a.get("global_batch", b.get("batch", "n/a")), a.get("seq_len", b.get("seq", "n/a")),
                 _number(a.get("step_ms"), ".1f"), _number(a.get("tokens_per_s"), ",.0f"),
                 _number(b.get("step_ms"), ".1f"), _number(b.get("tokens_per_s"), ",.0f"), _number(ratio, ".2f"),
                 f"{_number(a.get('mfu'), '.1%')} / {_number(_share(our_tflops, measured), '.1%')}",
                 _number(_share(b.get("model_tflops"), measured), ".1%"),
                 f"{_number(a.get('compile_s'), '.0f')} / {_number(a.get('process_s'), '.0f')}",
                 _number(b.get("warmup_s"), ".0f")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    errors = [f"{side} {case}: {row['error']}" for side, rows in (("jaxlm", our_rows), ("peer", peer_rows))
              for case, row in rows.items() if "error" in row]
    return "\n".join(lines + errors)


def train_table(cases: list[str], our_rows: dict, train_rows: dict) -> str:
    """Markdown: `jaxlm train`'s tokens/s on prepared data against `jaxlm bench`'s, per case."""
    if not train_rows:
        return ""
    lines = ["", "| case | jaxlm bench tokens/s | jaxlm train tokens/s | train / bench (target 0.95) |",
             "|---|---|---|---|"]
    for case in cases:
        bench, train = our_rows.get(case, {}).get("tokens_per_s"), train_rows.get(case, {}).get("tokens_per_s")
        ratio = train / bench if bench and train else None
        lines.append(f"| {case} | {_number(bench, ',.0f')} | {_number(train, ',.0f')} | {_number(ratio, '.3f')} |")
    errors = [f"jaxlm train {case}: {row['error']}" for case, row in train_rows.items() if "error" in row]
    return "\n".join(lines + errors)


def profile_table(cases: list[str], our_rows: dict) -> str:
    """Markdown: jaxlm's milliseconds per step of each op class, per case."""
    rows = {c: our_rows[c]["profile"] for c in cases if "profile" in our_rows.get(c, {})}
    failed = [f"jaxlm {c} profile: {our_rows[c]['profile_error']}" for c in cases
              if "profile_error" in our_rows.get(c, {})]
    if not rows:
        return "\n".join(failed)
    classes = list(next(iter(rows.values()))["ms_per_step"])
    lines = ["| case | " + " | ".join(classes) + " | traced ms/step |", "|---" * (len(classes) + 2) + "|"]
    for case, summary in rows.items():
        bounds = summary.get("bound_ms_per_step", {})
        kernels = summary.get("kernels_per_step", {})
        cells = [f"{summary['ms_per_step'][c]:.2f}" + (f" ({bounds[c]:.2f})" if c in bounds else "")
                 + (f" [{kernels[c]:.0f}]" if c in kernels else "") for c in classes]
        lines.append(f"| {case} | " + " | ".join(cells + [f"{summary['traced_ms_per_step']:.2f}"]) + " |")
    costliest = [f"{case}: " + "; ".join(map(op_line, summary["top_ops"][:5]))
                 for case, summary in rows.items() if summary.get("top_ops")]
    return "\n".join(["", "jaxlm, milliseconds per step by op class (jax.profiler trace of 5 steps; in brackets the "
                       "roofline bound of the same compiled step, jaxlm/train/hlo_cost.py, and the kernels launched "
                       "per step):", ""] + lines + ["", "costliest ops, ms per step in launches per step:"]
                      + costliest + failed)


def failed_cases(cases: list[str], *row_sets: dict) -> list[str]:
    """The cases with an error in any of `row_sets` (ours, the peer's, `jaxlm train`'s)."""
    return [c for c in cases if any("error" in rows.get(c, {}) for rows in row_sets)]


def _failed(text: str, log: pathlib.Path) -> dict:
    """A row that says why a process gave no result: its last line, and where the rest is."""
    return {"error": f"{_last_line(text)} (all of it in {log})"}


def _last_line(text: str) -> str:
    return next((line for line in reversed(text.splitlines()) if line.strip()), "no output")


def _share(part, whole):
    return part / whole if part is not None and whole else None


def _number(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", help=f"the peer's script (default {DEFAULT_PEER}); 'none' runs jaxlm alone")
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every jaxlm case (e.g. bench.steps=50)")
    parser.add_argument("--profile", action="store_true",
                        help="also trace each jaxlm case and print its time per step by op class")
    parser.add_argument("--train", metavar="DIR", help="also run `jaxlm train` of each case on its data "
                        "prepared under DIR, and compare its tokens/s with the bench's")
    parser.add_argument("--prepare", metavar="DIR", help="only prepare the cases' data under DIR for --train "
                        "(on the CPU; the GPU machine has neither the corpora nor the tokenizers)")
    parser.add_argument("--plan", action="store_true", help="no GPU: compile each case for a compile-only H100 "
                        "and print its roofline plan by op class (needs JAX's CUDA plugin; no peer)")
    parser.add_argument("--compile-jobs", type=int, metavar="N",
                        help="compile the jaxlm cases N at a time before anything is timed, into the compilation "
                        f"cache their timed runs read (0: each case compiles in its own timed process; default "
                        f"{DEFAULT_COMPILE_JOBS})")
    parser.add_argument("--out", default=str(ROOT / ".bench-gpu"), help="logs and the compilation cache")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases: unknown {unknown or 'none given'}; choose from {', '.join(CASES)}")
    if conflict := mode_conflict(args):
        parser.error(conflict)
    peer_script = args.peer or str(DEFAULT_PEER)
    compile_jobs = DEFAULT_COMPILE_JOBS if args.compile_jobs is None else args.compile_jobs
    if not (args.plan or args.prepare) and peer_script != "none" and not pathlib.Path(peer_script).is_file():
        parser.error(f"--peer {peer_script}: no such file; give the path of peers_torch.py, or --peer none")
    if compile_jobs < 0:
        parser.error(f"--compile-jobs {compile_jobs}: give 0 (no compiling ahead) or more processes")
    bad = [s for s in args.set if "=" not in s]
    if bad:
        parser.error(f"--set {bad[0]!r}: give KEY=VALUE")
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    # every compilation cached, the state initialisers' short ones too
    env = os.environ | {"JAX_COMPILATION_CACHE_DIR": os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                                                    str(out_dir / "jax-cache")),
                        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    if args.prepare:
        return prepare(cases, pathlib.Path(args.prepare), out_dir, env)
    if args.plan:
        rows = {}
        for case in cases:
            rows[case] = plan(case, args.set, out_dir, env)
            print(f"plan {case}: {'error' if 'error' in rows[case] else 'done'}", flush=True)
        print(plan_table(cases, rows))
        return _exit_if_failed(cases, [c for c in cases if "plan" not in rows[c]])
    train_dir = pathlib.Path(args.train) if args.train else None
    missing = [data_name(c) for c in cases if train_dir and not (train_dir / data_name(c)).is_dir()]
    if missing:
        parser.error(f"--train {args.train}: no prepared {', '.join(dict.fromkeys(missing))} there; make them "
                     f"with --prepare {args.train}")
    if compile_jobs > 0:
        started = time.perf_counter()
        compiled = precompile(cases, args.set, out_dir, env, compile_jobs, train_dir)
        print(f"compiled {len(compiled)} steps, {compile_jobs} at a time: {time.perf_counter() - started:.0f} s; "
              + ", ".join(f"{c} {_number(r.get('compile_s'), '.0f')} s" if "error" not in r else f"{c}: {r['error']}"
                          for c, r in compiled.items()), flush=True)
    matmul, peer_rows = {}, {}
    if peer_script != "none":
        started = time.perf_counter()
        matmul, peer_rows = peer(cases, pathlib.Path(peer_script), out_dir, env)
        print(f"peer: {time.perf_counter() - started:.0f} s", flush=True)
        for case in cases:
            print(f"peer {case}: {json.dumps(peer_rows.get(case))}", flush=True)
    our_rows, train_rows = {}, {}
    for case in cases:
        our_rows[case] = ours(case, args.set, out_dir, env, args.profile)
        print(f"jaxlm {case}: {json.dumps({k: v for k, v in our_rows[case].items() if k != 'profile'})}", flush=True)
        if train_dir:
            train_rows[case] = train_rate(case, args.set, train_dir, out_dir, env)
            print(f"jaxlm train {case}: {json.dumps(train_rows[case])}", flush=True)
    print(table(cases, our_rows, peer_rows, matmul))
    print(train_table(cases, our_rows, train_rows))
    print(profile_table(cases, our_rows))
    _exit_if_failed(cases, failed_cases(cases, our_rows, peer_rows, train_rows))


def mode_conflict(args: argparse.Namespace) -> str | None:
    """Why the options given cannot go together, or None: --prepare and --plan each read only --cases, --out
    (and --plan --set), and the other options would be silently ignored."""
    if args.plan and args.prepare:
        return "--plan and --prepare are separate runs: give one of them"
    mode, reads = ("--plan", "compiles each case for an H100 here") if args.plan else (
        "--prepare", "only prepares the cases' data")
    ignored = {"--train": args.train, "--profile": args.profile, "--peer": args.peer not in (None, "none"),
               "--compile-jobs": args.compile_jobs is not None, "--set": args.prepare and args.set}
    given = [option for option, value in ignored.items() if value]
    if (args.plan or args.prepare) and given:
        return f"{mode} {reads} and ignores {given[0]}: drop {given[0]}, or leave out {mode}"
    return None


def _exit_if_failed(cases: list[str], failed: list[str]) -> None:
    if failed:
        sys.exit(f"gpu.py: {len(failed)} of {len(cases)} cases failed ({', '.join(failed)}): their errors are above")


if __name__ == "__main__":
    main()
