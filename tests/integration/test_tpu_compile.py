"""The splash attention kernel: its numbers on the CPU (Pallas interpret mode) against the xla kernel,
and the real train step compiled for a 4-chip TPU v5e topology on this CPU-only machine (libtpu's
compile-only devices), with the Pallas kernel found in the HLO and memory numbers that scale.

The TPU compiles run in this process: conftest's JAX_PLATFORMS=cpu keeps the runtime on the CPU,
and `get_topology_desc` still loads libtpu for compile-only devices.
"""
import os
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from conftest import run_cli
from jaxlm import config as config_lib
from jaxlm.config import MeshConfig
from jaxlm.nn.attention import dot_product_attention
from jaxlm.nn.splash import splash_attention
from jaxlm.parallel.mesh import make_mesh, tree_shardings
from jaxlm.parallel.rules import rules_for

# ---------------------------------------------------------------- interpret mode on the CPU


def _inputs(batch=2, length=128, heads=4, kv_heads=2, dim=32, seed=0):
    q, k, v, w = (jax.random.normal(key, shape) for key, shape in zip(
        jax.random.split(jax.random.key(seed), 4),
        [(batch, length, heads, dim), (batch, length, kv_heads, dim), (batch, length, kv_heads, dim),
         (batch, length, heads, dim)]))
    lengths = jnp.array([length, length - 37, 5, length - 1][:batch])
    padding = jnp.arange(length)[None] < lengths[:, None]
    # Two packed documents per row (the split point differs per row), padding after them.
    segments = (jnp.arange(length)[None] >= jnp.array([40, 3, 128, 90][:batch])[:, None]).astype(jnp.int32)
    return q, k, v, w, padding, segments


def _outputs_and_grads(kernel, q, k, v, weights, real, **kw):
    """Attention output and the gradients of a random projection of its real rows."""
    def f(q, k, v):
        return dot_product_attention(q, k, v, kernel=kernel, **kw)

    def loss(q, k, v):
        return jnp.sum(f(q, k, v) * weights * real)

    return jax.jit(f)(q, k, v), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


def _compare(q, k, v, w, padding, **kw):
    real = padding[:, :, None, None].astype(q.dtype)
    out_x, grads_x = _outputs_and_grads("xla", q, k, v, w, real, padding_mask=padding, **kw)
    out_s, grads_s = _outputs_and_grads("splash", q, k, v, w, real, padding_mask=padding, **kw)
    # Padding queries differ by design (splash lets them see only padding keys); compare real rows.
    np.testing.assert_allclose(np.asarray(out_s * real), np.asarray(out_x * real), atol=1e-5, rtol=0)
    for name, gs, gx in zip("qkv", grads_s, grads_x):
        np.testing.assert_allclose(np.asarray(gs), np.asarray(gx), atol=1e-4, rtol=0, err_msg=f"d{name}")
    assert float(jnp.abs(out_s * real).max()) > 0.1  # the comparison was not of zeros


@pytest.mark.parametrize("case", ["padding", "causal", "causal+segments", "segments"])
def test_splash_matches_xla_in_interpret_mode(case):
    q, k, v, w, padding, segments = _inputs()  # 4 query heads over 2 kv heads (grouped-query)
    _compare(q, k, v, w, padding, causal="causal" in case,
             segment_ids=segments if "segments" in case else None)


def test_splash_multi_query_matches_xla():
    q, k, v, w, padding, _ = _inputs(kv_heads=1, seed=1)
    _compare(q, k, v, w, padding, causal=True)


def test_splash_under_a_mesh_matches_xla():
    """shard_map over data x fsdp (batch) and tensor (heads) on the 8 simulated CPU devices."""
    q, k, v, w, padding, segments = _inputs(batch=4, heads=4, kv_heads=2, seed=2)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules_for("fsdp_tp")):
        _compare(q, k, v, w, padding, causal=True, segment_ids=segments)
        lowered = jax.jit(lambda q, k, v: splash_attention(q, k, v, causal=True, scale=0.1)).lower(q, k, v)
    assert "shard_map" in lowered.as_text() or "manual" in lowered.as_text()


def test_splash_rejects_lengths_the_kernel_cannot_tile():
    q = jnp.zeros((1, 100, 2, 32))
    with pytest.raises(ValueError, match=r"multiples of 128.*max_seq_length=128.*attention_kernel=xla"):
        splash_attention(q, q, q, scale=1.0)
    with pytest.raises(ValueError, match="kv heads must divide heads"):
        splash_attention(jnp.zeros((1, 128, 3, 32)), jnp.zeros((1, 128, 2, 32)), jnp.zeros((1, 128, 2, 32)), scale=1.0)


# ---------------------------------------------------------------- compiled for a TPU topology

def _libtpu_missing() -> bool:
    from jax._src import xla_bridge
    return xla_bridge.get_tpu_library_path() is None


tpu = pytest.mark.skipif(_libtpu_missing(), reason='needs libtpu: pip install "jax[tpu]==0.10.2"')
TOPOLOGY = "v5e:2x2"
# BERT, seq 128, head_dim 64, small enough to compile in seconds but with a batch-sized MLM head.
BERT = ["model.hidden_size=128", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=512",
        "model.vocab_size=8192", "model.dtype=bfloat16", "model.attention_dropout=0.0", "data.max_seq_length=128",
        "data.max_predictions=20", "mesh.rules=fsdp", "mesh.data=1", "mesh.fsdp=-1"]


BASE_CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "bert-tiny.yaml"


def _bert(kernel: str, batch: int):
    return config_lib.load(BASE_CONFIG, [*BERT, f"model.attention_kernel={kernel}", f"train.global_batch={batch}"])


@pytest.fixture(scope="module")
def splash_bert():
    from jaxlm.train.aot import compile_for_topology
    return {batch: compile_for_topology(_bert("splash", batch), TOPOLOGY) for batch in (16, 256)}


@tpu
def test_bert_train_step_with_splash_compiles_to_the_pallas_kernel(splash_bert):
    result = splash_bert[16]
    assert result["devices"] == 4 and result["device_kind"] == "TPU v5 lite"
    assert result["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    hlo = result["compiled"].as_text()
    assert 'custom_call_target="tpu_custom_call"' in hlo
    # forward with residuals, and both backward kernels; "segmented" = the padding mask went in as segment ids
    for name in ("splash_mha_fwd_segmented_residuals", "splash_mha_dq_segmented", "splash_mha_dkv_segmented"):
        assert name in hlo, name


@tpu
def test_memory_analysis_numbers_scale_with_the_batch(splash_bert):
    small, big = splash_bert[16]["memory"], splash_bert[256]["memory"]
    assert small["temp"] > 0 and small["argument"] > 0 and small["generated_code"] > 0
    # 16x the rows per chip (4 -> 64): the growth is at least a few [60 more rows, 128, 128] bf16 activations
    # (6.4 -> 17.1 MiB). A smaller step tells little: at 4 -> 16 rows the parameter-sized buffers (the 8192-row
    # table's gradient, the fsdp gathers) dominate, and the compiler's packing of them moved temp by 1.3 MiB when
    # the Dense bias gradient went to float32, as much as the activations grew.
    assert big["temp"] - small["temp"] > 4 * (60 * 128 * 128 * 2), (small, big)
    # same parameters and optimiser state, a few more bytes of batch
    assert big["argument"] > small["argument"] and big["argument"] - small["argument"] < 0.1 * small["argument"]


@tpu
def test_cli_compile_with_xla_has_no_pallas_kernel(monkeypatch, capsys, tmp_path):
    """`jaxlm compile CONFIG overrides --topology` through the command line's parser and handler."""
    from jaxlm import cli
    from jaxlm.train import aot

    seen = {}
    original = aot.compile_for_topology

    def spy(*args, **kwargs):
        seen["result"] = original(*args, **kwargs)
        return seen["result"]

    monkeypatch.setattr(aot, "compile_for_topology", spy)
    args = cli.parser().parse_args(["compile", str(BASE_CONFIG), *BERT, "model.attention_kernel=xla",
                              "train.global_batch=16", "--topology", TOPOLOGY, "--json"])
    args.handler(args)
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("v5e:2x2 (4 x TPU v5 lite, mesh data=1 fsdp=4 tensor=1): per device argument")
    assert "temp" in line and "fits in 16.00 GiB HBM" in line
    hlo = seen["result"]["compiled"].as_text()
    assert "tpu_custom_call" not in hlo and "splash" not in hlo
    assert seen["result"]["memory"]["temp"] > 0


@tpu
def test_unknown_topology_says_what_to_use():
    from jaxlm.train.aot import OFF_VM_HOST, TopologyError, topology_devices

    with pytest.raises(TopologyError, match=r"unknown or unsupported TPU topology 'v9z:2x2'.*v5e:2x2"):
        topology_devices("v9z:2x2")
    with pytest.raises(TopologyError, match=r"^--chips-per-host 3x3x1 does not fit TPU topology 'v5e:2x2': .*"
                                            r"leave it out for libtpu's default"):  # once blamed on the topology
        topology_devices("v5e:2x2", chips_per_host_bounds=(3, 3, 1))
    assert not set(OFF_VM_HOST) & set(os.environ)  # the trainer would take TPU_WORKER_HOSTNAMES for a cluster's


@tpu
def test_the_command_prints_its_line_and_none_of_libtpus_off_vm_complaints():
    """libtpu loads in this fresh process; off a TPU VM it logged five lines with an INVALID_ARGUMENT error."""
    proc = run_cli("compile", BASE_CONFIG, *BERT, "--topology", TOPOLOGY, devices=1)
    assert proc.stdout.startswith("v5e:2x2 (4 x TPU v5 lite, mesh data=1 fsdp=4 tensor=1): per device argument")
    for complaint in ("INVALID_ARGUMENT", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE"):
        assert complaint not in proc.stderr, proc.stderr


@tpu
def test_llama_style_decoder_with_splash_compiles_for_tpu():
    """Causal, grouped-query (8 heads over 4 kv heads), packed and padded; heads split over tensor."""
    from jaxlm.models.decoder import CausalLM
    from jaxlm.models.presets import model_config
    from jaxlm.objectives.losses import weighted_cross_entropy
    from jaxlm.train.aot import topology_devices

    cfg = model_config("llama-tiny", vocab_size=1024, num_layers=2, num_kv_heads=4, attention_kernel="splash",
                       dtype="bfloat16")
    assert (cfg.num_heads, cfg.kv_heads, cfg.head_dim) == (8, 4, 32)
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=2, rules="fsdp_tp"), topology_devices(TOPOLOGY))
    rules = rules_for("fsdp_tp")
    model = CausalLM(cfg)
    batch, length = 8, 128
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None))
    ids = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=rows)
    mask = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=rows)

    def loss(params, ids, segments, padding):
        logits = model.apply({"params": params}, ids, segment_ids=segments, padding_mask=padding)
        total, _, count = weighted_cross_entropy(logits[:, :-1], ids[:, 1:], padding[:, 1:])
        return total / count

    with nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((batch, length), jnp.int32)))
    shardings = tree_shardings(mesh, rules, boxed)["params"]
    params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nn.unbox(boxed)["params"], shardings)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        compiled = jax.jit(jax.grad(loss), out_shardings=shardings).lower(params, ids, ids, mask).compile()
    hlo = compiled.as_text()
    for name in ("splash_mha_fwd_segmented_residuals", "splash_mha_dq_segmented", "splash_mha_dkv_segmented"):
        assert name in hlo, name
    # each chip runs the kernel on its shard: 8 rows / (data x fsdp = 2), 8 heads / tensor 2, kv heads 4 / 2
    assert "bf16[4,4,128,32]" in hlo and "bf16[4,2,128,32]" in hlo
    stats = compiled.memory_analysis()  # (libtpu reports temp 0 for this small program)
    assert 0 < stats.output_size_in_bytes < stats.argument_size_in_bytes  # grads: the params' shards, no batch


@tpu
def test_a_step_too_big_for_the_topology_says_by_how_much_and_which_knob(capsys):
    """The 1B Llama at its full batch on 4 v4 chips: XLA refuses it before compiling, and the command
    says so in one line, exit 1 (with optim.grad_accum=8, the advice, it compiles to 15.06 GiB)."""
    from jaxlm import cli

    config = pathlib.Path(__file__).resolve().parents[2] / "configs" / "llama-1b.yaml"
    args = cli.parser().parse_args(["compile", str(config), "--topology", "v4:2x2x1"])
    with pytest.raises(SystemExit) as stopped:
        args.handler(args)
    assert stopped.value.code == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("v4:2x2x1 (8 x TPU v4, mesh data=1 fsdp=8 tensor=1): does NOT fit: HLO temporaries need ")
    assert "train state 1.54 GiB per device" in line
    assert line.endswith("optim.grad_accum=8 (micro-batches of 64 rows, the same global batch)")
