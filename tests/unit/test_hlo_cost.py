"""hlo_cost on steps compiled here: a dot's FLOPs from its shapes and contracting dimensions, weighed by its
element type; a kernel's bytes are its operands' and result's; a loop's kernels count once per trip."""
import jax
import jax.numpy as jnp
import pytest

from jaxlm.train import hlo_cost


def _compiled_text(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def _only(found, cls):
    rows = [k for k in found if k["class"] == cls]
    assert len(rows) == 1, found
    return rows[0]


def test_dot_flops_and_bytes():
    a, b = jnp.ones((64, 48), jnp.float32), jnp.ones((48, 40), jnp.float32)
    dot = _only(hlo_cost.kernels(_compiled_text(lambda x, y: x @ y, a, b)), "matmuls")
    assert dot["flops"] == 2 * 64 * 48 * 40
    assert dot["bf16_equivalent_flops"] == 2 * dot["flops"]  # float32 runs at half the bf16 rate
    assert dot["bytes"] == (64 * 48 + 48 * 40 + 64 * 40) * 4


# A GPU step's shape (the CPU widens bf16 dots to f32): three GEMM fusions of one ENTRY, by element type.
GPU_HLO = """HloModule step, is_scheduled=true

%gemm_bf16 (p0: bf16[128,64], p1: bf16[64,32]) -> bf16[128,32] {
  %p0 = bf16[128,64]{1,0} parameter(0)
  %p1 = bf16[64,32]{1,0} parameter(1)
  ROOT %dot.1 = bf16[128,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%gemm_fp8 (p2: f8e4m3fn[128,64], p3: f8e4m3fn[64,32]) -> bf16[128,32] {
  %p2 = f8e4m3fn[128,64]{1,0} parameter(0)
  %p3 = f8e4m3fn[64,32]{1,0} parameter(1)
  ROOT %dot.2 = bf16[128,32]{1,0} dot(%p2, %p3), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[128,64], b: bf16[64,32], c: f8e4m3fn[128,64], d: f8e4m3fn[64,32], q: bf16[2,64,4,32]) -> (bf16[128,32], bf16[128,32]) {
  %a = bf16[128,64]{1,0} parameter(0)
  %b = bf16[64,32]{1,0} parameter(1)
  %c = f8e4m3fn[128,64]{1,0} parameter(2)
  %d = f8e4m3fn[64,32]{1,0} parameter(3)
  %f1 = bf16[128,32]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_bf16, metadata={op_name="jit(step)/jvp(M)/dense/dot_general"}
  %f2 = bf16[128,32]{1,0} fusion(%c, %d), kind=kCustom, calls=%gemm_fp8, metadata={op_name="jit(step)/jvp(M)/dense/dot_general"}
  %g = (bf16[128,32]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp(M)/out/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]},"epilogue":"BIAS_GELU_AUX"}}
  %q = bf16[2,64,4,32]{3,2,1,0} parameter(4)
  %att = (bf16[2,64,4,32]{3,2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(step)/jvp(M)/attention_core/dot_product_attention"}, backend_config={"cudnn_fmha_backend_config":{"bmm1_dot_dimension_numbers":{"lhs_contracting_dimensions":["3"]}}}
  ROOT %t = (bf16[128,32]{1,0}, bf16[128,32]{1,0}) tuple(%f1, %f2)
}
"""


def test_element_type_sets_the_rate():
    found = {k["name"]: k for k in hlo_cost.kernels(GPU_HLO)}
    assert set(found) == {"f1", "f2", "g", "att"}  # parameters and the tuple launch nothing
    flops = 2 * 128 * 64 * 32
    assert found["f1"]["flops"] == found["f2"]["flops"] == flops
    assert found["f1"]["bf16_equivalent_flops"] == flops and found["f2"]["bf16_equivalent_flops"] == flops / 2  # FP8 at twice the rate
    assert found["f1"]["bytes"] == (128 * 64 + 64 * 32 + 128 * 32) * 2
    assert found["f2"]["bytes"] == 128 * 64 + 64 * 32 + 128 * 32 * 2
    assert found["g"]["flops"] == flops and found["g"]["class"] == "matmuls"  # a cuBLAS call
    assert found["g"]["epilogue"] == "BIAS_GELU_AUX"
    assert found["att"]["epilogue"] is None and found["f1"]["epilogue"] is None
    assert hlo_cost.plan(GPU_HLO, 1e12, 1e9)["gemm_epilogues"] == {"BIAS_GELU_AUX": 1}
    # cuDNN's attention: its bytes (three inputs and the output), no FLOPs read from its config's dimensions
    assert found["att"]["flops"] == 0 and found["att"]["class"] == "attention"
    assert found["att"]["bytes"] == 4 * 2 * 64 * 4 * 32 * 2
    assert {found[k]["class"] for k in ("f1", "f2")} == {"matmuls"}


def test_bounds_beside_a_profile():
    text = _compiled_text(lambda x, y: jnp.tanh(x @ y), jnp.ones((64, 64)), jnp.ones((64, 64)))
    bounds = hlo_cost.step_bounds(text, "NVIDIA H100 80GB HBM3")
    planned = hlo_cost.plan(text, 989e12, 3.35e12, top=100)
    assert bounds["classes"] == pytest.approx({c: row["ms"] for c, row in planned["classes"].items()})
    assert bounds["per_launch"] == pytest.approx({k["name"]: k["ms"] for k in planned["top"]})
    assert hlo_cost.step_bounds(text, "cpu") is None  # no bandwidth known: the profile prints no bound
    assert hlo_cost.step_bounds(text, "cpu", peak_override=1e12) is None


def test_a_kernels_bound_is_per_launch():
    # a profile counts a kernel's launches itself (XLA names one kernel after the first of the identical
    # fusions that run it), so the bound it prints is one launch's times those it measured
    def looped(x, y):
        return jax.lax.fori_loop(0, 4, lambda i, a: jnp.tanh(a @ y), x)

    text = _compiled_text(looped, jnp.ones((64, 64)), jnp.ones((64, 64)))
    timed = hlo_cost.timed_kernels(text, 989e12, 3.35e12, None)
    bounds = hlo_cost.step_bounds(text, "NVIDIA H100 80GB HBM3")
    in_loop = [k for k in timed if k["launches"] == 4]
    assert in_loop and all(bounds["per_launch"][k["name"]] == pytest.approx(k["ms"] / 4) for k in in_loop)


def test_contraction_over_two_dimensions():
    a, b = jnp.ones((4, 6, 8), jnp.float32), jnp.ones((6, 8, 10), jnp.float32)
    text = _compiled_text(lambda x, y: jnp.einsum("bij,ijk->bk", x, y), a, b)
    assert sum(k["flops"] for k in hlo_cost.kernels(text)) == 2 * 4 * 10 * 6 * 8


def test_loop_kernels_count_once_per_trip():
    def loop(a, b):
        return jax.lax.fori_loop(0, 5, lambda i, x: jnp.tanh(x @ b), a)

    text = _compiled_text(loop, jnp.ones((64, 32), jnp.float32), jnp.ones((32, 32), jnp.float32))
    dot = _only(hlo_cost.kernels(text), "matmuls")
    assert dot["launches"] == 5
    assert dot["flops"] == 5 * 2 * 64 * 32 * 32


def test_elementwise_bytes_are_operands_and_result():
    text = _compiled_text(lambda x: jnp.tanh(x) * 2, jnp.ones((1000,), jnp.float32))
    found = [k for k in hlo_cost.kernels(text) if k["bytes"]]
    assert sum(k["flops"] for k in found) == 0
    assert min(k["bytes"] for k in found) >= 8000  # reads 4,000 bytes, writes 4,000


def test_plan_sums_classes_and_bounds_each_kernel():
    a, b = jnp.ones((256, 256), jnp.bfloat16), jnp.ones((256, 256), jnp.bfloat16)
    text = _compiled_text(lambda x, y: jnp.tanh(x @ y).sum(), a, b)
    peak, bandwidth = 1e12, 1e9
    result = hlo_cost.plan(text, peak, bandwidth)
    assert set(result["classes"]) == set(hlo_cost.PLAN_CLASSES)
    for key in ("launches", "gflop", "gb", "ms", "memory_bound_ms"):
        assert result["total"][key] == pytest.approx(sum(row[key] for row in result["classes"].values()))
    kernels = hlo_cost.kernels(text)
    expected = sum(max(k["bf16_equivalent_flops"] / peak, k["bytes"] / bandwidth) for k in kernels) * 1e3
    assert result["total"]["ms"] == pytest.approx(expected)
    assert result["total"]["gflop"] == pytest.approx(2 * 256 ** 3 / 1e9)
    table = hlo_cost.format_plan(result, model_gflop=0.0336)
    assert "matmuls" in table and "total" in table and "the HLO's dots: 0.0" in table


def test_array_shapes_of_tuples_and_scalars():
    assert hlo_cost.arrays("(f32[], bf16[3,4]{1,0}, /*index=2*/s8[5]{0})") == [
        ("f32", ()), ("bf16", (3, 4)), ("s8", (5,))]
    assert hlo_cost.shape_bytes("(f32[], bf16[3,4]{1,0}, pred[2]{0})") == 4 + 24 + 2
    assert hlo_cost.shape_bytes("f8e4m3fn[16]{0}") == 16


def test_a_scanned_layer_reads_its_slice_of_the_stacked_weights():
    """Layers in a loop over stacked weights (model.scan_layers) move what the same layers unrolled move: a
    dynamic slice reads its slice, an in-place update writes its update, not the whole stack each trip."""
    layers, width = 8, 256
    weights, x = jnp.ones((layers, width, width)), jnp.ones((64, width))

    def scanned(w, x):
        def layer(carry, w_i):
            out = jnp.tanh(carry @ w_i)
            return out, out
        return jax.lax.scan(layer, x, w)

    def unrolled(w, x):
        outs = []
        for i in range(layers):
            x = jnp.tanh(x @ w[i])
            outs.append(x)
        return x, jnp.stack(outs)

    loop, flat = (hlo_cost.kernels(_compiled_text(f, weights, x)) for f in (scanned, unrolled))
    assert sum(k["flops"] for k in loop) == sum(k["flops"] for k in flat) == layers * 2 * 64 * width * width
    loop_bytes, flat_bytes = (sum(k["bytes"] for k in found) for found in (loop, flat))
    # counting the whole stack on every trip would read 8 x 2 MiB of weights alone
    assert loop_bytes < 1.5 * flat_bytes < layers * weights.size * 4, (loop_bytes, flat_bytes)


ASYNC_HLO = """HloModule step, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%then (p: f32[1024]) -> f32[1024] {
  %p = f32[1024]{0} parameter(0)
  ROOT %e = f32[1024]{0} exponential(%p)
}

%else (p2: f32[1024]) -> f32[1024] {
  %p2 = f32[1024]{0} parameter(0)
  %n = f32[1024]{0} negate(%p2)
  ROOT %e2 = f32[1024]{0} exponential(%n)
}

ENTRY %main (g: f32[1024], c: pred[]) -> f32[1024] {
  %g = f32[1024]{0} parameter(0)
  %c = pred[] parameter(1)
  %ars = f32[1024]{0} all-reduce-start(%g), replica_groups={}, to_apply=%add, metadata={op_name="jit(step)/psum"}
  %ard = f32[1024]{0} all-reduce-done(%ars)
  ROOT %r = f32[1024]{0} conditional(%c, %ard, %ard), true_computation=%then, false_computation=%else
}
"""


def test_a_collective_counts_once_at_the_link_and_a_conditional_its_costliest_branch():
    found = {k["name"]: k for k in hlo_cost.kernels(ASYNC_HLO)}
    assert set(found) == {"ars", "n", "e2"}  # the -done is no kernel; the else branch costs more than the then
    assert found["ars"]["class"] == "collectives" and found["ars"]["bytes"] == 4096  # its operand, once
    result = hlo_cost.plan(ASYNC_HLO, 1e12, 1e12, link_bandwidth=1e9)
    assert result["classes"]["collectives"]["ms"] == pytest.approx(2 * 4096 / 1e9 * 1e3)  # a ring sends it twice
    assert hlo_cost.plan(ASYNC_HLO, 1e12, 1e12)["classes"]["collectives"]["ms"] == 0  # no link figure: untimed


GATHER_HLO = """HloModule step, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%picks (p0: bf16[64,1000], p1: s32[64,2]) -> f32[64,1,1] {
  %p0 = bf16[64,1000]{1,0} parameter(0)
  %b = bf16[64,1,1000]{2,1,0} bitcast(%p0)
  %s = bf16[64,1,999]{2,1,0} slice(%b), slice={[0:64], [0:1], [0:999]}
  %c = f32[64,1,999]{2,1,0} convert(%s)
  %r = f32[64,999]{1,0} bitcast(%c)
  %p1 = s32[64,2]{1,0} parameter(1)
  ROOT %g = f32[64,1,1]{2,1,0} gather(%r, %p1), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
}

%picks_and_sums (q0: bf16[64,1000], q1: s32[64,2]) -> (f32[64,1,1], f32[]) {
  %q0 = bf16[64,1000]{1,0} parameter(0)
  %d = f32[64,1000]{1,0} convert(%q0)
  %q1 = s32[64,2]{1,0} parameter(1)
  %h = f32[64,1,1]{2,1,0} gather(%d, %q1), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
  %z = f32[] constant(0)
  %t = f32[] reduce(%d, %z), dimensions={0,1}, to_apply=%add
  ROOT %o = (f32[64,1,1]{2,1,0}, f32[]) tuple(%h, %t)
}

ENTRY %main (x: bf16[64,1000], i: s32[64,2]) -> (f32[64,1,1], (f32[64,1,1], f32[])) {
  %x = bf16[64,1000]{1,0} parameter(0)
  %i = s32[64,2]{1,0} parameter(1)
  %picked = f32[64,1,1]{2,1,0} fusion(%x, %i), kind=kLoop, calls=%picks
  %both = (f32[64,1,1]{2,1,0}, f32[]) fusion(%x, %i), kind=kInput, calls=%picks_and_sums
  ROOT %out = (f32[64,1,1]{2,1,0}, (f32[64,1,1]{2,1,0}, f32[])) tuple(%picked, %both)
}
"""


def test_a_kernel_reads_what_it_gathers_of_an_operand_it_only_gathers_from():
    """A label's logit picked through a slice and a conversion reads 64 of the 64,000 logits; read by a reduce as
    well, all of them."""
    found = {k["name"]: k["bytes"] for k in hlo_cost.kernels(GATHER_HLO)}
    indices, picked = 64 * 2 * 4, 64 * 4
    assert found["picked"] == 64 * 2 + indices + picked
    assert found["both"] == 64 * 1000 * 2 + indices + picked + 4
