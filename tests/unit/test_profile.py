"""`jaxlm bench --profile`'s op classes, on a real compiled step's HLO and a real jax.profiler trace (CPU)."""
import gzip
import json

import jax
import optax
import pytest

from jaxlm.nn.attention import dot_product_attention
from jaxlm.objectives.losses import weighted_cross_entropy
from jaxlm.train.profile import CLASSES, format_profile, kernel_name, op_class, parse_hlo, profile_steps, summarize

VOCAB, WIDTH, HEADS = 512, 64, 4
OPTIMIZER = optax.adamw(1e-3)


def loss(params, ids):
    hidden = params["embed"][ids]
    hidden = jax.nn.gelu(hidden @ params["up"]) @ params["down"]
    heads = hidden.reshape(*ids.shape, HEADS, WIDTH // HEADS)
    hidden = dot_product_attention(heads, heads, heads).reshape(hidden.shape)
    total, _, count = weighted_cross_entropy(hidden @ params["embed"].T, ids)
    return total / count


@jax.jit
def train_step(params, opt_state, ids):
    grads = jax.grad(loss)(params, ids)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


@pytest.fixture(scope="module")
def step():
    keys = jax.random.split(jax.random.key(0), 4)
    params = {"embed": jax.random.normal(keys[0], (VOCAB, WIDTH)) * 0.02,
              "up": jax.random.normal(keys[1], (WIDTH, 4 * WIDTH)) * 0.02,
              "down": jax.random.normal(keys[2], (4 * WIDTH, WIDTH)) * 0.02}
    ids = jax.random.randint(keys[3], (8, 32), 0, VOCAB)
    args = (params, OPTIMIZER.init(params), ids)
    return args, train_step.lower(*args).compile()


def test_every_op_of_a_step_gets_the_class_its_source_says(step):
    _, compiled = step
    instructions, computations = parse_hlo(compiled.as_text())
    assert instructions and computations
    classes = {name: op_class(name, instructions, computations) for name in instructions}
    assert set(classes.values()) <= set(CLASSES)
    for name, kind in classes.items():
        op_name = instructions[name].op_name
        if "attention_core" in op_name:
            assert kind == "attention", (name, op_name)
        elif instructions[name].opcode == "dot":
            assert kind == "matmuls", (name, op_name)
        elif "cross_entropy" in op_name and instructions[name].opcode not in ("dot", "fusion"):
            assert kind == "embedding and loss", (name, op_name)
        elif op_name and "jvp(" not in op_name and instructions[name].opcode != "fusion":
            assert kind == "optimizer and metrics", (name, op_name)


def _runner(step):
    """A function that runs the compiled step once more on its own last state."""
    (params, opt_state, ids), compiled = step
    state = [params, opt_state]

    def run():
        state[:] = compiled(state[0], state[1], ids)
        return state[0]
    return run


def test_a_traced_step_is_summarised_by_class(step, tmp_path):
    summary = profile_steps(_runner(step), 3, tmp_path, step[1].as_text())
    ms = summary["ms_per_step"]
    assert list(ms) == list(CLASSES)
    for kind in ("matmuls", "attention", "embedding and loss", "optimizer and metrics"):
        assert ms[kind] > 0, (kind, summary)
    assert ms["collectives"] == 0 and ms["host gaps"] >= 0
    assert summary["traced_ms_per_step"] > 0 and summary["top_ops"] == summary["ops"][:10]
    assert len(summary["ops"]) > 10 and sum(op["ms"] for op in summary["ops"]) == pytest.approx(sum(ms.values())
                                                                                             - ms["host gaps"])
    kernels = summary["kernels_per_step"]  # each op of the HLO runs once a step here
    assert list(kernels) == list(CLASSES) and all(k == int(k) for k in kernels.values())
    assert kernels["matmuls"] >= 3 and kernels["optimizer and metrics"] >= 1 and kernels["collectives"] == 0
    assert all(op["launches"] == 1 for op in summary["top_ops"])
    assert list(tmp_path.rglob("*.xplane.pb"))
    assert "matmuls" in format_profile(summary) and "roofline bound" not in format_profile(summary)
    first = dict(summary["top_ops"][0], bound_ms=0.0625)
    bounded = format_profile(summary | {"bound_ms_per_step": dict.fromkeys(CLASSES[:-1], 0.125),
                                        "top_ops": [first, *summary["top_ops"][1:]]})
    lines = bounded.splitlines()
    assert "roofline bound ms" in lines[0]
    assert [line.endswith(" 0.125") for line in lines[1:len(CLASSES) + 1]] == [True] * (len(CLASSES) - 1) + [False]
    assert f"{first['op']} ({first['class']}) {first['ms']:.3f} ms in 1, bound 0.062" in bounded


def test_kernels_inside_command_buffers_are_classed_by_their_names(step, tmp_path):
    """XLA's GPU trace: every kernel of a command buffer (CUDA graph) gives the buffer as its hlo_op, a fusion's
    kernel is named after the fusion, and library kernels (cuBLAS, cuDNN) have names of their own. The same
    trace rewritten that way, on a GPU timeline with a GEMM and a cuDNN attention kernel added, gives the
    same classes plus those two."""
    hlo = step[1].as_text()
    cpu = profile_steps(_runner(step), 2, tmp_path, hlo)
    trace = next(p for p in tmp_path.rglob("*.trace.json.gz") if "perfetto" not in p.name)
    events = json.load(gzip.open(trace, "rt"))["traceEvents"]
    gpu_pid = max(e.get("pid", 0) for e in events) + 1
    ops = [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    for e in ops:
        e.update(pid=gpu_pid, name=kernel_name(e["args"]["hlo_op"]))
        e["args"] = dict(e["args"], hlo_op="command_buffer_1")
    library = [dict(ops[0], name="nvjet_sm90_tst_128x160_64x5_2x4_h_bz_NTT"),
               dict(ops[1], name="cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3")]
    events += library + [{"ph": "M", "name": "process_name", "pid": gpu_pid, "args": {"name": "/device:GPU:0"}}]
    rewritten = tmp_path / "gpu.trace.json.gz"
    with gzip.open(rewritten, "wt") as f:
        json.dump({"traceEvents": events}, f)
    gpu = summarize(rewritten, hlo, 2)
    added = {"matmuls": library[0]["dur"], "attention": library[1]["dur"]}
    for kind in CLASSES:
        assert gpu["ms_per_step"][kind] == pytest.approx(
            cpu["ms_per_step"][kind] + added.get(kind, 0) * 1e-3 / 2, rel=1e-6, abs=1e-9), kind
    assert {o["op"] for o in gpu["top_ops"]} & {o["op"] for o in cpu["top_ops"]}
