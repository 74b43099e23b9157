"""The `jaxlm` program keeps an installed libtpu quiet on a machine without TPU chips."""
import os
import subprocess
import sys

import pytest
from jax._src import cloud_tpu_init, hardware_utils

# the first line libtpu logs when it starts without a TPU VM around it
LIBTPU_NOISE = "TPU_WORKER_HOSTNAMES"
PROBE = """\
import sys
from jaxlm import entry
if sys.argv[1] == "skip":
    entry.skip_absent_tpu()
import jax
print(jax.default_backend())
"""


def devices_probe(mode: str) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT")}
    return subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(cloud_tpu_init.get_tpu_library_path() is None, reason="needs libtpu (the dev extra)")
@pytest.mark.skipif(hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0, reason="this machine has TPUs")
def test_libtpu_starts_only_where_there_are_tpu_chips():
    plain, skipped = devices_probe("plain"), devices_probe("skip")
    assert plain.returncode == 0 and skipped.returncode == 0, plain.stderr + skipped.stderr
    assert LIBTPU_NOISE in plain.stderr, "libtpu started quietly: this test no longer shows what the skip is for"
    assert LIBTPU_NOISE not in skipped.stderr and skipped.stdout == plain.stdout
