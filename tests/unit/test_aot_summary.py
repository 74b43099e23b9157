"""`jaxlm compile`'s verdict: a step that does not fit says by how much and which knobs would help."""
from jaxlm.train.aot import summary

GIB = 2**30


def result(argument, temp, mesh, remat="none", batch=512, accum=1):
    memory = {"argument": argument, "output": argument, "alias": argument, "temp": temp, "generated_code": 0}
    memory["total"] = argument + temp
    return {"topology": "v5p:4x4x4", "devices": 64, "device_kind": "TPU v5", "mesh": mesh, "memory": memory,
            "global_batch": batch, "grad_accum": accum, "remat": remat}


def test_a_step_that_fits_says_so():
    line = summary(result(10 * GIB, 20 * GIB, {"data": 1, "fsdp": 64, "tensor": 1}))
    assert line.endswith("total 30.00 GiB (fits in 95.00 GiB HBM)")


def test_a_step_that_does_not_fit_names_the_overflow_and_the_knobs():
    line = summary(result(40 * GIB, 80 * GIB, {"data": 16, "fsdp": 4, "tensor": 1}))
    assert "does NOT fit in 95.00 GiB HBM: over by 25.00 GiB" in line
    assert "mesh.rules=fsdp mesh.fsdp=-1 mesh.data=1 (the train state over all 64 chips: about 2.50 GiB" in line
    assert "model.remat=full" in line
    # 55 GiB of room for 80 GiB of activations: at most 352 rows a micro-batch, so 2 micro-batches of 256
    assert "optim.grad_accum=2 (micro-batches of 256 rows, the same global batch)" in line


def test_a_fully_sharded_rematerialised_step_only_lowers_the_micro_batch():
    line = summary(result(10 * GIB, 170 * GIB, {"data": 1, "fsdp": 64, "tensor": 1}, remat="full"))
    assert "over by 85.00 GiB" in line and "mesh.rules" not in line and "remat" not in line
    assert "optim.grad_accum=2 (micro-batches of 256 rows" in line  # 85 GiB of room for 170
