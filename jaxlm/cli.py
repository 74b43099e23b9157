"""The `jaxlm` command line: parses arguments, loads the config, calls the library."""
from __future__ import annotations

if __name__ == "__main__":  # `python -m jaxlm.cli`: started as the `jaxlm` program is, before jax is imported
    from jaxlm import entry, host_memory
    host_memory.restart_with_huge_pages(module="jaxlm.cli")
    entry.skip_absent_tpu()

import argparse
import atexit
import json
import os
import pathlib
import shlex
import signal
import sys
import traceback

import jax
import numpy as np
from absl import logging

from jaxlm import config as config_lib
from jaxlm import generate, interrupts
from jaxlm.config import ConfigError
from jaxlm.convert import registry, store
from jaxlm.convert.names import flatten
from jaxlm.corpora.models import PACKAGED_GGUF, PACKAGED_MODELS, local_or_packaged
from jaxlm.corpora.text import check_writable, file_in_the_way
from jaxlm.data.bench import bench_data, bench_split, format_data_table, median_rows
from jaxlm.data.pipeline import check_workers, open_splits
from jaxlm.data.prepare import already_prepared, prepare, preparation_settings
from jaxlm.data.sources import model_tokenizer, resolve_corpus
from jaxlm.data.tokenized import TokenizationFailed
from jaxlm.data.tokenizers import tokenize_cli, trainer_cli
from jaxlm.errors import os_error_line
from jaxlm.eval import sweep
from jaxlm.parallel import distributed
from jaxlm.sentence_embedding import embed_file
from jaxlm.train import aot, checkpoint, compile_cache, hlo_cost
from jaxlm.train.bench import bench, compile_only, format_table
from jaxlm.train.profile import PROFILED_STEPS, format_profile
from jaxlm.train.state import state_bytes
from jaxlm.train.faults import StoppedEarly, TrainingStopped, stop_status
from jaxlm.train.preflight import preflight
from jaxlm.train.loop import build_within_memory, report, train
from jaxlm.train.storage import missing_dirs, remove_if_empty


def _load(args) -> config_lib.RunConfig:
    return _loaded(args, args.config, args.overrides)


def _loaded(args, path, overrides) -> config_lib.RunConfig:
    """The pretraining config, with a note on stderr for each data setting given that its family's objective ignores,
    and for a masked LM's slots that cap its mask rate."""
    config = config_lib.load(path, overrides)
    if config.finetune.task:  # its pretraining sections (the defaults) would have been prepared, trained, timed
        raise ConfigError(f"{path} is a fine-tuning config (finetune.task={config.finetune.task}), and `jaxlm "
                          f"{getattr(args, 'label', args.command)}` takes a pretraining config (configs/*.yaml); "
                          "give it to `jaxlm finetune`, which reads its labelled files itself")
    for note in config_lib.unread_settings(path, overrides, config) + config_lib.capped_masking(config):
        print(f"jaxlm {getattr(args, 'label', args.command)}: note: {note}", file=sys.stderr)
    return config


def cmd_prepare(args) -> None:
    config = _load(args)
    data, family = config.data, config.model.family
    tokenizer = model_tokenizer(config)
    inputs = resolve_corpus(data.corpus)
    if not args.overwrite and already_prepared(data.prepared_dir,
                                               preparation_settings(inputs, tokenizer, family, data)):
        print(f"{data.prepared_dir} is already prepared for this config and tokenizer "
              "(pass --overwrite to rebuild it)")
        return
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give 1 or more Beam worker processes")
    if args.runner is None and (args.workers > 1 or args.beam_args):
        raise ConfigError("--workers and --beam-args need a Beam runner: add --runner direct (or another runner)")
    try:
        beam_args = shlex.split(args.beam_args or "")
    except ValueError as err:  # shlex's "No closing quotation"
        raise ConfigError(f"--beam-args {args.beam_args!r}: {err}; quote it as a shell would") from None
    if args.runner and args.runner.lower() in ("direct", "directrunner"):
        check_workers(args.workers, "--workers ", "Beam worker processes", zero="")
        # Beam takes seconds to import: only a Beam preparation loads it
        from jaxlm.data.beam import direct_workers
        beam_args += direct_workers(args.workers)
    elif args.runner and args.workers > 1:
        raise ConfigError(f"--workers sets the direct runner's processes, and --runner {args.runner} would ignore it: "
                          "give that runner's own worker options in --beam-args (Dataflow: --beam-args=--num_workers=4)")
    manifest = prepare(inputs, data.prepared_dir, tokenizer, family=family, data=data, overwrite=args.overwrite,
                       runner=args.runner, beam_args=beam_args)
    counts = {split: {k: v for k, v in info.items() if k != "shards"} for split, info in manifest["splits"].items()}
    print(json.dumps({"prepared_dir": data.prepared_dir, "family": manifest["family"], "splits": counts}, indent=2))


def cmd_train(args) -> None:
    config = _load(args)
    compile_cache.enable(config.train)
    final = train(config)
    if final.get("stopped"):
        raise StoppedEarly(stop_status(final["stopped"]))
    if jax.process_index() == 0 and final.get("examples"):
        print(report(config, final))


def cmd_preflight(args) -> None:
    config = _load(args)
    distributed.initialize(config.distributed)
    made = missing_dirs(config.train.run_dir)  # before any process makes them: preflight starts at a barrier
    try:
        lines, _ = preflight(config)
        setup = build_within_memory(config)
    finally:
        if jax.process_index() == 0:  # a mistyped run_dir leaves nothing behind
            remove_if_empty(made)
    lines.append(f"train state: {state_bytes(setup.abstract) / 2**20:,.1f} MiB per device under mesh.rules="
                 f"{config.mesh.rules}, which divide every parameter's dimensions")
    if jax.process_index() == 0:
        print("\n".join(["preflight passed:", *(f"  {line}" for line in lines)]))


def cmd_data_show(args) -> None:
    if args.n < 1:
        raise ConfigError(f"--n {args.n}: give the number of examples to print, 1 or more")
    config = _load(args)
    tokenizer, train_data, valid = open_splits(config)  # examples, not batches: a split of any size
    data = valid if args.split == "valid" else train_data
    for record in data.show(args.n, tokenizer):
        print(json.dumps(record))


# `jaxlm bench data`'s options and defaults: the parser leaves them None, so the train step's bench can refuse them
BENCH_DATA_DEFAULTS = {"batches": 20, "workers": None, "repeat": 1}


def _refuse_other_mode(args, options, why: str) -> None:
    """Stops on the first of `options` given: it belongs to the other mode of `jaxlm bench`, which this one ignores."""
    # not `in (None, False)`: a --batches 0 given equals False
    given = [f"--{name.replace('_', '-')}" for name in options
             if getattr(args, name) is not None and getattr(args, name) is not False]
    if given:
        raise ConfigError(f"{given[0]} {why}")


def cmd_bench(args) -> None:
    if args.config == "data":
        args.label = "bench data"  # what its errors and notes are said by
        return cmd_bench_data(args)
    _refuse_other_mode(args, BENCH_DATA_DEFAULTS, "is an option of `jaxlm bench data` (the input pipeline), not of "
                       "the train step's bench: drop it, or put data before the config")
    if args.profile is not None and not args.profile.strip():
        raise ConfigError("--profile is empty; give a directory for the trace")
    if args.profile:
        blocked = file_in_the_way(args.profile)
        if blocked is not None:
            raise ConfigError(f"--profile {args.profile}: {blocked} is a file; give a directory for the trace")
        check_writable(args.profile, f"--profile {args.profile}")
    if args.compile_only and args.profile:
        raise ConfigError("--compile-only times nothing, so there is nothing to profile: drop --profile or "
                          "--compile-only")
    config = _load(args)
    if args.compile_only:
        return _print_compiled(compile_only(config), args.json)
    row = bench(config, profile_dir=args.profile)
    if jax.process_index() == 0:
        print(format_table([row]))
        if "profile" in row:
            print(f"profile of {PROFILED_STEPS} steps (trace in {args.profile}):\n{format_profile(row['profile'])}")
        elif args.profile:
            print(f"profile: none, the trace could not be summarised ({row['profile_error']})")
        if args.json:
            print(json.dumps(row))


def _print_compiled(row: dict, as_json: bool) -> None:
    if jax.process_index() == 0:
        cache = f"into the compilation cache {row['cache']}" if row["cache"] else (
            "with no compilation cache to keep it (set JAX_COMPILATION_CACHE_DIR)")
        print(f"compiled in {row['compile_s']:.1f} s ({row['seconds']['setup']:.1f} s to set up) {cache}")
        if as_json:
            print(json.dumps(row))


def _whole_numbers(text: str, option: str) -> list[int]:
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        numbers = [-1]
    if min(numbers) < 0:
        raise ConfigError(f"{option} {text!r}: give whole numbers separated by commas, e.g. 0,1,2")
    return numbers


def cmd_bench_data(args) -> None:
    """`jaxlm bench data CONFIG [CONFIG ...] [overrides]`: one row per config."""
    _refuse_other_mode(args, ("profile", "compile_only"), "is an option of the train step's bench (jaxlm bench "
                       "CONFIG), not of `jaxlm bench data`: drop it")
    for name, default in BENCH_DATA_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    paths = [a for a in args.overrides if "=" not in a]
    overrides = [a for a in args.overrides if "=" in a]
    if not paths:
        raise ConfigError("jaxlm bench data needs at least one config, e.g. jaxlm bench data configs/bert-tiny.yaml")
    workers = [None] if args.workers is None else _whole_numbers(args.workers, "--workers")
    if args.workers is not None:
        check_workers(max(workers), "--workers ")
    if args.repeat < 1:
        raise ConfigError(f"--repeat {args.repeat}: give 1 or more runs of each setting")
    if args.batches < 1:
        raise ConfigError(f"--batches {args.batches}: give 1 or more batches to time")
    configs = {path: _loaded(args, path, overrides) for path in paths}
    splits = {path: bench_split(configs[path]) for path in paths}  # every config's data, before any is timed
    stems = [pathlib.Path(path).stem for path in paths]
    names = dict(zip(paths, stems if len(set(stems)) == len(stems) else paths))  # rows are grouped by name
    runs = [{"config": names[path]} | bench_data(configs[path], args.batches, workers=count, train=splits[path])
            for _ in range(args.repeat) for path in paths for count in workers]
    rows = median_rows(runs)
    print(format_data_table(rows))
    if args.json:
        for row in rows:
            print(json.dumps(row))


def _quiet_orbax() -> None:
    """Orbax warns through absl about read-only managers and metadata it does not need; keep errors."""
    logging.set_verbosity(logging.ERROR)


def cmd_convert_from_hf(args) -> None:
    _quiet_orbax()
    source = local_or_packaged(args.hf_dir, PACKAGED_MODELS)
    out = store.check_output(args.out, args.overwrite, source)
    store.check_tokenizer_files(source)
    config, params = registry.from_hf(source, scan_layers=args.scan_layers, vocab_multiple=args.vocab_multiple,
                                      dtype=args.dtype)
    store.save_converted(out, config, params, tokenizer_dir=source, source=f"hf:{source.resolve()}",
                         overwrite=args.overwrite)
    _print_converted(out, config, params)


def cmd_convert_from_gguf(args) -> None:
    _quiet_orbax()
    source = local_or_packaged(args.gguf, PACKAGED_GGUF)
    out = store.check_output(args.out, args.overwrite, source)
    config, params, tokenizer_files = registry.from_gguf(source, scan_layers=args.scan_layers,
                                                         vocab_multiple=args.vocab_multiple, dtype=args.dtype)
    store.save_converted(out, config, params, tokenizer_files=tokenizer_files, source=f"gguf:{source.resolve()}",
                         overwrite=args.overwrite)
    _print_converted(out, config, params)


def _print_converted(out, config, params) -> None:
    count = sum(int(np.size(v)) for _, v in flatten(params))
    layout = "scan (stacked layers)" if config.scan_layers else "loop"
    print(f"converted a {config.family} model ({count / 1e6:.2f}M parameters, {layout} layout, "
          f"dtype {config.dtype}) to {out}")


def cmd_convert_to_hf(args) -> None:
    _quiet_orbax()
    registry.family_of(store.checkpoint_config(args.ckpt)[0])
    out = store.check_output(args.out, args.overwrite, args.ckpt, kept_out_of=checkpoint.resolve(args.ckpt)[0])
    config, params, tokenizer = store.load_checkpoint(args.ckpt)
    try:
        auto_class = store.save_hf(out, config, params, tokenizer, overwrite=args.overwrite)
    except ValueError as err:
        task = store.finetuned_for(args.ckpt)
        if not task:
            raise
        raise ValueError(f"{args.ckpt} was fine-tuned for {task}, a head the Hugging Face pretraining model does not "
                         f"hold ({err}); export the checkpoint it was fine-tuned from (its finetune.init_from)"
                         ) from None
    print(f"wrote a Hugging Face {config.family} model to {out}; load it with "
          f"transformers.{auto_class}.from_pretrained({str(out)!r})")


def cmd_embed(args) -> None:
    _quiet_orbax()
    vectors, output = embed_file(args.ckpt, args.input, args.output, pooling=args.pooling, normalize=args.normalize,
                                 batch_size=args.batch_size, max_length=args.max_length, overwrite=args.overwrite)
    print(f"embedded {len(vectors)} sentences: shape {vectors.shape} {vectors.dtype} -> {output}")


def cmd_generate(args) -> None:
    _quiet_orbax()
    prompts = list(args.prompt) if args.prompt is not None else generate.read_prompts(args.input)
    for line in generate.generate_from_checkpoint(
            args.checkpoint, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, num_beams=args.num_beams, seed=args.seed):
        print(json.dumps(line), flush=True)


def cmd_eval(args) -> None:
    _quiet_orbax()
    paths = [a for a in args.inputs if "=" not in a]
    overrides = [a for a in args.inputs if "=" in a]
    extra = config_lib.parse_overrides(overrides).get("distributed") or {}
    watching = [f"--{name.replace('_', '-')}" for name in ("poll", "idle_timeout") if getattr(args, name) is not None]
    if watching and not args.watch:  # was ignored, silently
        raise ConfigError(f"{watching[0]} is read by --watch alone, which this evaluation does not use: add --watch "
                          f"or remove {watching[0]}")
    idle_timeout = sweep.IDLE_TIMEOUT if args.idle_timeout is None else args.idle_timeout
    poll = sweep.POLL if args.poll is None else args.poll
    distributed.initialize(config_lib.section(config_lib.DistributedConfig, extra, "distributed"))
    plan = sweep.plan(paths, args.tasks or ["heldout"], args.select, args.out, overrides, args.batch_size,
                      args.encoder_input, args.watch, idle_timeout, poll)
    progress = sweep.run(plan, watch=args.watch, idle_timeout=idle_timeout, poll=poll)
    if jax.process_index() != 0:
        return
    print(sweep.summary(progress))
    if not (plan.out / "results.jsonl").is_file():
        if progress.errors:
            raise ValueError(f"no checkpoint could be evaluated ({len(progress.errors)} skipped, the first: "
                             f"{progress.errors[0]}); pick steps whose checkpoints restore (--select)")
        return
    print(f"results: {plan.out / 'results.jsonl'}, {plan.out / 'results.csv'}, {plan.out / 'curves.png'}")


def cmd_finetune(args) -> None:
    _quiet_orbax()
    from jaxlm.finetune import run  # its imports (seqeval, the tasks) only this command needs

    extra = config_lib.parse_overrides(args.overrides)
    tree = config_lib.merge(config_lib.load_tree(args.config), extra)
    distributed.initialize(config_lib.section(config_lib.DistributedConfig, tree.get("distributed") or {},
                                              "distributed"))
    config, source = run.load(args.config, args.overrides)
    summary = run.finetune(config, source)
    if jax.process_index() == 0:
        print(run.format_summary(summary, config.train.run_dir))


def cmd_predict(args) -> None:
    _quiet_orbax()
    from jaxlm.finetune.predict import predict  # as cmd_finetune's: only this command needs it

    lines = predict(args.checkpoint, args.input, args.output, args.batch_size, args.overwrite, args.overrides)
    if jax.process_index() == 0:
        print(f"{lines} predictions written to {args.output}")


def cmd_compile(args) -> None:
    if "JAX_PLATFORMS" not in os.environ:
        # The compile needs no accelerator runtime (the TPU devices are compile-only); don't probe for one.
        try:
            jax.config.update("jax_platforms", "cpu")
        except RuntimeError:  # backends already started in this process: keep them
            pass
    config = _load(args)
    result = aot.compile_for_topology(config, args.topology,
                                      chips_per_host_bounds=aot.parse_bounds(args.chips_per_host),
                                      num_slices=args.num_slices, plan=args.plan)
    line = aot.summary(result)
    print(line)
    if "plan" in result:
        print(hlo_cost.format_plan(result["plan"], result["model_gflop"]))
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "compiled"}))
    if "does NOT fit" in line:
        raise SystemExit(1)


class _Parser(argparse.ArgumentParser):
    """argparse taking options only by their full names (`--over` is not `--overwrite`), in every subcommand:
    a new option must not change what an old command line means. Its errors are one line, which names the
    command's --help in place of argparse's usage block."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` shows how to call it)\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="jaxlm", description="Pretrain language models in JAX on a device mesh.")
    commands = top.add_subparsers(dest="command", required=True)

    def command(parent, name, handler, text):
        sub = parent.add_parser(name, help=text, description=text)
        sub.add_argument("config", help="a YAML file in configs/, e.g. configs/bert-tiny.yaml")
        sub.add_argument("overrides", nargs="*", default=[], help="dotted overrides such as train.steps=100")
        sub.set_defaults(handler=handler)
        return sub

    prep = command(commands, "prepare", cmd_prepare, "text -> tokenized, pair-built examples in ArrayRecord shards")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing prepared directory")
    prep.add_argument("--runner", help="tokenize with an Apache Beam pipeline on this runner: direct (this machine, "
                      "--workers processes), or dataflow, flink, spark with their options in --beam-args")
    prep.add_argument("--workers", type=int, default=1, help="worker processes of the direct runner (default 1)")
    prep.add_argument("--beam-args", help="the runner's own options, e.g. \"--project=P --region=R "
                      "--temp_location=gs://B/tmp\" for Dataflow")
    command(commands, "train", cmd_train, "train, or resume the run in train.run_dir")
    command(commands, "preflight", cmd_preflight, "the checks `train` makes on every process before any compute: "
            "mesh, batch, the same config and data everywhere, prepared data that fits the run, a shared run "
            "directory, parameters the mesh splits evenly and a train state the devices can hold")
    bench = command(commands, "bench", cmd_bench, "time the compiled train step: tokens/s and MFU; "
                    "`jaxlm bench data CONFIG [CONFIG ...]`: the input pipeline's examples/s per core")
    bench.add_argument("--json", action="store_true", help="also print the row(s) as JSON")
    bench.add_argument("--profile", metavar="DIR", help="also trace a few steps with jax.profiler into DIR and "
                       "print the time per step by op class (matmuls, attention, norms, loss, optimizer, gaps)")
    bench.add_argument("--compile-only", action="store_true", help="compile the step (and initialise the state) "
                       "and time nothing: with JAX_COMPILATION_CACHE_DIR set, a later bench of the same config loads "
                       "both from there")
    bench.add_argument("--batches", type=int, help="bench data: batches of 256 timed per config (default "
                       f"{BENCH_DATA_DEFAULTS['batches']})")
    bench.add_argument("--workers", help="bench data: time the trainer's loader with these grain worker counts, "
                       "e.g. 0,1,2 (default: the transform in one thread, per core)")
    bench.add_argument("--repeat", type=int, help="bench data: time each setting this many times, the "
                       "settings taken in turn, and give the median (and the range) of each: a shared machine's "
                       f"speed drifts between runs (default {BENCH_DATA_DEFAULTS['repeat']})")
    data = commands.add_parser("data", help="inspect the data").add_subparsers(dest="data_command", required=True)
    show = command(data, "show", cmd_data_show, "print examples exactly as the model receives them (JSON lines)")
    show.set_defaults(label="data show")
    show.add_argument("--n", type=int, default=4, help="how many examples")
    show.add_argument("--split", choices=("train", "valid"), default="train")

    convert = commands.add_parser("convert", help="convert checkpoints to and from other formats")
    formats = convert.add_subparsers(dest="convert_command", required=True)

    def conversion(name, handler, text, source, source_help):
        sub = formats.add_parser(name, help=text, description=text)
        sub.add_argument(source, help=source_help)
        sub.add_argument("out", help="output directory (created; must be empty unless --overwrite)")
        sub.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
        sub.set_defaults(handler=handler, label=f"convert {name}")
        return sub

    for name, handler, text, source, source_help in (
            ("from-hf", cmd_convert_from_hf, "a Hugging Face model directory -> a jaxlm checkpoint", "hf_dir",
             "directory with config.json and model.safetensors (or pytorch_model.bin), or all-MiniLM-L6-v2 "
             "(fetched)"),
            ("from-gguf", cmd_convert_from_gguf, "a llama.cpp GGUF file -> a jaxlm checkpoint", "gguf",
             "a Llama-architecture .gguf file, or SmolLM2-135M-Instruct (fetched)")):
        sub = conversion(name, handler, text, source, source_help)
        sub.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                         help="compute dtype recorded in the model config (parameters stay float32)")
        sub.add_argument("--scan-layers", action="store_true",
                         help="store the layers stacked for model.scan_layers=true")
        sub.add_argument("--vocab-multiple", type=int, default=1, metavar="N",
                         help="pad the token tables to a multiple of N rows (model.vocab_multiple), e.g. 128 so a "
                              "tensor-parallel mesh splits GPT-2's 50,257")
    conversion("to-hf", cmd_convert_to_hf, "a jaxlm checkpoint (converted or a run) -> a Hugging Face directory",
               "ckpt", "a directory from `jaxlm convert from-hf` or a training run directory")

    emb = commands.add_parser("embed", help="sentence embeddings from an encoder checkpoint",
                              description="one embedding per input line, written as a float32 .npy [lines, hidden]")
    emb.add_argument("ckpt", help="an encoder checkpoint: converted (jaxlm convert from-hf) or a run directory")
    emb.add_argument("--input", required=True, help="text file, one sentence per line (blank lines are an error)")
    emb.add_argument("--output", help="where to write the .npy (default: the input path with .npy)")
    emb.add_argument("--pooling", choices=("mean", "cls"), default="mean",
                     help="mean over real tokens, or the first ([CLS]) token's state")
    emb.add_argument("--normalize", action="store_true", help="L2-normalise each embedding")
    emb.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    emb.add_argument("--max-length", type=int, default=None,
                     help="tokens per sentence, special tokens included (default 256, at most the positions)")
    emb.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    emb.set_defaults(handler=cmd_embed)

    gen = commands.add_parser("generate", help="generate text from a checkpoint: one JSON line per prompt",
                              description="generate text from a checkpoint: one JSON line per prompt")
    gen.add_argument("checkpoint", help="a converted checkpoint (jaxlm convert) or a run directory")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", nargs="+", metavar="TEXT", help="one or more prompts")
    source.add_argument("--input", metavar="FILE", help="a text file with one prompt per line")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0 keeps every token")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--num-beams", type=int, default=1, help="beam search when above 1 (temperature 0)")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(handler=cmd_generate)

    text = ("evaluate checkpoints of runs and converted models: held-out metrics, perplexity of a text file, "
            "multiple choice, a fine-tuning task's downstream metrics; one row per run and step")
    ev = commands.add_parser("eval", help=text, description=text)
    ev.add_argument("inputs", nargs="+", metavar="RUN_OR_CKPT",
                    help="run directories, checkpoints/<step> directories or converted checkpoints; then "
                         "key=value overrides (mesh, train.global_batch, train.eval_batches, model.attention_kernel, "
                         "data.prepared_dir, ...)")
    ev.add_argument("--select", default="all", help="all, latest, every:N or steps:A,B,... (default all)")
    ev.add_argument("--tasks", action="append", metavar="TASKS",
                    help="comma-separated: heldout, ppl:FILE, choice:FILE.json[@K] or choice:NAME[@K] "
                         "(arc_easy, openbookqa, ...), finetune:CONFIG (a finetune config's task, fine-tuned "
                         "from each checkpoint) (default heldout)")
    ev.add_argument("--out", default="eval", help="output directory, never inside a run (default eval/)")
    ev.add_argument("--watch", action="store_true", help="keep evaluating new checkpoints until the run's final step")
    ev.add_argument("--idle-timeout", type=float,  # None: not given, which the check of its use needs to see
                    help=f"with --watch: stop after this many seconds without a new checkpoint (default "
                         f"{sweep.IDLE_TIMEOUT:g})")
    ev.add_argument("--poll", type=float, help=f"with --watch: seconds between looks (default {sweep.POLL:g})")
    ev.add_argument("--batch-size", type=int, default=32, help="ppl/choice: rows per batch (default 32)")
    ev.add_argument("--encoder-input", default="",
                    help="ppl on an encoder-decoder: the input each line is the target of (default empty)")
    ev.set_defaults(handler=cmd_eval)

    command(commands, "finetune", cmd_finetune,
            "fine-tune a head on a pretrained checkpoint (finetune section): dev metric every epoch (or "
            "finetune.evals_per_epoch times), best checkpoint kept, test metric at the end")
    text = "a fine-tuned checkpoint's predictions for a file of records: one JSON line per record"
    pred = commands.add_parser("predict", help=text, description=text)
    pred.add_argument("checkpoint", help="a fine-tune's run directory or one of its checkpoints/<step> directories")
    pred.add_argument("overrides", nargs="*", default=[],
                      help="mesh.* and model.* overrides (how it runs, not its shapes), and the finetune settings "
                           "of how records are read (fields, max_length, doc_stride, num_beams, ...)")
    pred.add_argument("--input", required=True, help="JSONL, CSV or TSV file (or tfds:..., NAME:SPLIT) with the "
                                                     "task's input fields")
    pred.add_argument("--output", required=True, help="the JSONL file to write")
    pred.add_argument("--batch-size", type=int, default=32)
    pred.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    pred.set_defaults(handler=cmd_predict)

    text = ("compile the train step for a TPU topology or H100 GPUs (none needed) and print its memory per device; "
            "--plan: its kernels' FLOPs, bytes and roofline time by op class")
    comp = command(commands, "compile", cmd_compile, text)
    comp.add_argument("--topology", default=aot.DEFAULT_TOPOLOGY,
                      help="TPU topology name, e.g. v5e:2x2, v5e:4x4, v5p:2x2x1, or GPUs: h100, h100:8, h100:2x8 "
                           f"(default {aot.DEFAULT_TOPOLOGY})")
    comp.add_argument("--chips-per-host", default=None, help="chips per host bounds, e.g. 2x2x1 (default: libtpu's)")
    comp.add_argument("--num-slices", type=int, default=1, help="number of slices (default 1)")
    comp.add_argument("--plan", action="store_true", help="also print the roofline plan of one device's step "
                                                          "(jaxlm/train/hlo_cost.py)")
    comp.add_argument("--json", action="store_true", help="also print the numbers as JSON")
    tokenize_cli.add_parser(commands)
    trainer_cli.add_parser(commands)
    return top


def _chosen_command(top: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost (sub)command's parser that `args` went through; argparse's own parse_args reports an
    unknown option with the top-level usage, not the usage of the command it was given to."""
    chosen = top
    while True:
        subcommands = next((a for a in chosen._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, subcommands.dest, None) if subcommands else None
        if name not in getattr(subcommands, "choices", {}):
            return chosen
        chosen = subcommands.choices[name]


PRINTING = ("tokenize", "data", "generate")  # the commands whose product is what they print


def main(argv: list[str] | None = None) -> int:
    top = parser()
    args, unknown = top.parse_known_args(argv)
    # key=value overrides after an option: argparse takes a command's positionals in one run, and leaves these over
    positionals = next((name for name in ("overrides", "inputs") if isinstance(getattr(args, name, None), list)), None)
    late = [token for token in unknown if "=" in token and not token.startswith("-")] if positionals else []
    if late:
        setattr(args, positionals, [*getattr(args, positionals), *late])
        unknown = [token for token in unknown if token not in late]
    if unknown:
        _chosen_command(top, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if sys.stdout is None and args.command in PRINTING:  # started with stdout closed (>&-): its output went nowhere
        print(f"jaxlm {args.command}: error: standard output is closed; give the command somewhere to print (a file "
              "or a pipe)", file=sys.stderr or sys.__stderr__)
        return 2
    checkpoint.quiet_failed_writes()
    try:
        compile_cache.check_users_cache()
        with interrupts.sigterm_raises():
            args.handler(args)
    except BrokenPipeError:  # the reader of our output closed it (`jaxlm tokenize ... | head`): stop as a filter does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 128 + signal.SIGPIPE
    except (ConfigError, OSError, ValueError) as err:
        said = os_error_line(err) if isinstance(err, OSError) else err
        print(f"jaxlm {getattr(args, 'label', args.command)}: error: {said}", file=sys.stderr)
        return 2
    except TokenizationFailed as err:
        print(f"jaxlm {getattr(args, 'label', args.command)}: error: {err}", file=sys.stderr)
        return 1
    except StoppedEarly as stop:  # the loop said where it stopped and what resumes it
        return stop.status
    except TrainingStopped as err:
        print(f"jaxlm {getattr(args, 'label', args.command)}: stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as stop:
        again = " (the same command continues where this one stopped)" if args.command == "prepare" else ""
        terminated = isinstance(stop, interrupts.Terminated)
        print(f"jaxlm {getattr(args, 'label', args.command)}: {'stopped by SIGTERM' if terminated else 'interrupted'}"
              f"{again}", file=sys.stderr)
        status = 128 + signal.SIGTERM if terminated else 130
        if argv is None and interrupted_in_compilation(stop):  # the program's own process, not a caller's
            exit_before_teardown(status)
        return status
    return 0


def interrupted_in_compilation(stop: BaseException) -> bool:
    """Whether the interrupt was raised inside XLA's compiler, whose threads may still be compiling."""
    return any(frame.f_code.co_name == "backend_compile_and_load" for frame, _ in traceback.walk_tb(stop.__traceback__))


def exit_before_teardown(status: int) -> None:
    """Ends the process after its atexit handlers (JAX's backends and distributed client, logging) but before
    the interpreter's teardown, which crashed (a segfault, most times) while XLA's compiler threads were still
    at work on the program the interrupt cut off. Skipped with the teardown: the joins of non-daemon threads.
    The interrupt has already unwound through every `finally` (metrics files closed, checkpoint managers
    finished)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that went away
            pass
    atexit._run_exitfuncs()  # private, but the only way to run what a normal exit runs before its teardown
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
