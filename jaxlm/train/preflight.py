"""The checks a run makes on every process before any compute (`jaxlm preflight CONFIG` runs them
alone): the mesh against the devices present, the batch against processes and batch shards, the same
config and prepared data on every process, prepared data that fits the run (its tokenizer, model and batch; every
shard readable), a run directory that is writable and shared."""
from __future__ import annotations

import hashlib
import json
import pathlib

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxlm import config as config_lib
from jaxlm.config import ConfigError, RunConfig
from jaxlm.data.pipeline import MANIFEST, check_workers, open_data
from jaxlm.parallel import distributed
from jaxlm.parallel.mesh import make_mesh
from jaxlm.train.storage import run_path


def preflight(config: RunConfig) -> tuple[list[str], tuple]:
    """Every check, on every process (all must call it); raises ConfigError naming the processes at
    fault; returns what was checked, a line each, and the data it opened: (tokenizer, train split, held-out split)."""
    timeout = config.distributed.barrier_timeout_s
    check_workers(config.data.workers, "data.workers=")
    distributed.barrier("preflight", timeout)
    mesh = make_mesh(config.mesh)
    check_batch(config, mesh)
    batch, processes = config.train.global_batch, jax.process_count()
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    same_everywhere("config", config_fingerprint(config), "give every process the same config file and overrides")
    same_everywhere("prepared data", data_fingerprint(config.data.prepared_dir),
                    f"prepare data.prepared_dir={config.data.prepared_dir} once where every process reads it")
    data = open_data(config)  # the same on every process (checked above), so any fault is every process's
    for split in data[1:]:  # a shard cut short fails here, not at its first batch after compiling
        split.check_shards()
    shared_run_dir(config.train.run_dir, timeout)
    return [f"mesh {dict(mesh.shape)} over {jax.device_count()} devices of {processes} processes",
            f"global batch {batch}: {batch // shards} rows per batch shard, {batch // processes} read by each process",
            "the same config and prepared data on every process",
            f"prepared data: {len(data[1])} train and {len(data[2])} held-out examples, every shard readable",
            f"train.run_dir={config.train.run_dir} is writable and shared"], data


def check_batch(config: RunConfig, mesh) -> None:
    batch, shards = config.train.global_batch, mesh.shape["data"] * mesh.shape["fsdp"]
    if batch % shards:
        raise ConfigError(f"train.global_batch={batch} is not divisible by the batch shards "
                          f"(mesh data x fsdp = {shards})")
    if batch % jax.process_count():
        raise ConfigError(f"train.global_batch={batch} is not divisible by the {jax.process_count()} processes")
    if (batch // config.optim.grad_accum) % shards:
        raise ConfigError(f"micro-batch {batch // config.optim.grad_accum} (global_batch / optim.grad_accum) "
                          f"is not divisible by the batch shards ({shards})")


def config_fingerprint(config: RunConfig) -> str:
    """The resolved config less the `distributed` section, whose process id differs by process."""
    tree = {k: v for k, v in config_lib.to_dict(config).items() if k != "distributed"}
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


def data_fingerprint(prepared_dir: str) -> str:
    """The prepared data's manifest and the names and sizes of its files (that of nothing without one)."""
    root = pathlib.Path(prepared_dir)
    if not (root / MANIFEST).is_file():
        return hashlib.sha256(b"no prepared data").hexdigest()
    digest = hashlib.sha256((root / MANIFEST).read_bytes())
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(root)}:{path.stat().st_size}".encode())
    return digest.hexdigest()


def same_everywhere(what: str, fingerprint: str, fix: str) -> None:
    """Raise naming the processes whose `fingerprint` differs from process 0's."""
    if jax.process_count() == 1:
        return
    mine = np.frombuffer(bytes.fromhex(fingerprint), np.uint32)
    every = np.asarray(multihost_utils.process_allgather(mine))
    differ = [i for i in range(len(every)) if not np.array_equal(every[i], every[0])]
    if differ:
        raise ConfigError(f"processes {', '.join(map(str, differ))} see a different {what} than process 0; {fix}")


def shared_run_dir(run_dir: str, timeout_s: float) -> None:
    """Each process writes a file under the run directory (train.run_dir), then looks for every other one's."""
    token = int(multihost_utils.broadcast_one_to_all(np.int32(np.random.randint(1, 2**31 - 1))))
    probe = run_path(run_dir) / f".preflight-{token}"
    me, processes = jax.process_index(), jax.process_count()
    try:
        probe.mkdir(parents=True, exist_ok=True)
        (probe / f"process-{me}").write_text(str(token))
    except Exception as err:  # OSError locally; the cloud clients' own errors (credentials, permissions)
        reason = getattr(err, "strerror", None) or str(err).strip().splitlines()[0][:300] or type(err).__name__
        raise ConfigError(f"train.run_dir={run_dir} is not writable on process {me}: {reason}") from None
    distributed.barrier("preflight-written", timeout_s)
    seen = np.array([(probe / f"process-{i}").is_file() for i in range(processes)])
    every = np.asarray(multihost_utils.process_allgather(seen)).reshape(processes, processes)
    distributed.barrier("preflight-read", timeout_s)
    if me == 0:
        probe.rmtree(missing_ok=True)
    blind = [(i, j) for i in range(processes) for j in range(processes) if not every[i, j]]
    if blind:
        pairs = "; ".join(f"process {i} cannot see what process {j} wrote" for i, j in blind[:6])
        raise ConfigError(f"train.run_dir={run_dir} is not shared by the processes ({pairs}); put it on a file "
                          "system every host mounts at the same path")
