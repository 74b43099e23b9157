"""Compile the train step for a TPU topology or for H100 GPUs without them: does this config fit, how much
memory, and (`--plan`) what its kernels ask of the device?

With libtpu installed (`pip install "jax[tpu]==0.10.2"`, libtpu 0.0.42.1), `get_topology_desc` gives
compile-only TPU devices on any machine, CPU-only ones included; with JAX's CUDA plugin (`jax-cuda12-plugin`
and `jax-cuda12-pjrt`, no CUDA libraries, no driver) it gives compile-only H100s from XLA's description of
the GPU (`gpu_targets.py`). The trainer's own `build` and `compile_steps` then lay the mesh over them and
compile the real step, and `memory_analysis()` says what each device would hold.
`jaxlm compile CONFIG [overrides] --topology v5e:2x2` (or `h100`, `h100:8`, `h100:2x8`) prints one line.
"""
from __future__ import annotations

import contextlib
import os
import re

import jax
from jax._src import xla_bridge

from jaxlm.config import RunConfig
from jaxlm.entry import tpu_device_files
from jaxlm.errors import first_line
from jaxlm.train import flops, gpu_targets, hlo_cost
from jaxlm.train.gpu_targets import TopologyError
from jaxlm.train.loop import build, compile_steps
from jaxlm.train.state import state_bytes

DEFAULT_TOPOLOGY = "v5e:2x2"
MEMORY_FIELDS = ("argument", "output", "temp", "generated_code", "alias")
# High-bandwidth memory per device, for the "fits" verdict (device_kind as libtpu reports it). A compile-only
# v4 device is one TensorCore, half a 32 GiB chip (v4:2x2x1 has 8 devices); a v5p device is a whole chip.
HBM_BYTES = {"TPU v4": 16 << 30, "TPU v5 lite": 16 << 30, "TPU v5": 95 << 30, "TPU v6 lite": 32 << 30,
             **gpu_targets.MEMORY_BYTES}
# XLA's refusal when the step cannot fit, e.g. "the total memory required for HLO temporaries (72.03G)
# exceeds available HBM (15.25G)" or "Used 20.5G of 15.48G hbm"; its G is 2**30 bytes.
UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
OUT_OF_MEMORY = (re.compile(r"required for (?P<what>[\w ]+?) \((?P<need>[\d.]+)(?P<need_unit>[KMGT]?)\) exceeds "
                            r"available HBM \((?P<have>[\d.]+)(?P<have_unit>[KMGT]?)\)"),
                 re.compile(r"Used (?P<need>[\d.]+)(?P<need_unit>[KMGT]?) of (?P<have>[\d.]+)(?P<have_unit>[KMGT]?) hbm"))
INSTALL = 'pip install "jax[tpu]==0.10.2" (libtpu==0.0.42.1)'


def parse_bounds(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        bounds = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise TopologyError(f"chips per host {text!r} must look like 2x2x1") from None
    return bounds + (1,) * (3 - len(bounds))


# Off a TPU VM, libtpu asks the VM's metadata for these as it loads and, finding none, logs five lines with an
# INVALID_ARGUMENT error before it makes the devices. The devices are the topology named, whatever these say:
# v4, v5e, v5p and v6e topologies gave the same devices, hosts and coordinates with and without them.
OFF_VM_HOST = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost"}


@contextlib.contextmanager
def _off_vm_host_named():
    """OFF_VM_HOST in the environment while libtpu loads, where it has no TPU (no /dev/accel* or /dev/vfio) and
    the user set none of them; then taken out again, since the trainer reads TPU_WORKER_HOSTNAMES as a cluster's."""
    added = {} if tpu_device_files() or any(name in os.environ for name in OFF_VM_HOST) else OFF_VM_HOST
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


MAX_SLICES = 1024
TOPOLOGY_NAMES = "use a name like v5e:2x2, v5e:4x4, v5p:2x2x1, v4:2x2x1 or v6e:2x2, or for GPUs h100, h100:8"


def topology_devices(topology: str = DEFAULT_TOPOLOGY, *, chips_per_host_bounds=None, num_slices: int = 1) -> list:
    """Compile-only devices for a TPU topology name such as "v5e:2x2", "v5p:2x2x1", "v6e:4x4", or a GPU one
    such as "h100", "h100:8" (one host's GPUs), "h100:2x8" (hosts x GPUs)."""
    if not topology.strip():  # libtpu's words for it: "does not support extra create_options if no topology_name"
        raise TopologyError(f"--topology is empty; {TOPOLOGY_NAMES}")
    if not 1 <= num_slices <= MAX_SLICES:  # libtpu made 400,000 devices for 100,000 (24 s); 2^31-1 aborted it
        raise TopologyError(f"--num-slices {num_slices}: give 1 to {MAX_SLICES} slices (a multislice job's TPU slices)")
    if gpu_targets.is_gpu(topology):
        if chips_per_host_bounds is not None or num_slices != 1:
            raise TopologyError(f"--chips-per-host and --num-slices are TPU settings; for GPUs name hosts and GPUs "
                                f"in the topology, e.g. {topology.split(':')[0]}:2x8")
        return gpu_targets.devices(topology)
    if xla_bridge.get_tpu_library_path() is None:
        raise TopologyError(f"compiling for a TPU topology needs libtpu, which is not installed: {INSTALL}")
    # Compile-only devices touch no TPU; don't take (or wait for) libtpu's one-process-per-host lock.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # after the line above: importing it may load libtpu

    kwargs = {"chip_config_name": "default", "num_slices": num_slices}
    if chips_per_host_bounds is not None:
        kwargs["chips_per_host_bounds"] = tuple(chips_per_host_bounds)
    try:
        with _off_vm_host_named():
            return list(topologies.get_topology_desc(platform="tpu", topology_name=topology, **kwargs).devices)
    except Exception as err:  # libtpu raises JaxRuntimeError / RuntimeError with its own text
        text = first_line(err)
        if "lockfile" in text:
            raise TopologyError(f"libtpu is locked by another process ({text}); set ALLOW_MULTIPLE_LIBTPU_LOAD=1 "
                                "before jax starts") from err
        if chips_per_host_bounds is not None and "chips_per_host" in text:
            shown = "x".join(map(str, chips_per_host_bounds))
            raise TopologyError(f"--chips-per-host {shown} does not fit TPU topology {topology!r}: {text}; leave it "
                                "out for libtpu's default, or give bounds the topology divides into") from err
        if "INVALID_ARGUMENT" in text or "invalid" in text.lower():
            raise TopologyError(f"unknown or unsupported TPU topology {topology!r}: {text}; {TOPOLOGY_NAMES}") from err
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
                         num_slices: int = 1, plan: bool = False) -> dict:
    """AOT-compile `config`'s train step for `topology`, the mesh from `config.mesh` over its chips.

    Returns {"compiled", "topology", "device_kind", "devices", "mesh", "memory"}; `memory` is
    `memory_stats(compiled)` (bytes per device). When XLA refuses the step for want of memory, "compiled"
    is None and "exhausted" holds what it said: {"what", "need", "available", "state"} (bytes per device).
    With `plan`, "plan" is `hlo_cost.plan` of one device's step and "model_gflop" the MFU formula's FLOPs per
    device and step."""
    if plan and not gpu_targets.is_gpu(topology):
        # TPU's HLO writes matmuls as convolutions of many layouts, whose FLOPs hlo_cost does not count reliably
        raise TopologyError(f"--plan reads a GPU's compiled step; {topology!r} is a TPU topology: use h100 or "
                            "compile without --plan")
    devices = topology_devices(topology, chips_per_host_bounds=chips_per_host_bounds, num_slices=num_slices)
    figures = flops.roofline(devices[0].device_kind, config.bench.peak_flops_per_device) if plan else None
    if plan and figures is None:
        raise TopologyError(f"no peak FLOP/s or memory bandwidth known for {devices[0].device_kind!r} to plan "
                            "with; set bench.peak_flops_per_device, or compile without --plan")
    gpu = gpu_targets.is_gpu(topology)
    with gpu_targets.cudnn_attention_traced() if gpu else contextlib.nullcontext():
        setup = build(config, devices=devices)
        result = {"topology": topology, "device_kind": devices[0].device_kind, "devices": len(devices),
                  "mesh": dict(setup.mesh.shape), "global_batch": config.train.global_batch,
                  "seq_len": config.data.max_seq_length,
                  "grad_accum": config.optim.grad_accum, "remat": config.model.remat}
        try:
            compiled, _ = compile_steps(setup, with_eval=False,
                                        compiler_options=gpu_targets.COMPILER_OPTIONS if gpu else None)
        except jax.errors.JaxRuntimeError as err:
            exhausted = out_of_memory(str(err))
            if exhausted is None:
                reason = first_line(err)
                raise TopologyError(f"XLA could not compile the step for {topology}: {reason}") from err
            state = state_bytes(setup.abstract)
            return result | {"compiled": None, "memory": {}, "exhausted": exhausted | {"state": state}}
    result |= {"compiled": compiled, "memory": memory_stats(compiled)}
    if plan:
        tokens = config.train.global_batch * config.data.max_seq_length / len(devices)
        result |= {"plan": hlo_cost.plan(compiled.as_text(), *figures),
                   "model_gflop": setup.objective.flops_per_token() * tokens / 1e9}
    return result


def out_of_memory(message: str) -> dict | None:
    """{"what", "need", "available"} (bytes) from XLA's RESOURCE_EXHAUSTED message; None for any other error."""
    if "RESOURCE_EXHAUSTED" not in message:
        return None
    for pattern in OUT_OF_MEMORY:
        found = pattern.search(message)
        if found:
            fields = found.groupdict()
            return {"what": fields.get("what") or "the step",
                    "need": int(float(fields["need"]) * UNITS[fields["need_unit"]]),
                    "available": int(float(fields["have"]) * UNITS[fields["have_unit"]])}
    return None


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count < 2**30 else f"{count / 2**30:.2f} GiB"


def summary(result: dict) -> str:
    """One line: where it was compiled for, and the per-device memory of the train step."""
    mesh = " ".join(f"{k}={v}" for k, v in result["mesh"].items())
    head = f"{result['topology']} ({result['devices']} x {result['device_kind']}, mesh {mesh})"
    if "exhausted" in result:
        return f"{head}: {refusal(result)}"
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


def refusal(result: dict) -> str:
    """XLA's own out-of-memory verdict, and what would bring the step under it."""
    exhausted = result["exhausted"]
    need, available, state = exhausted["need"], exhausted["available"], exhausted["state"]
    # knobs() reasons from memory_analysis() fields; the state is the argument and XLA's need the temporaries
    memory = {"argument": state, "temp": need, "total": state + need}
    advice = knobs(result | {"memory": memory}, available) or ["a topology with more chips"]
    return (f"does NOT fit: {exhausted['what']} need {_mib(need)} per device of {_mib(available)} HBM available "
            f"(over by {_mib(need - available)}; train state {_mib(state)} per device); {'; '.join(advice)}")


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
