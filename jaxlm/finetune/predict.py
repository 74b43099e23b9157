"""`jaxlm predict`: a fine-tuned checkpoint's predictions for a file of records, one JSON line each."""
from __future__ import annotations

import dataclasses
import math
import pathlib

import jax

from jaxlm import config as config_lib
from jaxlm.config import ConfigError
from jaxlm.corpora.text import check_output_file
from jaxlm.eval.sources import open_source, source_tokenizer
from jaxlm.finetune import data as task_data
from jaxlm.finetune.features import fitted_batch
from jaxlm.finetune.run import Runner, check_settings, write_jsonl
from jaxlm.finetune.tasks import TASKS, Context
from jaxlm.train import checkpoint
from jaxlm.train.loop import build

TARGET_ROLES = ("label", "tags", "answers", "target")  # what a prediction line replaces, not repeats
# the finetune settings predict may change: how records are read and predictions made, not what the head learnt
PREDICT_SETTINGS = ("fields", "max_length", "doc_stride", "max_query_length", "max_answer_length", "n_best",
                    "num_beams", "max_target_length")


def predict(checkpoint_path, input_spec: str, output, batch_size: int = 32, overwrite: bool = False,
            overrides: list[str] = ()) -> int:
    """Writes one line per input record (its input fields and the prediction) to `output`; returns the
    number of lines. Every check (checkpoint, input fields, output) comes before any compute."""
    output = pathlib.Path(output)
    input_file = task_data.spec_file(input_spec)
    check_output_file(output, overwrite, [input_file] if input_file else [], "the --input")
    config_lib.refuse_unread_sections(overrides, ("model", "mesh", "data", "finetune"))
    trained = sorted(set(config_lib.parse_overrides(list(overrides)).get("finetune", {})) - set(PREDICT_SETTINGS))
    if trained:
        raise ConfigError(f"finetune.{trained[0]} is what the checkpoint was fine-tuned with; predict changes only "
                          f"how records are read and predicted: finetune.{', finetune.'.join(PREDICT_SETTINGS)}")
    if batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {batch_size}")
    source = open_source(checkpoint_path, list(overrides))
    config = source.config
    if not config.finetune.task:
        raise ConfigError(f"{checkpoint_path} is not a fine-tuned checkpoint (its config has no finetune.task); "
                          "predict reads the checkpoints `jaxlm finetune` writes")
    check_settings(config)  # those predict may change, as finetune checks them
    task, settings = TASKS[config.finetune.task], config.finetune
    records = task_data.read_records(input_spec, task.field_names(settings), task.input_roles, "--input",
                                     config.data.tfds_data_dir)
    task.check_inputs(records, settings.labels, f"--input {input_spec}")
    ctx = Context(config.model, settings, settings.labels, source_tokenizer(source))
    rows = task.rows(ctx, records, labelled=False)
    shards = jax.device_count()
    batch_size = fitted_batch(batch_size, len(rows), shards)  # --batch-size 10**8 was killed for memory
    config = dataclasses.replace(config, train=dataclasses.replace(
        config.train, global_batch=math.ceil(batch_size / shards) * shards))
    setup = build(config, objective=task.objective(ctx))
    step = source.own_step if source.own_step is not None else source.committed_steps()[-1]
    params = checkpoint.restore_params(source.path, setup.abstract.params, step, setting="")
    predictions = task.predictions(ctx, Runner(setup, task), params, rows, records)
    echoed = [role for role in (*task.input_roles, *task.optional_roles) if role not in TARGET_ROLES]
    lines = [{role: record[role] for role in echoed if role in record} | prediction
             for record, prediction in zip(records, predictions)]
    if jax.process_index() == 0:
        write_jsonl(output, lines)
    return len(lines)
