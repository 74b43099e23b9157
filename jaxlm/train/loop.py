"""The training loop, top to bottom: set-up, compile, train, evaluate, checkpoint, report."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from jaxlm import config as config_lib
from jaxlm import families
from jaxlm.config import RunConfig
from jaxlm.data.pipeline import most_frequent_token_baseline, open_data
from jaxlm.objectives import Objective
from jaxlm.parallel import distributed
from jaxlm.parallel.mesh import logical_sharding, make_mesh, replicated
from jaxlm.parallel.rules import Rules, rules_for
from jaxlm.parallel.xla_options import project_xla_options
from jaxlm.train import checkpoint, compile_cache, faults, flops, run_lock
from jaxlm.train.preflight import check_batch, preflight
from jaxlm.train.metrics import MetricsWriter, plot_curves, read_jsonl
from jaxlm.train.optim import make_optimizer, reject_loss_spikes, schedule
from jaxlm.train.state import abstract_state, check_state_memory, count_params, create_state, state_shardings
from jaxlm.train.step import dropout_key, init_key, make_eval_step, make_train_step
from jaxlm.train.storage import missing_dirs, remove_if_empty, run_path


# ---------------------------------------------------------------- set-up (no compute)

NEVER_APPLY_NONFINITE = 2**31 - 1  # the loop stops (train.max_skipped) long before optax would apply one

@dataclasses.dataclass
class Setup:
    config: RunConfig
    mesh: Mesh
    rules: Rules
    objective: Objective
    optimizer: object
    schedule: object
    shardings: object
    abstract: object
    batch_shardings: dict


def build(config: RunConfig, devices=None, objective: Objective | None = None,
          optimizer_for: Callable | None = None) -> Setup:
    """Everything the step needs, from the config: mesh (over `devices`, default all), objective (the
    family's pretraining one unless given), optimiser (`optimizer_for(abstract params)` -> (optimizer,
    schedule), if given, else the config's; with train.nonfinite=skip, wrapped so that a non-finite update
    is dropped, and with train.spike_sigmas a loss spike too), shardings."""
    mesh = make_mesh(config.mesh, devices)
    check_batch(config, mesh)
    rules = rules_for(config.mesh.rules)
    objective = objective or families.make_objective(config.model, config.data)
    total = config.train.steps
    if optimizer_for is None:
        optimizer, lr = make_optimizer(config.optim, total), schedule(config.optim, total)
    else:
        optimizer, lr = optimizer_for(nn.unbox(jax.eval_shape(objective.init, jax.random.key(0))))
    if config.train.nonfinite == "skip":  # costs one more copy of the optimiser state in the step's memory
        optimizer = optax.apply_if_finite(optimizer, max_consecutive_errors=NEVER_APPLY_NONFINITE)
    if config.train.spike_sigmas > 0:
        optimizer = optax.chain(reject_loss_spikes(config.train.spike_sigmas, config.train.spike_window), optimizer)
    with nn.logical_axis_rules(rules):
        shardings = state_shardings(objective.init, optimizer, mesh, rules)
    abstract = abstract_state(objective.init, optimizer, shardings)
    batch_shardings = {k: logical_sharding(mesh, rules, axes) for k, axes in objective.batch_axes.items()}
    return Setup(config, mesh, rules, objective, optimizer, lr, shardings, abstract, batch_shardings)


DEEP = 64  # layers beyond which a loop-layout state is first sized in scan layout


def build_within_memory(config: RunConfig) -> Setup:
    """`build(config)`, once its train state is known to fit a device (`check_state_memory`). A loop-layout model
    deeper than DEEP layers is sized first in scan layout, whose state is the same bytes from one traced layer:
    its own build traces every layer, about 0.1 s apiece (a mistyped num_layers=100000 took hours to be refused)."""
    model = config.model
    if not model.scan_layers and max(model.num_layers, model.decoder_layers) > DEEP:
        twin = dataclasses.replace(config, model=dataclasses.replace(model, scan_layers=True))
        check_state_memory(build(twin).abstract)
    setup = build(config)
    check_state_memory(setup.abstract)
    return setup


def batch_structs(setup: Setup) -> dict:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=setup.batch_shardings[k])
            for k, v in setup.objective.batch_shapes(setup.config.train.global_batch).items()}


def compile_eval(setup: Setup):
    """The AOT-compiled held-out step: (params, batch) -> summed stats, replicated."""
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        evaluate = jax.jit(make_eval_step(setup.objective),
                           in_shardings=(setup.shardings.params, setup.batch_shardings),
                           out_shardings=replicated(setup.mesh))
        return evaluate.lower(setup.abstract.params, batch_structs(setup)).compile(
            project_xla_options(setup.mesh.devices.flat) or None)


def compile_steps(setup: Setup, with_eval: bool = True, compiler_options: dict | None = None):
    """AOT-compiled train (and eval) steps with explicit shardings; the state is donated. The project's XLA
    options (`project_xla_options`) apply to both, `compiler_options` (XLA's debug options by name) to the train
    step."""
    compiler_options = project_xla_options(setup.mesh.devices.flat) | (compiler_options or {})
    rng = jax.ShapeDtypeStruct((), dropout_key(setup.config.train).dtype, sharding=replicated(setup.mesh))
    train_step = make_train_step(setup.objective, setup.optimizer, setup.schedule, setup.config.optim.grad_accum)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        train = jax.jit(train_step, in_shardings=(setup.shardings, setup.batch_shardings, replicated(setup.mesh)),
                        out_shardings=(setup.shardings, replicated(setup.mesh)), donate_argnums=0)
        compiled_train = train.lower(setup.abstract, batch_structs(setup), rng).compile(compiler_options or None)
    return compiled_train, compile_eval(setup) if with_eval else None


def memory_summary(compiled) -> str:
    stats = compiled.memory_analysis()
    if stats is None:
        return "memory analysis unavailable"
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes", "generated_code_size_in_bytes")
    return ", ".join(f"{f.removesuffix('_size_in_bytes')} {getattr(stats, f, 0) / 2**20:.1f} MiB" for f in fields)


def global_batch(setup: Setup, local: dict) -> dict:
    """This process's rows of the batch, assembled into global sharded arrays."""
    size = setup.config.train.global_batch
    return {k: jax.make_array_from_process_local_data(setup.batch_shardings[k], np.asarray(v),
                                                      (size, *np.shape(v)[1:]))
            for k, v in local.items()}


def evaluate(setup: Setup, compiled_eval, params, valid, beat=lambda: None) -> dict:
    """Held-out stats over up to `train.eval_batches` batches; `beat()` after each (the watchdog)."""
    size = setup.config.train.global_batch
    batches = min(setup.config.train.eval_batches, len(valid) // size)
    if batches == 0:
        return {}
    totals = None
    for index in range(batches):
        local = valid.local_batch(index, size, jax.process_index(), jax.process_count())
        stats = compiled_eval(params, global_batch(setup, local))
        totals = stats if totals is None else jax.tree.map(jnp.add, totals, stats)
        beat()
    summary = jax.device_get(setup.objective.summarize(totals))
    return {k: float(v) for k, v in summary.items()} | {"examples": batches * size}


# ---------------------------------------------------------------- the run

def restore_or_init(setup: Setup, mngr, rng, warn):
    """Resume order: this run's newest checkpoint that restores, then `train.init_from`, then scratch."""
    resumed = checkpoint.restore_newest(mngr, setup.abstract, warn)
    if resumed is not None:
        state, position, step = resumed
        return state, int(position["step"]), f"resumed from step {step}"
    source = setup.config.train.init_from
    params = checkpoint.restore_params(source, setup.abstract.params) if source else None  # read before any compute
    state = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules, rng)
    if params is not None:
        return state.replace(params=params), 0, f"initialised from {source}{left_out(source, setup.abstract.params)}"
    return state, 0, "initialised from scratch"


def final_evaluation(run_dir, step: int) -> dict | None:
    """The held-out metrics a run recorded at `step` (its metrics.jsonl), as `train` returns them; None if none."""
    path = run_dir / "metrics.jsonl"
    records = read_jsonl(path) if path.exists() else []
    record = next((r for r in records if r.get("split") == "eval" and r["step"] == step), None)
    if record is None:
        return None
    return {k: v for k, v in record.items() if k != "split"} | {"step": step, "examples": int(record["examples"])}


def left_out(source: str, abstract_params, listed: int = 4) -> str:
    """What of `train.init_from`'s parameters this run does not take, said after "initialised from SOURCE"."""
    names = checkpoint.params_left_out(source, abstract_params)
    if not names:
        return ""
    more = f" and {len(names) - listed} more" if len(names) > listed else ""
    return (f", leaving out {len(names)} of its parameters that this model does not have: {', '.join(names[:listed])}"
            f"{more} (a shallower model, or another objective's heads?)")


RESUME = "run the same command to resume"


def save(mngr, step: int, state, resolved: dict) -> None:
    """A checkpoint of `step`; a failed write stops the run, the older checkpoints kept."""
    with checkpoint.stop_if_writing_fails(mngr, step, RESUME):
        checkpoint.save(mngr, step, state, {"step": step}, resolved)


def train(config: RunConfig) -> dict:
    """Train (or resume) the run in `config.train.run_dir`; returns the final held-out metrics, or the
    step and the reason of an early stop (SIGTERM, Ctrl-C, the time limit), saved at that step. Another
    command writing the same run directory is refused (`run_lock`)."""
    multiprocess = distributed.initialize(config.distributed)
    run_dir = config.train.run_dir
    made = missing_dirs(run_dir)
    try:
        _, (_, train_data, valid) = preflight(config)
        setup = build_within_memory(config)
        if config.train.init_from and not checkpoint.has_checkpoint(run_dir):
            checkpoint.check_params_source(config.train.init_from, setup.abstract.params)
    except BaseException:
        if made and jax.process_index() == 0:  # a refused run leaves no directory (the compilation cache made one)
            cache = compile_cache.in_run(run_dir)
            remove_if_empty([cache, *made] if cache.exists() else made)
        raise
    with run_lock.writing(run_dir):
        return _train(config, setup, train_data, valid, multiprocess)


def _train(config: RunConfig, setup: Setup, train_data, valid, multiprocess: bool) -> dict:
    """The run, once every check has passed and its directory is this command's alone."""
    tcfg, is_main = config.train, jax.process_index() == 0
    run_dir = run_path(tcfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    mngr = checkpoint.manager(run_dir / "checkpoints", tcfg.keep_checkpoints)
    rng, init_rng = dropout_key(tcfg), init_key(tcfg)
    warnings = []
    with compile_cache.counted() as lookups:
        state, start, how = restore_or_init(setup, mngr, init_rng, warnings.append)
        if start > tcfg.steps:
            mngr.close()
            raise ValueError(f"the run in {run_dir} is at step {start}, past train.steps={tcfg.steps}: there is "
                             f"nothing to train; set train.steps above {start} to train on, or choose a new "
                             "train.run_dir")
        if start == tcfg.steps and (done := final_evaluation(run_dir, start)) is not None:
            mngr.close()  # a finished run only reports: nothing compiled, evaluated or written again
            return done
        started = time.perf_counter()
        compiled_train, compiled_eval = compile_steps(setup)
        compile_line = compile_cache.summary(time.perf_counter() - started, lookups)
    resolved = config_lib.to_dict(config)
    if is_main:
        (run_dir / "config.json").write_text(json.dumps(resolved, indent=2))

    writer = MetricsWriter(run_dir, start, tcfg.steps, active=is_main)
    for warning in warnings:
        writer.message(f"warning: {warning}")
    writer.message(f"{how}; {count_params(state.params) / 1e6:.2f}M parameters on mesh "
                   f"{dict(setup.mesh.shape)} ({jax.device_count()} devices, {jax.process_count()} processes)")
    writer.message(f"train step memory: {memory_summary(compiled_train)}")
    writer.message(compile_line)
    peak, _ = flops.peak_flops(override=config.bench.peak_flops_per_device)
    tokens_per_step = tcfg.global_batch * config.data.max_seq_length
    flops_per_token = setup.objective.flops_per_token()

    def check(step: int, metrics) -> None:
        faults.check_step(step, jax.device_get(metrics), tcfg,
                          lambda index: train_data.batch_indices(index, tcfg.global_batch), writer.message)

    stop = faults.StopRequests(multiprocess, writer.message)
    watchdog = faults.Watchdog(tcfg.hang_timeout_s, run_dir / f"hang-process{jax.process_index()}.txt")
    batches = train_data.iterate(start, tcfg.global_batch, jax.process_index(), jax.process_count(),
                                 workers=config.data.workers)
    try:
        with stop, watchdog, contextlib.closing(batches):
            if start == 0:  # where held-out metrics start, for the curves and to judge what training bought
                writer.write(0, evaluate(setup, compiled_eval, state.params, valid, watchdog.beat), split="eval")
            step, stop_at, stopping = start, tcfg.steps, False
            deadline = time.time() + tcfg.time_limit_minutes * 60 if tcfg.time_limit_minutes > 0 else None
            last_time, last_step, pending = time.time(), start, None
            watchdog.beat()
            while step < stop_at and not stopping:
                state, metrics = compiled_train(state, global_batch(setup, next(batches)), rng)
                step += 1
                faults.sleep_if_asked(step)
                if pending is not None:  # the step before, read while this one runs
                    check(*pending)
                    watchdog.beat(step_done=True)
                pending = (step, metrics)
                if deadline is not None and time.time() > deadline:
                    stop.ask(f"train.time_limit_minutes={tcfg.time_limit_minutes}")
                stopping = stop.reached(step)
                if step % tcfg.log_every == 0 or step == stop_at or stopping:
                    values = {k: float(v) for k, v in jax.device_get(metrics).items()}
                    now = time.time()
                    tokens_per_s = (step - last_step) * tokens_per_step / max(now - last_time, 1e-9)
                    values |= {"tokens_per_s": tokens_per_s,
                               "mfu": flops.mfu(tokens_per_s, flops_per_token, jax.device_count(), peak)}
                    writer.write(step, values)
                    writer.advance(step - last_step)
                    last_time, last_step = now, step
                if step % tcfg.eval_every == 0 and step < stop_at and not stopping:
                    writer.write(step, evaluate(setup, compiled_eval, state.params, valid, watchdog.beat),
                                 split="eval")
                if step % tcfg.checkpoint_every == 0 or step == stop_at or stopping:
                    check(*pending)  # never a checkpoint of a step not known to be finite
                    pending = None
                    save(mngr, step, state, resolved)
                    watchdog.beat()
            if pending is not None:
                check(*pending)
            with checkpoint.stop_if_writing_fails(mngr, step, RESUME):  # an asynchronous save failed
                mngr.wait_until_finished()
            if stopping and step < stop_at:  # a stop asked at the last step ends the run as done
                writer.message(f"stopped at step {step} on {stop.reason}: checkpoint {step} saved in "
                               f"{mngr.directory}; {RESUME}")
                return {"step": step, "stopped": stop.reason}
            final = evaluate(setup, compiled_eval, state.params, valid, watchdog.beat)
            writer.write(step, final, split="eval")
            return final | {"step": step}
    finally:
        writer.close()
        mngr.close()


def heldout_baselines(valid, final: dict) -> dict:
    """The trivial baseline of each held-out accuracy in `final`: the most frequent masked token for
    MLM (over the examples evaluated), 0.5 for NSP and SOP."""
    baselines = {}
    if "mlm_acc" in final:
        baselines["mlm_acc"] = most_frequent_token_baseline(valid, epoch=0, limit=final.get("examples"))
    return baselines | {f"{name}_acc": 0.5 for name in ("nsp", "sop") if f"{name}_acc" in final}


def with_perplexity(final: dict) -> dict:
    """Held-out metrics plus the perplexity of token-level objectives (exp of the mean loss)."""
    return final | ({"perplexity": float(np.exp(final["loss"]))} if "lm_acc" in final else {})


def report(config: RunConfig, final: dict) -> str:
    """Held-out accuracy next to its trivial baselines, perplexity for token-level objectives, and the
    plot of the curves."""
    run_dir = run_path(config.train.run_dir)
    summary = {"step": final["step"], "loss": final["loss"], "examples": final["examples"]}
    lines = [f"  held-out loss {final['loss']:.4f}"]
    valid = open_data(config)[2] if "mlm_acc" in final else None  # the MLM baseline counts its tokens
    baselines = heldout_baselines(valid, final)
    if "mlm_acc" in final:
        baseline = baselines["mlm_acc"]
        summary |= {"mlm_acc": final["mlm_acc"], "mlm_baseline": baseline,
                    "mlm_ratio": final["mlm_acc"] / max(baseline, 1e-9)}
        lines.append(f"  MLM accuracy {final['mlm_acc']:.4f}   most-frequent-token baseline {baseline:.4f}"
                     f"   ({summary['mlm_ratio']:.2f}x)")
    for name in ("nsp", "sop"):
        if f"{name}_acc" in final:
            summary |= {f"{name}_acc": final[f"{name}_acc"], f"{name}_baseline": 0.5}
            lines.append(f"  {name.upper()} accuracy {final[f'{name}_acc']:.4f}   baseline 0.5000")
    if "lm_acc" in final:
        summary |= {"lm_acc": final["lm_acc"], "perplexity": with_perplexity(final)["perplexity"]}
        lines.append(f"  token accuracy {final['lm_acc']:.4f}   perplexity {summary['perplexity']:.2f}")
    plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png", baselines)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return "\n".join([f"held-out after {final['step']} steps on {final['examples']} examples:", *lines,
                      f"  curves: {run_dir / 'curves.png'}"])
