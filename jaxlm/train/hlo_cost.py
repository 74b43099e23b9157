"""What a compiled step asks of its device, read from the optimised HLO without running it: each kernel's
FLOPs and the bytes of its operands and results, summed by op class (`profile.CLASSES`), and the roofline
time they bound. It reads a GPU's HLO, where matmuls are dots (TPU's writes many as convolutions).

A kernel is an instruction the device launches: a fusion, a custom call (a library GEMM), a collective, an
unfused op; those inside a loop count once per known trip. Its FLOPs are those of the dots it contains. Its
bytes are what it reads and writes: of an operand it only slices, the slices; of a buffer it updates in
place, the update (a scanned layer's share of the stacked weights); of one it only gathers from
(through slices and elementwise ops), the elements gathered; of anything else, all of it, though a
kernel may read less. Its roofline time is the larger of its FLOPs at the device's dense bf16 peak (float32
dots at half of it, as TF32 runs, or at the CUDA cores' rate at HIGHEST precision; FP8 at twice) and its
bytes at the memory bandwidth; a collective's bytes cross the links between GPUs instead, and a library call
other than a GEMM (cuDNN's attention) counts its bytes alone. The sum is a bound the step cannot beat, and
the classes say where it is memory-bound: a plan to compare variants by before a GPU measures them (`jaxlm
compile --topology h100 --plan`), and beside a measurement (`jaxlm bench --profile`)."""
from __future__ import annotations

import math
import re
from collections import defaultdict

from jaxlm.train import flops
from jaxlm.train.profile import CLASSES, COLLECTIVES, Instruction, contents, kernel_class, op_class, parse_hlo

NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
               "partition-id", "replica-id", "add-dependency", "domain", "async-update"}
CONTROL = {"call", "while", "async-start"}  # launch what their computations hold (a conditional: one branch)
SLICES = {"slice", "dynamic-slice"}
# ops between a parameter and a gather that read no more of it than the gather takes: elementwise ones and slices
PASSING_TO_GATHERS = {"slice", "reshape", "convert", "add", "subtract", "multiply", "divide", "maximum", "minimum",
                      "negate", "exponential", "select", "compare"}
ELEMENT_BITS = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16, "bf16": 16,
                "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128}
# A dot's rate relative to the bf16 peak, by its left operand's element type (fp8 types all start "f8"); float32
# at HIGHEST precision runs on the CUDA cores, about a fifteenth of the tensor cores' bf16 peak on an H100
DOT_RATE = {"f32": 0.5, "f64": 1 / 16, "f8": 2.0}
FULL_FLOAT32_RATE = 1 / 15
PLAN_CLASSES = tuple(c for c in CLASSES if c != "host gaps")
# Bytes that cross the links per byte of a collective's operand: a ring all-reduce sends each byte out and back
LINK_FACTOR = {"all-reduce-start": 2.0, "all-reduce": 2.0}

_ARRAY = re.compile(r"\b([a-z]\w*?)\[([\d,]*)\]")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_LHS_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_EPILOGUE = re.compile(r'"epilogue":"(\w+)"')  # a library GEMM's: what it does to its result before writing it
_HIGHEST = re.compile(r'operand_precision=\{highest|"operand_precision":\["HIGHEST"')


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """(element type, dimensions) of every array in an HLO result type (one, or a tuple's)."""
    return [(kind, tuple(int(d) for d in dims.split(",") if d)) for kind, dims in _ARRAY.findall(shape)
            if kind in ELEMENT_BITS or kind.startswith("f8")]


def shape_bytes(shape: str) -> float:
    """Bytes of every array in an HLO result type."""
    return sum(math.prod(dims) * ELEMENT_BITS.get(kind, 8) / 8 for kind, dims in arrays(shape))


def dot_flops(instruction: Instruction, instructions: dict[str, Instruction]) -> tuple[float, float]:
    """(FLOPs, its rate relative to the bf16 peak) of a dot or a library GEMM call; (0, 1) for anything else."""
    if instruction.opcode not in ("dot", "custom-call") or not instruction.operands:
        return 0.0, 1.0
    if instruction.opcode == "custom-call" and kernel_class(instruction.target) != "matmuls":
        return 0.0, 1.0  # cuDNN's attention also names dot dimensions in its config, of two products
    lhs = instructions.get(instruction.operands[0])
    if lhs is None or not arrays(lhs.shape) or not arrays(instruction.shape):
        return 0.0, 1.0
    (kind, lhs_dims), (_, out_dims) = arrays(lhs.shape)[0], arrays(instruction.shape)[0]
    found = (_LHS_CONTRACTING if instruction.opcode == "dot" else _GEMM_CONTRACTING).search(instruction.attributes)
    if found is None:
        return 0.0, 1.0
    contracting = [int(d.strip('" ')) for d in found.group(1).split(",") if d.strip('" ')]
    rate = next((r for prefix, r in DOT_RATE.items() if kind.startswith(prefix)), 1.0)
    if kind == "f32" and _HIGHEST.search(instruction.attributes):
        rate = FULL_FLOAT32_RATE
    return 2.0 * math.prod(out_dims) * math.prod(lhs_dims[d] for d in contracting), rate


class Module:
    """An optimised HLO module's instructions, computations, and who reads each instruction."""

    def __init__(self, hlo_text: str):
        self.instructions, self.computations = parse_hlo(hlo_text)
        self.entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo_text, re.M).group(1)
        self.users = defaultdict(list)
        for name, instruction in self.instructions.items():
            for operand in instruction.operands:
                self.users[operand].append(name)

    def root(self, computation: str) -> Instruction:
        names = self.computations.get(computation, ())
        return self.instructions[next((n for n in names if self.instructions[n].root), names[-1])]

    def parameter(self, computation: str, number: int) -> str | None:
        return next((n for n in self.computations.get(computation, ()) if self.instructions[n].number == number), None)

    def read_bytes(self, kernel: Instruction, index: int) -> float:
        """Bytes a kernel reads of its operand `index`: the slices it takes of it, the elements it gathers of it,
        nothing of a buffer it updates in place (a scanned layer's stacked weights and activations), else all
        of it."""
        operand = kernel.operands[index]
        if operand not in self.instructions:
            return 0.0
        if index == 0 and kernel.opcode in SLICES:
            return shape_bytes(kernel.shape)
        if index == 0 and kernel.opcode == "dynamic-update-slice":
            return 0.0
        parameter = self.parameter(kernel.calls[0], index) if kernel.opcode == "fusion" and kernel.calls else None
        aliases = self._aliases(parameter) if parameter else set()
        whole = shape_bytes(self.instructions[operand].shape)
        gathered = (math.prod(arrays(kernel.shape)[0][1]) if index == 0 and kernel.opcode == "gather"
                    else self._gathered_elements(aliases) if parameter else None)
        if gathered is not None:
            return min(whole, gathered * ELEMENT_BITS.get(arrays(self.instructions[operand].shape)[0][0], 8) / 8)
        uses = [self.instructions[u] for a in aliases for u in self.users.get(a, ())
                if self.instructions[u].opcode != "bitcast"]
        if uses and all(u.opcode in SLICES | {"dynamic-update-slice"} and u.operands[0] in aliases for u in uses):
            return sum(shape_bytes(u.shape) for u in uses if u.opcode in SLICES)
        return whole

    def _gathered_elements(self, names: set[str]) -> int | None:
        """Elements the gathers read of a fusion's parameter (`names`: it and its bitcasts), where every use of it
        reaches a gather's operand through slices and elementwise ops (a label's logit picked from the logits, which
        a bias is added to); None where any use reads it otherwise or none reaches a gather (the fusion's result).
        """
        total = None
        for name in names:
            for user in self.users.get(name, ()):
                use = self.instructions[user]
                if use.opcode == "bitcast":
                    continue  # among `names`
                if use.opcode == "gather" and use.operands[0] == name:
                    found = math.prod(arrays(use.shape)[0][1])
                elif use.opcode in PASSING_TO_GATHERS:
                    found = self._gathered_elements(self._aliases(user))
                else:
                    return None
                if found is None:
                    return None
                total = (total or 0) + found
        return total

    def _aliases(self, name: str) -> set[str]:
        """`name` and the bitcasts of it."""
        found = {name}
        for user in self.users.get(name, ()):
            if self.instructions[user].opcode == "bitcast":
                found |= self._aliases(user)
        return found

    def written_bytes(self, kernel: Instruction) -> float:
        """Bytes a kernel writes: of an in-place update, the update rather than the whole buffer."""
        if kernel.opcode.removesuffix("-start") in COLLECTIVES:
            return 0.0  # what a collective sends is its operand, counted once, as it crosses the links
        root = self.root(kernel.calls[0]) if kernel.opcode == "fusion" and kernel.calls else kernel
        parts = [self.instructions[o] for o in root.operands] if root.opcode == "tuple" else [root]
        if not any(p.opcode == "dynamic-update-slice" for p in parts):
            return shape_bytes(kernel.shape)
        return sum(shape_bytes(self.instructions[p.operands[1]].shape) if p.opcode == "dynamic-update-slice"
                   else shape_bytes(p.shape) for p in parts)


def kernels(hlo_text: str) -> list[dict]:
    """Every kernel the step launches: {"name", "class", "launches", "flops", "bf16_equivalent_flops",
    "bytes", "epilogue"}, of all its launches; the second weighs each dot by its rate (DOT_RATE); the last
    names a library GEMM's epilogue (BIAS, BIAS_GELU_AUX, ...; DEFAULT: none) and is None for other kernels.
    A loop's body and condition count once per known trip (once when unknown); of a conditional's branches, the
    costliest."""
    module = Module(hlo_text)
    instructions = module.instructions

    def visit(computation: str, launches: int) -> list[dict]:
        found = []
        for name in module.computations.get(computation, ()):
            instruction = instructions[name]
            if instruction.opcode == "conditional":
                branches = [visit(called, launches) for called in instruction.calls]
                found += max(branches, key=lambda ks: sum(k["bytes"] for k in ks), default=[])
            elif instruction.opcode in CONTROL:
                trips = _TRIP_COUNT.search(instruction.attributes) if instruction.opcode == "while" else None
                for called in instruction.calls:
                    found += visit(called, launches * (int(trips.group(1)) if trips else 1))
            elif instruction.opcode not in NOT_KERNELS and not instruction.opcode.endswith("-done"):
                found.append(_kernel(name, module, launches))
        return found

    return visit(module.entry, 1)


def _kernel(name: str, module: Module, launches: int) -> dict:
    """One kernel's class, FLOPs and bytes, times its launches."""
    total = weighted = 0.0
    for part in contents(name, module.instructions, module.computations):
        count, rate = dot_flops(part, module.instructions)
        total, weighted = total + count, weighted + count / rate
    own = module.instructions[name]
    moved = module.written_bytes(own) + sum(module.read_bytes(own, i) for i in range(len(own.operands)))
    epilogue = _EPILOGUE.search(own.attributes) if own.opcode == "custom-call" else None
    return {"name": name, "class": op_class(name, module.instructions, module.computations), "launches": launches,
            "flops": total * launches, "bf16_equivalent_flops": weighted * launches, "bytes": moved * launches,
            "link_factor": LINK_FACTOR.get(own.opcode, 1.0), "epilogue": epilogue.group(1) if epilogue else None}


def timed_kernels(hlo_text: str, peak_flops: float, bandwidth: float, link_bandwidth: float | None) -> list[dict]:
    """`kernels` with each one's roofline milliseconds ("compute_ms", "memory_ms" and the larger, "ms")."""
    found = kernels(hlo_text)
    for k in found:
        if k["class"] == "collectives":
            k["compute_ms"] = 0.0
            k["memory_ms"] = k["bytes"] * k["link_factor"] / link_bandwidth * 1e3 if link_bandwidth else 0.0
        else:
            k["compute_ms"] = k["bf16_equivalent_flops"] / peak_flops * 1e3
            k["memory_ms"] = k["bytes"] / bandwidth * 1e3
        k["ms"] = max(k["compute_ms"], k["memory_ms"])
    return found


def plan(hlo_text: str, peak_flops: float, bandwidth: float, link_bandwidth: float | None = None,
         top: int = 8) -> dict:
    """Per class: kernel launches, GFLOP, GB moved and roofline milliseconds (per kernel the larger of its
    FLOPs at `peak_flops` and its bytes at `bandwidth`; a collective's bytes at `link_bandwidth`, untimed
    without it), with the totals, the `top` costliest kernels, and the launches of library GEMMs by epilogue
    (the bias or activation fused into a GEMM's write)."""
    per_class = {c: defaultdict(float) for c in PLAN_CLASSES}
    epilogues = defaultdict(int)
    found = timed_kernels(hlo_text, peak_flops, bandwidth, link_bandwidth)
    for k in found:
        if k["epilogue"]:
            epilogues[k["epilogue"]] += k["launches"]
        row = per_class[k["class"]]
        row["launches"] += k["launches"]
        row["gflop"] += k["flops"] / 1e9
        row["gb"] += k["bytes"] / 1e9
        row["ms"] += k["ms"]
        row["memory_bound_ms"] += k["ms"] if k["memory_ms"] > k["compute_ms"] else 0.0
    keys = ("launches", "gflop", "gb", "ms", "memory_bound_ms")
    classes = {c: {key: row[key] for key in keys} for c, row in per_class.items()}
    total = {key: sum(row[key] for row in classes.values()) for key in keys}
    costliest = sorted(found, key=lambda k: -k["ms"])[:top]
    return {"peak_flops": peak_flops, "bandwidth": bandwidth, "link_bandwidth": link_bandwidth,
            "classes": classes, "total": total, "gemm_epilogues": dict(sorted(epilogues.items())),
            "top": [{key: k[key] for key in ("name", "class", "launches", "ms", "compute_ms", "memory_ms")}
                    for k in costliest]}


def step_bounds(hlo_text: str, device_kind: str, peak_override: float = 0.0) -> dict | None:
    """Roofline milliseconds of a step compiled for a GPU of `device_kind`: per op class ("classes"), and per
    launch of each kernel ("per_launch", by name; XLA compiles identical fusions into one kernel named after
    one of them, which a trace then shows launched once for each). What `jaxlm bench --profile` prints beside
    the measured ones. None where the GPU's peak or bandwidth is not known (CPUs)."""
    figures = flops.roofline(device_kind, peak_override)
    if figures is None:
        return None
    found = timed_kernels(hlo_text, *figures)
    return {"classes": {c: sum(k["ms"] for k in found if k["class"] == c) for c in PLAN_CLASSES},
            "per_launch": {k["name"]: k["ms"] / k["launches"] if k["launches"] else 0.0 for k in found}}


def format_plan(result: dict, model_gflop: float | None = None) -> str:
    """The plan as a table, one row per class and the total."""
    figures = f"{result['peak_flops'] / 1e12:.0f} TFLOP/s bf16, {result['bandwidth'] / 1e12:.2f} TB/s"
    if result.get("link_bandwidth"):
        figures += f", links {result['link_bandwidth'] / 1e9:.0f} GB/s"
    lines = [f"roofline plan ({figures}):",
             f"{'op class':<24} {'kernels':>8} {'GFLOP':>9} {'GB moved':>9} {'bound ms':>9} {'memory-bound':>13}"]
    for name, row in [*result["classes"].items(), ("total", result["total"])]:
        share = row["memory_bound_ms"] / row["ms"] if row["ms"] else 0.0
        lines.append(f"{name:<24} {row['launches']:>8.0f} {row['gflop']:>9.1f} {row['gb']:>9.2f} {row['ms']:>9.3f} "
                     f"{share:>13.0%}")
    if model_gflop:
        lines.append(f"model FLOPs (the MFU formula): {model_gflop:.1f} GFLOP per step; the HLO's dots: "
                     f"{result['total']['gflop']:.1f}")
    if result.get("gemm_epilogues"):
        lines.append("library GEMMs by epilogue: " + ", ".join(f"{name} {count}"
                                                              for name, count in result["gemm_epilogues"].items()))
    lines.append("costliest kernels: " + ", ".join(f"{k['name']} ({k['class']}) {k['ms']:.3f} ms"
                                                   for k in result["top"]))
    return "\n".join(lines)
