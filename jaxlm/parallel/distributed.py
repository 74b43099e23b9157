"""Multi-process start-up: jax.distributed.initialize when the config or the environment asks."""
from __future__ import annotations

import os

import jax

from jaxlm.config import ConfigError, DistributedConfig

_CLUSTER_ENV = ("SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "OMPI_COMM_WORLD_SIZE")


def _env_value(name: str, config_value, missing):
    raw = os.environ.get(f"JAXLM_{name.upper()}")
    if raw is None:
        return config_value
    try:
        return type(missing)(raw)
    except ValueError:
        raise ConfigError(f"environment JAXLM_{name.upper()}={raw!r} must be a {type(missing).__name__}") from None


def settings(config: DistributedConfig) -> dict:
    """Coordinator settings from the config, overridden by JAXLM_COORDINATOR/NUM_PROCESSES/PROCESS_ID."""
    return {
        "coordinator": _env_value("coordinator", config.coordinator, ""),
        "num_processes": _env_value("num_processes", config.num_processes, 0),
        "process_id": _env_value("process_id", config.process_id, -1),
        "local_device_count": _env_value("local_device_count", config.local_device_count, 0),
    }


def initialize(config: DistributedConfig) -> bool:
    """Start the distributed runtime if needed; returns whether this is a multi-process run."""
    if config.enabled not in ("auto", "true", "false"):
        raise ConfigError(f"distributed.enabled={config.enabled!r}; choose auto, true or false")
    if config.enabled == "false":
        return False
    values = settings(config)
    explicit = bool(values["coordinator"]) and values["num_processes"] > 1
    on_cluster = any(os.environ.get(name) for name in _CLUSTER_ENV)
    if not explicit and not (config.enabled == "true" or on_cluster):
        return False
    if values["local_device_count"]:
        jax.config.update("jax_num_cpu_devices", values["local_device_count"])
    if explicit:
        if not 0 <= values["process_id"] < values["num_processes"]:
            raise ConfigError(f"distributed.process_id={values['process_id']} must be in [0, {values['num_processes']})")
        jax.distributed.initialize(values["coordinator"], num_processes=values["num_processes"],
                                   process_id=values["process_id"])
    else:
        jax.distributed.initialize()
    return jax.process_count() > 1
