"""Times the compiled train step on the devices present: tokens/s and MFU with the peak used."""
from __future__ import annotations

import json
import time
from pathlib import Path

import jax

from jaxlm.config import RunConfig
from jaxlm.parallel import distributed
from jaxlm.train import flops, hlo_cost
from jaxlm.train.profile import PROFILED_STEPS, profile_steps
from jaxlm.train.loop import build_within_memory, compile_steps, global_batch, memory_summary
from jaxlm.train.state import count_params, create_state
from jaxlm.train.step import dropout_key


def _compiled(config: RunConfig):
    """(setup, initialised state, compiled train step, {"started": t0, "setup": t1, "compile": t2})."""
    distributed.initialize(config.distributed)
    phases = {"started": time.perf_counter()}
    setup = build_within_memory(config)
    state = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules,
                         jax.random.key(0))
    jax.block_until_ready(state)
    phases["setup"] = time.perf_counter()
    compiled_train, _ = compile_steps(setup, with_eval=False)
    phases["compile"] = time.perf_counter()
    return setup, state, compiled_train, phases


def compile_only(config: RunConfig) -> dict:
    """The state's initialiser and the train step compiled (and run: the initialiser) and nothing timed, so
    that a later process finds both in JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR) and
    spends no compile time; `seconds` as bench's."""
    *_, phases = _compiled(config)
    return _timings(phases) | {"cache": jax.config.jax_compilation_cache_dir}


def bench(config: RunConfig, profile_dir: str | None = None) -> dict:
    """Tokens/s and MFU of the compiled train step on synthetic batches; with `profile_dir`, a jax.profiler
    trace of PROFILED_STEPS more steps there, summarised by op class (`profile` in the result; a trace that
    cannot be read or classed gives `profile_error` instead, and the timing stands). `seconds` says where the
    call's wall time went: setup (the model and its initialised state), compile, steps (warm-up and timed),
    profile."""
    setup, state, compiled_train, phases = _compiled(config)
    size = config.train.global_batch
    local = setup.objective.synthetic_batch(size // jax.process_count(), seed=jax.process_index())
    batch, rng = global_batch(setup, local), dropout_key(config.train)
    for _ in range(config.bench.warmup):
        state, metrics = compiled_train(state, batch, rng)
    jax.block_until_ready(state)
    started = time.perf_counter()
    for _ in range(config.bench.steps):
        state, metrics = compiled_train(state, batch, rng)
    jax.block_until_ready((state, metrics))
    seconds = (time.perf_counter() - started) / config.bench.steps
    phases["steps"] = time.perf_counter()
    profiled = {}
    if profile_dir:
        def step():
            nonlocal state, metrics
            state, metrics = compiled_train(state, batch, rng)
            return metrics

        try:
            profiled = {"profile": _profiled(step, profile_dir, compiled_train.as_text(),
                                             config.bench.peak_flops_per_device)}
        except (OSError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as error:
            profiled = {"profile_error": f"{type(error).__name__}: {error}"}
        phases["profile"] = time.perf_counter()
    tokens_per_s = size * config.data.max_seq_length / seconds
    peak, peak_text = flops.peak_flops(override=config.bench.peak_flops_per_device)
    per_token = setup.objective.flops_per_token()
    return {"model": f"L{config.model.num_layers} H{config.model.hidden_size}", "params_M": count_params(state.params) / 1e6,
            "seq_len": config.data.max_seq_length, "global_batch": size, "devices": jax.device_count(),
            "device_kind": jax.devices()[0].device_kind,
            "dtype": config.model.dtype + ("+fp8" if config.model.fp8 else ""),
            "attention": config.model.attention_kernel, "step_ms": seconds * 1e3,
            "tokens_per_s": tokens_per_s, "gflops_per_token": per_token / 1e9,
            "mfu": flops.mfu(tokens_per_s, per_token, jax.device_count(), peak), "peak": peak_text,
            "memory": memory_summary(compiled_train), "loss": float(metrics["loss"])} | _timings(phases) | profiled


def _profiled(step, profile_dir: str, hlo_text: str, peak_override: float) -> dict:
    """The profile's summary of PROFILED_STEPS runs of `step`, each op with its roofline bound where the GPU's
    figures are known: one launch's times the launches the trace counted. Every op's row goes to ops.json in
    `profile_dir` and the step's HLO to step.hlo beside it, to read the kernels' names off the device."""
    summary = profile_steps(step, PROFILED_STEPS, profile_dir, hlo_text)
    every_op = summary.pop("ops")
    bounds = hlo_cost.step_bounds(hlo_text, jax.devices()[0].device_kind, peak_override)
    if bounds:
        summary["bound_ms_per_step"] = bounds["classes"]
        for op in every_op:
            if op["op"] in bounds["per_launch"]:
                op["bound_ms"] = bounds["per_launch"][op["op"]] * op["launches"]
    Path(profile_dir, "ops.json").write_text(json.dumps(every_op, indent=0))
    Path(profile_dir, "step.hlo").write_text(hlo_text)
    return summary


def _timings(ends: dict[str, float]) -> dict:
    """{"compile_s": the compile's seconds, "seconds": {phase: seconds}} from {"started": t0, phase: its end
    time, ...} in order."""
    names, times = list(ends), list(ends.values())
    return {"compile_s": ends["compile"] - ends["setup"],
            "seconds": {name: round(end - start, 1) for name, start, end in zip(names[1:], times, times[1:])}}


def format_table(rows: list[dict]) -> str:
    columns = ("model", "seq_len", "global_batch", "devices", "device_kind", "dtype", "attention", "step_ms",
               "tokens_per_s", "mfu")
    cells = [[_fmt(c, row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    lines += [f"peak: {rows[0]['peak']}", f"memory: {rows[0]['memory']}"] if rows else []
    return "\n".join(lines)


def _fmt(column: str, value) -> str:
    if value is None:
        return "n/a"
    if column == "mfu":
        return f"{value:.1%}"
    return f"{value:,.1f}" if isinstance(value, float) else str(value)
