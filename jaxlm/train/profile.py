"""A jax.profiler trace of the compiled train step, summarised per step by op class: matmuls, attention, norms
and elementwise, embedding and loss, optimizer and metrics, collectives, and the host gaps between ops.

Each op the device ran (a trace event carrying `hlo_op`) is classed from its instruction in the step's
optimised HLO: what it computes (a dot, a GEMM or cuDNN attention call, a collective, a gather or scatter)
and where it comes from (the JAX name stack in its metadata: `attention_core`, `cross_entropy`, `embeddings`,
and outside the differentiated loss, the optimizer). On the GPU, XLA runs most kernels inside command
buffers (CUDA graphs), whose events all give the buffer as `hlo_op`: there the kernel's own name leads to
the instruction (a fusion's kernel is named after it, `.` as `_`), and a library kernel (cuBLAS, cuDNN) is
classed by its name. XProf's own tools give per-op categories too, but they name XLA's fusion kinds rather
than these classes, and its package brings ~330 MB of dependencies."""
from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import jax

from jaxlm.nn.attention import ATTENTION_SCOPE
from jaxlm.objectives.losses import LOSS_SCOPE

CLASSES = ("matmuls", "attention", "norms and elementwise", "embedding and loss", "optimizer and metrics",
           "collectives", "host gaps")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
MATMUL_TARGETS = ("gemm", "matmul", "cublas", "nvjet", "xmma", "cutlass")
ATTENTION_TARGETS = ("fmha", "flash", "attention", "sdpa")
PROFILED_STEPS = 5

_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations|true_computation|false_computation)="
                    r"(%?[\w.\-]+|\{[^}]*\})")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPERAND = re.compile(r"%([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    opcode: str
    op_name: str  # the JAX name stack of its (first) source op
    target: str  # a custom call's target
    calls: tuple[str, ...]  # the computations it runs (a fusion's body, a loop's body)
    shape: str = ""  # its result type, e.g. "bf16[256,128]{1,0}" or a tuple of them
    operands: tuple[str, ...] = ()  # the instructions it reads
    attributes: str = ""  # what follows its operands (dimension numbers, backend config)
    root: bool = False  # its computation's result
    number: int = -1  # a parameter's position


def parse_hlo(text: str) -> tuple[dict[str, Instruction], dict[str, list[str]]]:
    """(instruction name -> Instruction, computation name -> the names of its instructions)."""
    instructions, computations, current = {}, defaultdict(list), None
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if match and current is not None:
            name, shape, opcode, rest = match.groups()
            operand_text, attributes = _split_operands(rest)
            calls = _CALLS.findall(attributes)
            op_name = _OP_NAME.search(rest)
            target = _TARGET.search(rest)
            instructions[name] = Instruction(
                opcode, op_name.group(1).split(";")[0] if op_name else "", target.group(1) if target else "",
                tuple(c.strip(" {}%") for group in calls for c in group.split(",") if c.strip(" {}")),
                shape, tuple(_OPERAND.findall(operand_text)), attributes, line.lstrip().startswith("ROOT "),
                int(operand_text) if opcode == "parameter" and operand_text.strip().isdigit() else -1)
            computations[current].append(name)
        elif (computation := _COMPUTATION.match(line)) and " = " not in line:
            current = computation.group(1)
        elif line.strip() == "}":
            current = None
    return instructions, dict(computations)


def _split_operands(rest: str) -> tuple[str, str]:
    """An instruction's text after `opcode(`: (its operand list, the attributes after the closing parenthesis)."""
    depth = 0
    for at, char in enumerate(rest):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return rest[:at], rest[at + 1:]
            depth -= 1
    return rest, ""


def contents(name: str, instructions: dict, computations: dict, seen: set | None = None) -> list[Instruction]:
    """The instruction and, for a fusion or call, every instruction it runs, recursively."""
    seen = set() if seen is None else seen
    own = instructions[name]
    found = [own]
    for computation in own.calls:
        if computation in seen or own.opcode == "while":  # a loop's body ops appear in the trace themselves
            continue
        seen.add(computation)
        for inner in computations.get(computation, ()):
            found += contents(inner, instructions, computations, seen)
    return found


def op_class(name: str, instructions: dict, computations: dict) -> str:
    """The class of the HLO instruction `name` (one of CLASSES, without the host gaps)."""
    if name not in instructions:
        return "norms and elementwise"
    parts = contents(name, instructions, computations)
    opcodes = {p.opcode for p in parts}
    targets = " ".join(p.target.lower() for p in parts)
    op_name = instructions[name].op_name or next((p.op_name for p in parts if p.op_name), "")
    if any(o.removesuffix("-start").removesuffix("-done") in COLLECTIVES for o in opcodes):
        return "collectives"
    library = kernel_class(targets)  # a custom call's target names its library kernel, as a kernel's name does
    if library == "attention" or ATTENTION_SCOPE in op_name:
        return "attention"
    if library == "matmuls" or opcodes & {"dot", "convolution"}:
        return "matmuls"
    if "jvp(" not in op_name:
        return "optimizer and metrics"
    if LOSS_SCOPE in op_name or opcodes & {"gather", "scatter"} or (
            "embeddings/" in op_name and "norm" not in op_name.split("embeddings/", 1)[1]):
        return "embedding and loss"
    return "norms and elementwise"


def kernel_name(instruction: str) -> str:
    """The name XLA gives the GPU kernel of an instruction (LLVM's identifier rules)."""
    return re.sub(r"[^\w]", "_", instruction)


def event_op(event: dict, instructions: dict, kernels: dict) -> str:
    """The HLO instruction a trace event ran: its `hlo_op`, unless that names a command buffer (not an
    instruction of the HLO, or a call of one); then the instruction its kernel is named after, or, for a
    library kernel, the kernel's name."""
    op = event["args"]["hlo_op"]
    if op in instructions and instructions[op].opcode != "call":
        return op
    return kernels.get(kernel_name(event.get("name", "")), event.get("name", op))


def kernel_class(kernel: str) -> str:
    """The class of a library kernel (a GEMM or attention call) known by its name alone."""
    name = kernel.lower()
    if any(t in name for t in ATTENTION_TARGETS):
        return "attention"
    if any(t in name for t in MATMUL_TARGETS):
        return "matmuls"
    return "norms and elementwise"


def _events(trace_path: Path, module: str) -> list[dict]:
    """The trace's events of ops of `module`, on the accelerator's timeline when it has one."""
    with gzip.open(trace_path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    process_names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
                     if e.get("ph") == "M" and e.get("name") == "process_name"}
    ops = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("hlo_module") == module
           and "hlo_op" in e["args"] and e.get("dur") is not None]
    on_device = [e for e in ops if re.search(r"/device:(GPU|TPU)", process_names.get(e["pid"], ""))]
    return on_device or ops


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarize(trace_path: str | Path, hlo_text: str, steps: int) -> dict:
    """Milliseconds per step of each class in CLASSES (per device: the mean over the devices traced), the
    kernels each class launches per step, the traced time per step (first op to last; a CPU runs independent
    ops at once, so the classes may sum to more), and every op with its class and launches ("ops", the
    costliest first; "top_ops": the first ten of them)."""
    module = re.search(r"^HloModule ([\w.\-]+)", hlo_text, re.M).group(1)
    instructions, computations = parse_hlo(hlo_text)
    kernels = {kernel_name(name): name for name in instructions}
    events = _events(Path(trace_path), module)
    if not events:
        raise ValueError(f"the trace {trace_path} has no op of {module}")
    by_device = defaultdict(list)
    for e in events:
        by_device[(e["pid"], e["args"].get("device_ordinal", ""))].append(e)
    per_step = 1e-3 / (steps * len(by_device))  # trace microseconds -> milliseconds per step and device
    one_launch = 1 / (steps * len(by_device))  # a launch -> launches per step and device
    classes, ops, launches, traced = dict.fromkeys(CLASSES, 0.0), defaultdict(float), defaultdict(float), 0.0
    for device_events in by_device.values():
        for e in device_events:
            op = event_op(e, instructions, kernels)
            ops[op] += e["dur"] * per_step
            launches[op] += one_launch
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in device_events]
        window = max(end for _, end in spans) - min(start for start, _ in spans)
        classes["host gaps"] += (window - _busy(spans)) * per_step
        traced += window * per_step
    kinds = {op: op_class(op, instructions, computations) if op in instructions else kernel_class(op)
             for op in ops}
    kernels_per_step = dict.fromkeys(CLASSES, 0.0)
    for op, ms in ops.items():
        classes[kinds[op]] += ms
        kernels_per_step[kinds[op]] += launches[op]
    every_op = [{"op": op, "class": kinds[op], "ms": ms, "launches": launches[op]}
                for op, ms in sorted(ops.items(), key=lambda item: -item[1])]
    return {"ms_per_step": classes, "kernels_per_step": kernels_per_step, "traced_ms_per_step": traced,
            "ops": every_op, "top_ops": every_op[:10]}


def profile_steps(run_step, steps: int, out_dir: str | Path, hlo_text: str) -> dict:
    """Runs `run_step()` `steps` times under jax.profiler, writing the trace to `out_dir`; its summary."""
    out_dir = Path(out_dir)
    before = set(out_dir.rglob("*.trace.json.gz"))
    with jax.profiler.trace(str(out_dir), create_perfetto_trace=True):
        result = None
        for _ in range(steps):
            result = run_step()
        jax.block_until_ready(result)
    traces = [p for p in out_dir.rglob("*.trace.json.gz") if p not in before and "perfetto" not in p.name]
    if not traces:
        raise RuntimeError(f"jax.profiler wrote no trace under {out_dir}")
    return summarize(max(traces, key=lambda p: p.stat().st_mtime), hlo_text, steps) | {"trace_dir": str(out_dir)}


def format_profile(summary: dict) -> str:
    total = sum(summary["ms_per_step"].values())
    bounds = summary.get("bound_ms_per_step", {})
    lines = [f"{'op class':<24} {'ms/step':>9} {'share':>7} {'kernels':>8}"
             + (f" {'roofline bound ms':>18}" if bounds else "")]
    lines += [f"{name:<24} {ms:>9.3f} {ms / max(total, 1e-12):>7.1%} {summary['kernels_per_step'][name]:>8.0f}"
              + (f" {bounds[name]:>18.3f}" if name in bounds else "") for name, ms in summary["ms_per_step"].items()]
    lines.append(f"{'traced, first op to last':<24} {summary['traced_ms_per_step']:>9.3f}")
    lines.append("costliest ops: " + ", ".join(map(op_line, summary["top_ops"])))
    return "\n".join(lines)


def op_line(op: dict) -> str:
    """One costliest op: its class, ms per step, launches per step and, where known, its roofline bound."""
    bound = f", bound {op['bound_ms']:.3f}" if "bound_ms" in op else ""
    return f"{op['op']} ({op['class']}) {op['ms']:.3f} ms in {op['launches']:.0f}{bound}"
