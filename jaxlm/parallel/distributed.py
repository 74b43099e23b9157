"""Multi-process start-up: jax.distributed.initialize when the config or the environment asks, after
a rendezvous that names the processes that did not start; barriers that name the late ones."""
from __future__ import annotations

import os
import re
import socket
import time

import jax
from jax._src import distributed as jax_distributed  # the client, for barriers with a timeout (not public)

from jaxlm.config import ConfigError, DistributedConfig, check_distributed
from jaxlm.errors import first_line

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
    check_distributed(config)  # eval and finetune build this section without loading a whole run's config
    if config.enabled == "false":
        return False
    values = settings(config)
    explicit = bool(values["coordinator"]) and values["num_processes"] > 1
    on_cluster = any(os.environ.get(name) for name in _CLUSTER_ENV)
    if not explicit and not (config.enabled == "true" or on_cluster):
        return False
    if values["local_device_count"]:
        jax.config.update("jax_num_cpu_devices", values["local_device_count"])
    timeout = max(int(config.init_timeout_s), 1)
    if explicit:
        if not 0 <= values["process_id"] < values["num_processes"]:
            raise ConfigError(f"distributed.process_id={values['process_id']} must be in [0, {values['num_processes']})")
        rendezvous(values["coordinator"], values["num_processes"], values["process_id"], config.init_timeout_s)
        jax.distributed.initialize(values["coordinator"], num_processes=values["num_processes"],
                                   process_id=values["process_id"], initialization_timeout=timeout)
    else:
        try:
            jax.distributed.initialize(initialization_timeout=timeout)
        except ValueError as err:  # JAX found no cluster to read the processes from
            raise ConfigError(f"distributed.enabled={config.enabled}, but JAX found no cluster to start from "
                              f"({first_line(err)}); set distributed.coordinator (host:port), num_processes and "
                              "process_id, or distributed.enabled=auto") from None
    return jax.process_count() > 1


def coordinator_port(coordinator: str) -> int:
    """The port of a `host:port` coordinator address; the rendezvous before JAX's start listens on the next one."""
    _, colon, port = coordinator.rpartition(":")
    if not colon or not port.isdigit() or not 1 <= int(port) < 65535:
        raise ConfigError(f"distributed.coordinator={coordinator!r} must be host:port with a port from 1 to 65534 "
                          "(the next port is taken too)")
    return int(port)


def rendezvous(coordinator: str, num_processes: int, process_id: int, timeout_s: float) -> None:
    """Every process checks in with process 0 on the coordinator's port + 1 before JAX starts. JAX's own
    start-up ends every process when one is missing, without saying which; this names them.

    Process 0 waits up to `timeout_s` for the others' ids and answers each with "ok" or the missing
    ids; the others retry until process 0 listens, then wait for its answer."""
    host = coordinator.rpartition(":")[0]
    address, deadline = (host or "127.0.0.1", coordinator_port(coordinator) + 1), time.monotonic() + timeout_s
    where = f"distributed.init_timeout_s={timeout_s:g} s"
    if process_id == 0:
        _check_coordinator_port(address[1] - 1)
        _gather(address, num_processes, deadline, where)
        return
    while True:
        try:
            connection = socket.create_connection(address, timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise ConfigError(f"process 0 (the coordinator, {address[0]}:{address[1]}) did not answer within "
                                  f"{where}; start it, or check the coordinator address") from None
            time.sleep(0.2)
    with connection:
        connection.sendall(f"{process_id}\n".encode())
        connection.settimeout(max(deadline - time.monotonic(), 0) + 30)
        try:
            answer = connection.makefile().readline().strip()
        except OSError:
            answer = ""
    if not answer.startswith(("ok", "missing ")):
        raise ConfigError(f"process 0 (the coordinator, {address[0]}:{address[1]}) ended the start-up rendezvous "
                          "without an answer; see its log")
    if answer != "ok":
        raise ConfigError(f"processes {answer.removeprefix('missing ')} of {num_processes} did not start within "
                          f"{where}; start every process (or check distributed.num_processes)")


def _why(err: OSError) -> str:
    """The system's reason alone ("Address already in use"): Python's bind adds the address it tried."""
    return os.strerror(err.errno) if err.errno else str(err)


def _check_coordinator_port(port: int) -> None:
    """A ConfigError where process 0 cannot listen on the coordinator's port: JAX's service failed to start there with
    a traceback ("Failed to start RPC server"), and the other processes waited for it until the launcher ended them."""
    try:
        socket.create_server(("", port)).close()
    except OSError as err:
        raise ConfigError(f"process 0 cannot listen on the coordinator's port {port}: {_why(err)}; choose "
                          "another coordinator port (JAXLM_PORT for the launchers)") from None


def _gather(address, num_processes: int, deadline: float, where: str) -> None:
    arrived: dict[int, socket.socket] = {}
    try:
        server = socket.create_server(("", address[1]))
    except OSError as err:
        raise ConfigError(f"process 0 cannot listen on port {address[1]} (the coordinator's port + 1) for the "
                          f"start-up rendezvous: {_why(err)}; choose another coordinator port") from None
    with server:
        server.settimeout(0.2)
        while len(arrived) < num_processes - 1 and time.monotonic() < deadline:
            try:
                connection, _ = server.accept()
            except socket.timeout:
                continue
            connection.settimeout(5)
            try:
                arrived[int(connection.makefile().readline())] = connection
            except (OSError, ValueError):
                connection.close()
        missing = sorted(set(range(1, num_processes)) - set(arrived))
        for connection in arrived.values():
            with connection:
                connection.sendall(("ok\n" if not missing else f"missing {', '.join(map(str, missing))}\n").encode())
    if missing:
        raise ConfigError(f"processes {', '.join(map(str, missing))} of {num_processes} did not start within {where}; "
                          "start every process (or check distributed.num_processes)")


def barrier(name: str, timeout_s: float) -> None:
    """Wait until every process reaches `name`; past `timeout_s`, a ConfigError naming the late ones."""
    client = jax_distributed.global_state.client
    if client is None or jax.process_count() == 1:
        return
    try:
        client.wait_at_barrier(f"jaxlm-{name}", int(timeout_s * 1000))
    except Exception as err:  # JaxRuntimeError: DEADLINE_EXCEEDED, naming the timed-out tasks
        text = str(err)
        late = re.findall(r"^\s*(?:/job:\w+/replica:\d+/task:)?(\d+)\s*$", text.split("timed out task names:", 1)[-1],
                          re.M) if "timed out task names:" in text else []
        who = f"processes {', '.join(late)}" if late else "some processes"
        raise ConfigError(f"{who} did not reach {name!r} within distributed.barrier_timeout_s={timeout_s:g} s: "
                          "they are stuck or dead; see their logs") from None
