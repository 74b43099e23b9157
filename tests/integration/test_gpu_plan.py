"""`jaxlm compile --topology h100 --plan` on this GPU-less machine: the real train step compiled for a
compile-only H100 by JAX's CUDA plugin (`make install` puts it in .venv/cuda-plugin), its memory, and a
roofline plan whose matmul FLOPs equal the MFU formula's; the bad inputs stop in one line before compute."""
import functools
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from jaxlm import config as config_lib
from jaxlm.train import gpu_targets

PLUGIN = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / gpu_targets.PLUGIN_FOLDER),
                                                      os.environ.get("PYTHONPATH", "")) if p)}


@functools.cache  # the same plan (bert-tiny or gpt2-tiny on one H100) is read by several tests: compiled once
def _plan(config, *overrides, topology="h100", xla_flags=None):
    proc = run_cli("compile", config, *overrides, "--topology", topology, "--plan", "--json", devices=1,
                   env_extra=PLUGIN if xla_flags is None else {**PLUGIN, "XLA_FLAGS": xla_flags})
    return proc.stdout, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config, overrides, tolerance", [
    ("configs/bert-tiny.yaml", [], 0.01), ("configs/gpt2-tiny.yaml", ["model.dtype=bfloat16"], 0.01),
    ("configs/t5-tiny.yaml", [], 0.1),
    # our Pallas (Triton) flash kernels lower for an H100 inside the real step; their dots are not the HLO's
    ("configs/t5-tiny.yaml", ["model.attention_kernel=flash"], 0.25)])
def test_plan_of_the_real_step_on_an_h100(config, overrides, tolerance):
    out, result = _plan(config, *overrides)
    assert result["device_kind"] == "NVIDIA H100 80GB HBM3" and result["devices"] == 1
    assert "fits in 79.10 GiB HBM" in out and "roofline plan (989 TFLOP/s bf16, 3.35 TB/s, links 450 GB/s)" in out
    plan = result["plan"]
    # the HLO's dots are the model's matmuls (T5's formula leaves out its relative-position bias lookups)
    assert plan["total"]["gflop"] == pytest.approx(result["model_gflop"], rel=tolerance)
    assert plan["classes"]["matmuls"]["gflop"] > 0.8 * plan["total"]["gflop"]
    for name in ("matmuls", "attention", "norms and elementwise", "embedding and loss", "optimizer and metrics"):
        assert plan["classes"][name]["launches"] > 0 and plan["classes"][name]["ms"] > 0, name
    assert plan["classes"]["collectives"]["launches"] == 0  # one device
    assert plan["total"]["ms"] == pytest.approx(sum(row["ms"] for row in plan["classes"].values()))
    assert result["memory"]["temp"] > 0
    assert plan["gemm_epilogues"] and "library GEMMs by epilogue: " in out


def test_cudnn_attention_compiles_into_the_plan():
    """cuDNN's attention traced for the compile-only H100 (JAX's checks answered from the target description):
    forward and backward custom calls in every layer, in the attention class, counted by their bytes alone; the
    model's own matmuls as with XLA's attention."""
    _, xla = _plan("configs/bert-tiny.yaml", "model.dtype=bfloat16")
    _, cudnn = _plan("configs/bert-tiny.yaml", "model.dtype=bfloat16", "model.attention_kernel=cudnn")
    layers = config_lib.load(ROOT / "configs/bert-tiny.yaml").model.num_layers
    attention = cudnn["plan"]["classes"]["attention"]
    assert attention["launches"] >= 2 * layers and attention["gflop"] == 0 and attention["gb"] > 0
    assert xla["plan"]["classes"]["attention"]["gflop"] > 0
    assert cudnn["plan"]["classes"]["matmuls"]["gflop"] == pytest.approx(xla["plan"]["classes"]["matmuls"]["gflop"],
                                                                         rel=0.01)


def test_gpt2s_tanh_gelu_is_applied_by_the_gemm_before_it():
    """In bfloat16 on a GPU, the first GEMM of each of GPT-2's MLPs adds its bias and applies the tanh GELU as it
    writes (cuBLASLt's BIAS_GELU_AUX epilogue, also keeping the pre-activation for the backward pass), where a
    separate kernel would read and write the [tokens, 4 x hidden] activation once more; the other GEMMs with a
    bias add it as they write."""
    _, result = _plan("configs/gpt2-tiny.yaml", "model.dtype=bfloat16")
    layers = config_lib.load(ROOT / "configs/gpt2-tiny.yaml").model.num_layers
    epilogues = result["plan"]["gemm_epilogues"]
    assert epilogues.get("BIAS_GELU_AUX") == layers and epilogues.get("BIAS", 0) >= 3 * layers, epilogues


def test_the_projections_stay_separate_gemms_on_gpus():
    """jaxlm turns XLA's dot merger off for GPUs (xla_options.GPU_XLA_OPTIONS): the queries', keys' and values'
    projections of bert-tiny stay three GEMMs each way, the same FLOPs; XLA_FLAGS that name the passes decide."""
    case = ("configs/bert-tiny.yaml", "model.dtype=bfloat16", "model.attention_kernel=cudnn")
    ours = _plan(*case)[1]["plan"]["classes"]
    theirs = _plan(*case, xla_flags="--xla_disable_hlo_passes=")[1]["plan"]["classes"]
    assert ours["matmuls"]["launches"] > theirs["matmuls"]["launches"]
    assert ours["matmuls"]["gflop"] == pytest.approx(theirs["matmuls"]["gflop"])
    assert ours["norms and elementwise"]["gb"] < theirs["norms and elementwise"]["gb"]


def test_eight_gpus_split_the_batch_and_all_reduce():
    _, one = _plan("configs/bert-tiny.yaml")
    _, eight = _plan("configs/bert-tiny.yaml", topology="h100:8")
    assert eight["devices"] == 8 and eight["mesh"]["data"] == 8
    collectives = eight["plan"]["classes"]["collectives"]
    # data parallel: the float32 gradients are all-reduced once, as big as the parameters (a third of the
    # state's arguments: parameters and AdamW's two moments), each byte twice over NVLink
    assert collectives["launches"] >= 1
    assert collectives["gb"] * 1e9 == pytest.approx(eight["memory"]["argument"] / 3, rel=0.05)
    assert collectives["ms"] == pytest.approx(2 * collectives["gb"] * 1e9 / 450e9 * 1e3)
    assert eight["model_gflop"] == pytest.approx(one["model_gflop"] / 8)
    assert eight["plan"]["classes"]["matmuls"]["gflop"] == pytest.approx(one["plan"]["classes"]["matmuls"]["gflop"] / 8,
                                                                          rel=0.01)


@pytest.mark.parametrize("args, env, expected", [
    (["model.attention_kernel=cudnn", "model.dtype=float32", "--topology", "h100"], PLUGIN,
     "model.attention_kernel='cudnn' computes in bfloat16 or float16, not model.dtype='float32'"),
    (["--topology", "h100:0"], PLUGIN, "GPU topology 'h100:0' must look like h100, h100:8 or h100:2x8"),
    # these were "could not make compile-only h100 devices ...; pip install jax-cuda12-plugin", the plugin installed
    (["--topology", "h100:00x8"], PLUGIN, "GPU topology 'h100:00x8' must look like h100, h100:8 or h100:2x8"),
    (["--topology", f"h100:{10 ** 20}"], PLUGIN, f"GPU topology 'h100:{10 ** 20}' must look like h100"),
    (["--topology", "v5e:2x2", "--plan"], {}, "--plan reads a GPU's compiled step; 'v5e:2x2' is a TPU topology"),
    (["--topology", "h100"], {"PYTHONPATH": ""},
     "needs JAX's CUDA plugin, which is not installed: pip install jax-cuda12-plugin=="),
    (["--topology", "h100", "--num-slices", "2"], PLUGIN, "--chips-per-host and --num-slices are TPU settings"),
])
def test_bad_input_stops_in_one_line(args, env, expected):
    if expected.startswith("needs JAX's CUDA plugin") and gpu_targets.plugin_installed():
        pytest.skip("the CUDA plugin is installed in this environment itself")
    proc = run_cli("compile", "configs/bert-tiny.yaml", *args, devices=1, check=False, env_extra=env)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("jaxlm compile: error:") and expected in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_bench_gpu_plan_tables_a_real_case(tmp_path):
    """bench/gpu.py --plan: BERT-base at 512 on cuDNN's attention, one row of the table."""
    proc = subprocess.run([sys.executable, "bench/gpu.py", "--plan", "--cases", "bert512", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| bert512 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| case |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    values = dict(zip(columns, cells))
    classes = ["matmuls", "attention", "norms and elementwise", "embedding and loss", "optimizer and metrics"]
    assert float(values["bound ms"]) == pytest.approx(sum(float(values[c]) for c in classes), abs=0.05)
    assert float(values["matmuls"]) > 1 and int(values["kernels"]) > 100


INITIALISER = """
import contextlib
import jax, flax.linen as nn
from jaxlm import config as config_lib
from jaxlm.parallel.mesh import replicated
from jaxlm.train import aot, state
from jaxlm.train.loop import build
setup = build(config_lib.load("configs/bert-tiny.yaml"), devices=aot.topology_devices("h100"))
key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=replicated(setup.mesh))
for kernel in (False, True):
    drawing = state.threefry_kernel() if kernel else contextlib.nullcontext()
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules), drawing:
        initializer = state.state_initializer(setup.objective.init, setup.optimizer, setup.shardings)
        text = initializer.lower(key).compile().as_text()
    print(kernel, text.count('custom_call_target="cu_threefry2x32'), text.count("xor("))
print("after", getattr(jax.config, state.THREEFRY_KERNEL))
"""


def test_the_initialiser_draws_with_the_threefry_kernel_on_a_gpu():
    """The state's initialiser compiled for a compile-only H100: under `threefry_kernel()` each random draw is
    JAX's CUDA threefry kernel (no threefry rounds left in XLA's fusions); without it, the rounds are fused
    (what took T5-base's initialiser 150 s to compile); the option is restored after."""
    proc = subprocess.run([sys.executable, "-c", INITIALISER], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", **PLUGIN))
    assert proc.returncode == 0, proc.stderr[-3000:]
    fused, kernel, after = proc.stdout.strip().splitlines()[-3:]
    calls, fused_xors = map(int, fused.split()[1:])
    assert fused.startswith("False") and calls == 0
    calls, xors = map(int, kernel.split()[1:])
    # bert-tiny's 18 normal draws and their keys; one xor a draw is left, combining the kernel's two words
    assert kernel.startswith("True") and calls >= 18 and xors <= 18 and fused_xors > 10 * 18
    assert after == "after False"


FLASH_STEP = """
import jax, jax.numpy as jnp
from jax.sharding import SingleDeviceSharding
from jaxlm import config as config_lib
from jaxlm.nn import flash
from jaxlm.nn.flash import flash_attention
from jaxlm.train import aot
config = config_lib.load("configs/t5-tiny.yaml", ["model.attention_kernel=flash", "model.attention_dropout=0.1"])
text = aot.compile_for_topology(config, "h100")["compiled"].as_text()
TRITON = 'custom_call_target="__gpu$xla.gpu.triton"'
print(config.model.num_layers, config.model.decoder_layers, text.count(TRITON))
# keys of 1024 with a bias, its gradient stored (two kernels) and fused (three; the queries' kernel takes the keys
# in two groups of 8 blocks: 12 overflow shared memory)
device = SingleDeviceSharding(aot.topology_devices("h100")[0])
def spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=device)
def loss(q, k, v, bias, key):
    out = flash_attention(q, k, v, bias=bias, scale=1.0, dropout_rate=0.1, dropout_rng=key, interpret=False)
    return jnp.sum(out.astype(jnp.float32) ** 2)
key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=device)
shape = (2, 1024, 4, 64)
for bias_gradient in ("stored", "fused"):
    flash.BIAS_GRADIENT = bias_gradient
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(
        spec(shape), spec(shape), spec(shape), spec((1, 4, 1024, 1024), jnp.float32), key).compile().as_text()
    print(text.count(TRITON))
"""


def test_the_flash_kernels_are_triton_kernels_for_an_h100():
    """T5's train step with attention_kernel=flash and attention dropout compiled for a compile-only H100: each
    attention of each layer calls our Triton kernels, not Pallas's interpret-mode loops: the forward pass and the
    keys' and values' gradients, which with a bias (encoder and decoder self-attention) also write the logits'
    gradient, and without one (cross-attention) the queries' gradients; and keys of 1024 with a bias compile
    too, with the bias's gradient stored or fused."""
    proc = subprocess.run([sys.executable, "-c", FLASH_STEP], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", **PLUGIN))
    assert proc.returncode == 0, proc.stderr[-3000:]
    *step, stored, fused = proc.stdout.split()[-5:]
    encoder_layers, decoder_layers, calls = map(int, step)
    assert calls == 2 * (encoder_layers + decoder_layers) + 3 * decoder_layers
    assert (int(stored), int(fused)) == (2, 3)
