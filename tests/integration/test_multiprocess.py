"""2 processes x 4 devices train and checkpoint; the checkpoint restores in 1 process x 8 devices. A stop one process
asks for stops both with its reason."""
import os
import subprocess
import sys

import jax
import numpy as np

from conftest import ROOT, free_port, run_cli, xla_flags
from jaxlm import config as config_lib
from jaxlm.train import checkpoint
from jaxlm.train.faults import HANG_EXIT
from jaxlm.train.loop import build
from jaxlm.train.metrics import read_jsonl

EXTRA = {"mesh": {"data": 2, "fsdp": 2, "tensor": 2, "rules": "fsdp_tp"},
         "train": {"steps": 6, "checkpoint_every": 3, "log_every": 1, "global_batch": 16}}


def _losses(run_dir):
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"]


def test_two_processes_train_and_restore_on_one(tiny_config, tmp_path):
    multi_dir, single_dir = tmp_path / "multi", tmp_path / "single"
    multi = tiny_config({**EXTRA, "train": {**EXTRA["train"], "run_dir": str(multi_dir)}}, "multi.yaml")
    single = tiny_config({**EXTRA, "train": {**EXTRA["train"], "run_dir": str(single_dir)}}, "single.yaml")
    env = dict(os.environ, JAXLM_TOTAL_DEVICES="8", JAXLM_BIN=str(ROOT / ".venv" / "bin" / "jaxlm"))
    env["XLA_FLAGS"] = xla_flags(None)
    proc = subprocess.run(["bash", str(ROOT / "launch" / "local_multiprocess.sh"), "2", str(multi)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 processes" in proc.stdout + proc.stderr
    run_cli("train", single)

    multi_losses, single_losses = _losses(multi_dir), _losses(single_dir)
    assert len(multi_losses) == 6
    np.testing.assert_allclose(multi_losses, single_losses, rtol=2e-5)

    config = config_lib.load(multi, [])
    setup = build(config)
    mngr = checkpoint.manager(multi_dir / "checkpoints", 3, async_save=False)
    assert mngr.all_steps() == [3, 6]
    restored, position, saved_config = checkpoint.restore(mngr, setup.abstract)
    assert position == {"step": 6} and saved_config["mesh"]["rules"] == "fsdp_tp"
    assert jax.process_count() == 1 and len(jax.devices()) == 8
    for leaf in jax.tree.leaves(restored.params):
        assert dict(leaf.sharding.mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}

    single_mngr = checkpoint.manager(single_dir / "checkpoints", 3, async_save=False)
    single_state, _, _ = checkpoint.restore(single_mngr, setup.abstract)
    tree = config_lib.merge(config_lib.load_tree(multi), {"mesh": {"data": 8, "fsdp": 1, "tensor": 1, "rules": "dp"}})
    dp = config_lib.from_dict(tree)
    dp_setup = build(dp)
    dp_state, _, _ = checkpoint.restore(mngr, dp_setup.abstract)
    flat = jax.tree_util.tree_leaves_with_path(restored.params)
    for (path, on_tp), on_dp, single in zip(flat, jax.tree.leaves(dp_state.params), jax.tree.leaves(single_state.params)):
        name = jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(on_tp), np.asarray(on_dp), err_msg=name)
        np.testing.assert_allclose(np.asarray(on_tp), np.asarray(single), rtol=1e-4, atol=1e-6, err_msg=name)
    assert int(dp_state.step) == 6


STOP_SCRIPT = """
import sys, time
import jax
process, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
from jaxlm.train.faults import StopRequests, stop_status
with StopRequests(multiprocess=True, message=lambda _: None) as stop:
    for step in range(1, 1000):
        if process == 1 and step == 3:
            stop.ask("train.time_limit_minutes=0.5")
        time.sleep(0.02)
        if stop.reached(step):
            print(step, stop_status(stop.reason), stop.reason)
            break
"""


def test_every_process_gives_the_stop_the_reason_of_the_one_that_asked():
    """Process 1's time limit stops both processes at one step (JAX's preemption sync), and both give its reason and
    exit status: process 0, told only that there was a stop, once said SIGTERM and exited 143 where 1 exited 75."""
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1))
    processes = [subprocess.Popen([sys.executable, "-c", STOP_SCRIPT, str(index), str(port)], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for index in (0, 1)]
    said = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-3000:] for _, err in said]
    lines = [out.strip().splitlines()[-1].split(" ", 2) for out, _ in said]  # after Gloo's own lines
    assert lines[0] == lines[1] and lines[0][1:] == [str(HANG_EXIT), "train.time_limit_minutes=0.5"], lines
