"""The `jaxlm` command line: parses arguments, loads the config, calls the library."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

from jaxlm import config as config_lib
from jaxlm.config import ConfigError


def _load(args) -> config_lib.RunConfig:
    return config_lib.load(args.config, args.overrides)


def cmd_prepare(args) -> None:
    from jaxlm.data.prepare import prepare
    from jaxlm.data.sources import model_tokenizer, resolve_corpus

    config = _load(args)
    data = config.data
    tokenizer = model_tokenizer(config)
    if not args.overwrite and _already_prepared(config, tokenizer):
        print(f"{data.prepared_dir} is already prepared for this config and tokenizer "
              "(pass --overwrite to rebuild it)")
        return
    manifest = prepare(resolve_corpus(data.corpus), data.prepared_dir, tokenizer,
                       max_seq_length=data.max_seq_length, short_seq_prob=data.short_seq_prob,
                       dupe_factor=data.dupe_factor, valid_fraction=data.valid_fraction, seed=data.seed,
                       shard_size=data.shard_size, overwrite=args.overwrite)
    counts = {split: {k: v for k, v in info.items() if k != "shards"} for split, info in manifest["splits"].items()}
    print(json.dumps({"prepared_dir": data.prepared_dir, "splits": counts}, indent=2))


def _already_prepared(config, tokenizer) -> bool:
    """True when prepared_dir holds data made with these settings; raises when it holds other data."""
    from jaxlm.data.sources import resolve_corpus

    manifest_path = pathlib.Path(config.data.prepared_dir) / "manifest.json"
    if not manifest_path.is_file():
        return False
    manifest = json.loads(manifest_path.read_text())
    data = config.data
    wanted = {"tokenizer_fingerprint": tokenizer.fingerprint(), "max_seq_length": data.max_seq_length,
              "short_seq_prob": data.short_seq_prob, "dupe_factor": data.dupe_factor,
              "valid_fraction": data.valid_fraction, "seed": data.seed}
    differing = {k: (manifest.get(k), v) for k, v in wanted.items() if manifest.get(k) != v}
    sources = [s["path"] for s in manifest.get("sources", [])]
    if sources != [str(p.resolve()) for p in resolve_corpus(data.corpus)]:
        differing["corpus"] = (sources, list(data.corpus))
    if differing:
        details = "; ".join(f"{k}: prepared {old!r}, config {new!r}" for k, (old, new) in differing.items())
        raise ConfigError(f"{data.prepared_dir} holds data prepared with other settings ({details}); "
                          "pass --overwrite to rebuild it or choose another data.prepared_dir")
    return True


def cmd_train(args) -> None:
    from jaxlm.train.loop import report, train

    config = _load(args)
    final = train(config)
    import jax

    if jax.process_index() == 0 and final.get("examples"):
        print(report(config, final))


def cmd_data_show(args) -> None:
    from jaxlm.train.loop import open_data

    config = _load(args)
    tokenizer, train_data, valid = open_data(config)
    data = valid if args.split == "valid" else train_data
    for record in data.show(args.n, tokenizer):
        print(json.dumps(record))


def cmd_bench(args) -> None:
    from jaxlm.train.bench import bench, format_table

    config = _load(args)
    row = bench(config)
    import jax

    if jax.process_index() == 0:
        print(format_table([row]))
        if args.json:
            print(json.dumps(row))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="jaxlm", description="Pretrain language models in JAX on a device mesh.")
    commands = top.add_subparsers(dest="command", required=True)

    def command(parent, name, handler, text):
        sub = parent.add_parser(name, help=text, description=text)
        sub.add_argument("config", help="a YAML file in configs/, e.g. configs/bert-tiny.yaml")
        sub.add_argument("overrides", nargs="*", help="dotted overrides such as train.steps=100")
        sub.set_defaults(handler=handler)
        return sub

    prep = command(commands, "prepare", cmd_prepare, "text -> tokenized, pair-built examples in ArrayRecord shards")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing prepared directory")
    command(commands, "train", cmd_train, "train, or resume the run in train.run_dir")
    bench = command(commands, "bench", cmd_bench, "time the compiled train step: tokens/s and MFU")
    bench.add_argument("--json", action="store_true", help="also print the row as JSON")
    data = commands.add_parser("data", help="inspect the data").add_subparsers(dest="data_command", required=True)
    show = command(data, "show", cmd_data_show, "print examples exactly as the model receives them (JSON lines)")
    show.add_argument("--n", type=int, default=4, help="how many examples")
    show.add_argument("--split", choices=("train", "valid"), default="train")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.handler(args)
    except (ConfigError, OSError, ValueError) as err:
        print(f"jaxlm {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
