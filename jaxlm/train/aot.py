"""Compile the train step for a TPU topology without the TPUs: does this config fit, and how much memory?

With libtpu installed (`pip install "jax[tpu]==0.10.2"`, libtpu 0.0.42.1), `get_topology_desc` gives
compile-only TPU devices on any machine, CPU-only ones included; the trainer's own `build` and
`compile_steps` then lay the mesh over them and compile the real step, and `memory_analysis()` says
what each chip would hold. `jaxlm compile CONFIG [overrides] --topology v5e:2x2` prints one line.
"""
from __future__ import annotations

import os

from jax._src import xla_bridge

from jaxlm.config import RunConfig
from jaxlm.train.loop import build, compile_steps

DEFAULT_TOPOLOGY = "v5e:2x2"
MEMORY_FIELDS = ("argument", "output", "temp", "generated_code", "alias")
# High-bandwidth memory per device, for the "fits" verdict (device_kind as libtpu reports it).
HBM_BYTES = {"TPU v4": 32 << 30, "TPU v5 lite": 16 << 30, "TPU v5": 95 << 30, "TPU v6 lite": 32 << 30}
INSTALL = 'pip install "jax[tpu]==0.10.2" (libtpu==0.0.42.1)'


class TopologyError(ValueError):
    """A topology that cannot be compiled for here; the message says what to change."""


def parse_bounds(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        bounds = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise TopologyError(f"chips per host {text!r} must look like 2x2x1") from None
    return bounds + (1,) * (3 - len(bounds))


def topology_devices(topology: str = DEFAULT_TOPOLOGY, *, chips_per_host_bounds=None, num_slices: int = 1) -> list:
    """Compile-only TPU devices for a topology name such as "v5e:2x2", "v5p:2x2x1", "v6e:4x4"."""
    if xla_bridge.get_tpu_library_path() is None:
        raise TopologyError(f"compiling for a TPU topology needs libtpu, which is not installed: {INSTALL}")
    # Compile-only devices touch no TPU; don't take (or wait for) libtpu's one-process-per-host lock.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # after the line above: importing it may load libtpu

    kwargs = {"chip_config_name": "default", "num_slices": num_slices}
    if chips_per_host_bounds is not None:
        kwargs["chips_per_host_bounds"] = tuple(chips_per_host_bounds)
    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=topology, **kwargs).devices)
    except Exception as err:  # libtpu raises JaxRuntimeError / RuntimeError with its own text
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "lockfile" in text:
            raise TopologyError(f"libtpu is locked by another process ({text}); set ALLOW_MULTIPLE_LIBTPU_LOAD=1 "
                                "before jax starts") from err
        if "INVALID_ARGUMENT" in text or "invalid" in text.lower():
            raise TopologyError(f"unknown or unsupported TPU topology {topology!r}: {text}. Use a name like "
                                "v5e:2x2, v5e:4x4, v5p:2x2x1, v4:2x2x1 or v6e:2x2") from err
        raise TopologyError(f"could not make TPU topology {topology!r} ({text}); is libtpu working? {INSTALL}") from err


def memory_stats(compiled) -> dict[str, int]:
    """Per-device bytes from `memory_analysis()`: argument, output, temp, generated_code, alias, and
    total = argument + output - alias + temp + generated_code (donated state is counted once)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    out = {name: int(getattr(stats, f"{name}_size_in_bytes", 0) or 0) for name in MEMORY_FIELDS}
    out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"] + out["generated_code"]
    return out


def compile_for_topology(config: RunConfig, topology: str = DEFAULT_TOPOLOGY, *, chips_per_host_bounds=None,
                         num_slices: int = 1) -> dict:
    """AOT-compile `config`'s train step for `topology`, the mesh from `config.mesh` over its chips.

    Returns {"compiled", "topology", "device_kind", "devices", "mesh", "memory"}; `memory` is
    `memory_stats(compiled)` (bytes per device)."""
    devices = topology_devices(topology, chips_per_host_bounds=chips_per_host_bounds, num_slices=num_slices)
    setup = build(config, devices=devices)
    compiled, _ = compile_steps(setup, with_eval=False)
    return {"compiled": compiled, "topology": topology, "device_kind": devices[0].device_kind,
            "devices": len(devices), "mesh": dict(setup.mesh.shape), "memory": memory_stats(compiled),
            "global_batch": config.train.global_batch, "grad_accum": config.optim.grad_accum,
            "remat": config.model.remat}


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count < 2**30 else f"{count / 2**30:.2f} GiB"


def summary(result: dict) -> str:
    """One line: where it was compiled for, and the per-device memory of the train step."""
    mesh = " ".join(f"{k}={v}" for k, v in result["mesh"].items())
    head = f"{result['topology']} ({result['devices']} x {result['device_kind']}, mesh {mesh})"
    memory = result["memory"]
    if not memory:
        return f"{head}: memory analysis unavailable"
    parts = ", ".join(f"{name} {_mib(memory[name])}" for name in ("argument", "output", "temp", "generated_code"))
    line = f"{head}: per device {parts}; total {_mib(memory['total'])}"
    capacity = HBM_BYTES.get(result["device_kind"])
    if capacity and memory["total"] <= capacity:
        line += f" (fits in {_mib(capacity)} HBM)"
    elif capacity:
        line += (f" (does NOT fit in {_mib(capacity)} HBM: over by {_mib(memory['total'] - capacity)}; "
                 f"{'; '.join(knobs(result, capacity)) or 'a topology with more chips'})")
    return line


def knobs(result: dict, capacity: int) -> list[str]:
    """What would bring the step under `capacity`: the train state sharded over more chips when it is
    not spread over all of them, recomputed activations, and the largest batch whose activations fit."""
    memory, mesh = result["memory"], result["mesh"]
    advice = []
    spread = mesh["fsdp"] * mesh["tensor"]
    if spread < result["devices"]:
        state = memory["argument"] * spread // result["devices"]
        advice.append(f"mesh.rules=fsdp mesh.fsdp=-1 mesh.data=1 (the train state over all {result['devices']} "
                      f"chips: about {_mib(state)} of {_mib(memory['argument'])} per chip)")
    if result["remat"] == "none":
        advice.append("model.remat=full (recompute activations in the backward pass)")
    room = capacity - (memory["total"] - memory["temp"])
    batch, accum, shards = result["global_batch"], result["grad_accum"], mesh["data"] * mesh["fsdp"]
    if 0 < room < memory["temp"]:
        rows = batch // accum * room / memory["temp"]  # activations scale with the micro-batch's rows
        steps = next((k for k in range(accum + 1, batch + 1)
                      if batch % k == 0 and (batch // k) % shards == 0 and batch // k <= rows), None)
        if steps is not None:
            advice.append(f"optim.grad_accum={steps} (micro-batches of {batch // steps} rows, the same global batch)")
    return advice
