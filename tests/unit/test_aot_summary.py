"""`jaxlm compile`'s verdict: a step that does not fit says by how much and which knobs would help."""
from jaxlm.train.aot import out_of_memory, summary

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


def test_xla_out_of_memory_messages_are_read_in_binary_units():
    message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
               "(72.03G) exceeds available HBM (15.25G).")
    assert out_of_memory(message) == {"what": "HLO temporaries", "need": int(72.03 * GIB), "available": int(15.25 * GIB)}
    other = "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.5G of 15.48G hbm."
    assert out_of_memory(other) == {"what": "the step", "need": int(20.5 * GIB), "available": int(15.48 * GIB)}
    assert out_of_memory("INVALID_ARGUMENT: Used 20.5G of 15.48G hbm") is None


def test_a_step_xla_refuses_names_the_overflow_and_the_knobs():
    refused = result(0, 0, {"data": 1, "fsdp": 64, "tensor": 1}, remat="full") | {
        "memory": {}, "exhausted": {"what": "HLO temporaries", "need": 72 * GIB, "available": 15 * GIB, "state": 3 * GIB}}
    line = summary(refused)
    assert "does NOT fit: HLO temporaries need 72.00 GiB per device of 15.00 GiB HBM available (over by 57.00 GiB; " \
           "train state 3.00 GiB per device)" in line
    # 12 GiB of room for 72 GiB of activations: at most 85 rows, so 8 micro-batches of 64
    assert line.endswith("optim.grad_accum=8 (micro-batches of 64 rows, the same global batch)")
