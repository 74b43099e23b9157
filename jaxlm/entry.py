"""The `jaxlm` program: its process started with huge pages for XLA's host memory, then the command line."""
import os
import pathlib
import sys

from jaxlm import host_memory


def tpu_device_files() -> bool:
    """Whether this machine shows a TPU's device files (/dev/accel* on v4 and v5e, /dev/vfio on v5p and v6e)."""
    return any(pathlib.Path("/dev").glob("accel*")) or pathlib.Path("/dev/vfio").exists()


def skip_absent_tpu() -> None:
    """Where libtpu is installed but the machine has no TPU (neither device files nor a TPU on the PCI bus), JAX
    would still start libtpu as its backends come up, which fails there and logs five lines of errors about TPU
    worker hostnames: make that start fail quietly before it loads libtpu. Left alone when the user names the
    platforms (JAX_PLATFORMS) or forces TPU start (JAX_FORCE_TPU_INIT)."""
    if os.environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in os.environ or tpu_device_files():
        return
    # jax only now, after the huge-pages restart; private modules: JAX has no public switch for one platform
    from jax._src import hardware_utils, xla_bridge

    registration = getattr(xla_bridge, "_backend_factories", {}).get("tpu")
    if registration is not None and hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0:
        registration.factory = _no_tpu_chips  # still a known platform (lowering rules are registered for it)


def _no_tpu_chips():
    raise RuntimeError("this machine has no TPU chips")  # TPU's registration fails quietly: JAX goes on without it


def main() -> None:
    try:
        host_memory.restart_with_huge_pages()  # first: the restart would otherwise import jax twice (4 s)
        skip_absent_tpu()
        from jaxlm import cli  # after the restart
    except KeyboardInterrupt:  # Ctrl-C in the seconds jax takes to import: before any command has run
        print("jaxlm: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(cli.main())
