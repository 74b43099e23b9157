"""Fine-tuning against transformers: each config of configs/finetune run by `jaxlm finetune` and the same
fine-tune in PyTorch (transformers' *For... head from the same weights, the init checkpoint written by
`jaxlm convert to-hf`, fed the same
rows, AdamW with the same rate, warm-up, linear decay, weight decay, clipping, batch and epochs; dev
every epoch, test at the best), for several seeds; one table of mean ± spread and seconds.

    python bench/finetune_hf.py configs/finetune/polarity-minilm.yaml [CONFIG ...] [--seeds 0,1,2] [--set K=V]

Run `jaxlm convert from-hf all-MiniLM-L6-v2 models/all-minilm` first (or `make demo` for the demo BERT
configs). Token classification runs without a CRF on both sides (transformers has none)."""
from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile
import time

import numpy as np
import torch
import transformers

from jaxlm.convert import store
from jaxlm.finetune import run
from jaxlm.finetune.features import batch_rows

HEADS = {"sequence_classification": transformers.BertForSequenceClassification,
         "token_classification": transformers.BertForTokenClassification,
         "question_answering": transformers.BertForQuestionAnswering,
         "multiple_choice": transformers.BertForMultipleChoice}


def torch_batch(task: str, batch: dict) -> dict:
    """transformers' inputs and labels from our rows."""
    ids, segments, mask = (torch.tensor(batch[k], dtype=torch.long) for k in ("input_ids", "segment_ids", "input_mask"))
    inputs = {"input_ids": ids, "token_type_ids": segments, "attention_mask": mask}
    if task == "token_classification":
        labels = np.where(batch["label_weights"] > 0, batch["labels"], -100)
        return inputs | {"labels": torch.tensor(labels, dtype=torch.long)}
    if task == "question_answering":
        return inputs | {"start_positions": torch.tensor(batch["start_position"], dtype=torch.long),
                         "end_positions": torch.tensor(batch["end_position"], dtype=torch.long)}
    return inputs | {"labels": torch.tensor(batch["label"], dtype=torch.long)}


def outputs(task: str, model, rows, size: int):
    """Our runner's outputs, from the torch model: logits, argmax tags, or (start, end)."""
    pieces = []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), size):
            indices = np.arange(start, min(start + size, len(rows)))
            batch = torch_batch(task, batch_rows(rows, indices, len(indices)))
            result = model(**{k: v for k, v in batch.items() if k in ("input_ids", "token_type_ids", "attention_mask")})
            if task == "question_answering":
                pieces.append((result.start_logits.numpy(), result.end_logits.numpy()))
            elif task == "token_classification":
                pieces.append(result.logits.argmax(-1).numpy())
            else:
                pieces.append(result.logits.numpy())
    model.train()
    if task == "question_answering":
        return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])
    return np.concatenate(pieces)


def hf_copy(checkpoint: str, directory: pathlib.Path) -> pathlib.Path:
    """The checkpoint as a transformers directory, as `jaxlm convert to-hf` writes it."""
    config, params, tokenizer = store.load_checkpoint(checkpoint)
    store.save_hf(directory / "model", config, params, tokenizer)
    return directory / "model"


def transformers_finetune(plan: run.Plan, seed: int, weights: pathlib.Path) -> dict:
    config, task = plan.config, plan.task
    torch.manual_seed(seed)
    labelled = task.name in ("sequence_classification", "token_classification")
    extra = {"num_labels": len(plan.ctx.labels)} if labelled else {}
    model = HEADS[task.name].from_pretrained(weights, **extra)
    decay = [p for n, p in model.named_parameters() if not any(k in n for k in ("bias", "LayerNorm"))]
    rest = [p for n, p in model.named_parameters() if any(k in n for k in ("bias", "LayerNorm"))]
    optim = config.optim
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": optim.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=optim.peak_lr,
                                  betas=(optim.b1, optim.b2), eps=optim.eps)
    total, warmup = config.train.steps, config.optim.warmup_steps
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, warmup, total)
    rows, size = plan.rows["train"], config.train.global_batch
    best, best_state = run.BestDev(plan.metric, scores={}), None
    model.train()
    for step in range(total):
        epoch, within = divmod(step, plan.steps_per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        indices = order[within * size:(within + 1) * size]
        loss = model(**torch_batch(task.name, batch_rows(rows, indices, len(indices)))).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if (step + 1) % plan.eval_every == 0 or step + 1 == total:
            scores = task.score(plan.ctx, task.predict(plan.ctx, outputs(task.name, model, plan.rows["dev"], size),
                                                       plan.rows["dev"], plan.records["dev"]), plan.records["dev"])
            if best.offer(step + 1, scores):
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    test = task.score(plan.ctx, task.predict(plan.ctx, outputs(task.name, model, plan.rows["test"], size),
                                             plan.rows["test"], plan.records["test"]), plan.records["test"])
    return {"dev": best.scores, "test": test}


def ours(path: str, seed: int, overrides: list[str]) -> dict:
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="bench-finetune-"))
    try:
        config, source = run.load(path, [*overrides, f"train.seed={seed}", f"train.run_dir={run_dir}",
                                         "train.log_every=1000000"])
        return run.finetune(config, source)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def cell(values: list[float]) -> str:
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every config, e.g. finetune.crf=false")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    lines = ["| config | metric | jaxlm dev | transformers dev | jaxlm test | transformers test | jaxlm s/run | "
             "transformers s/run |", "|---|---|---|---|---|---|---|---|"]
    for path in args.configs:
        config, _ = run.load(path, args.set)
        weights = hf_copy(config.finetune.init_from, pathlib.Path(tempfile.mkdtemp(prefix="bench-finetune-hf-")))
        results = {"jaxlm": [], "transformers": []}
        seconds = {"jaxlm": 0.0, "transformers": 0.0}
        for seed in seeds:
            began = time.time()
            summary = ours(path, seed, args.set)
            seconds["jaxlm"] += time.time() - began
            results["jaxlm"].append(summary)
            config, source = run.load(path, [*args.set, f"train.seed={seed}"])
            plan = run.plan(config, source)
            began = time.time()
            results["transformers"].append(transformers_finetune(plan, seed, weights))
            seconds["transformers"] += time.time() - began
            metric = results["jaxlm"][0]["metric"]
            print(f"{pathlib.Path(path).stem} seed {seed}: " + ", ".join(
                f"{side} dev {runs[-1]['dev'][metric]:.3f} test {runs[-1]['test'][metric]:.3f}"
                for side, runs in results.items()), flush=True)
        shutil.rmtree(weights.parent, ignore_errors=True)
        metric = results["jaxlm"][0]["metric"]
        values = {side: {split: [r[split][metric] for r in runs] for split in ("dev", "test")}
                  for side, runs in results.items()}
        lines.append(f"| {pathlib.Path(path).stem} | {metric} | {cell(values['jaxlm']['dev'])} | "
                     f"{cell(values['transformers']['dev'])} | {cell(values['jaxlm']['test'])} | "
                     f"{cell(values['transformers']['test'])} | {seconds['jaxlm'] / len(seeds):.0f} | "
                     f"{seconds['transformers'] / len(seeds):.0f} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
