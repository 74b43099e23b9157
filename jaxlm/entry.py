"""The `jaxlm` program: its process started with huge pages for XLA's host memory, then the command line."""
import os
import sys

from jaxlm import host_memory


def skip_absent_tpu() -> None:
    """Where libtpu is installed but the machine has no TPU chip, JAX still starts libtpu as its backends come
    up, which fails and logs five lines of errors about TPU worker hostnames; take TPUs off JAX's list there.
    Left alone when the user names the platforms (JAX_PLATFORMS) or forces TPU start (JAX_FORCE_TPU_INIT)."""
    if os.environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in os.environ:
        return
    from jax._src import hardware_utils, xla_bridge  # private: JAX has no public switch for one platform alone

    registration = getattr(xla_bridge, "_backend_factories", {}).get("tpu")
    if registration is not None and hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0:
        registration.factory = _no_tpu_chips  # still a known platform (lowering rules are registered for it)


def _no_tpu_chips():
    raise RuntimeError("this machine has no TPU chips")  # TPU's registration fails quietly: JAX goes on without it


def main() -> None:
    host_memory.restart_with_huge_pages()  # first: the restart would otherwise import jax twice (4 s)
    skip_absent_tpu()
    from jaxlm import cli  # after the restart
    sys.exit(cli.main())
