"""The `jaxlm` program keeps an installed libtpu quiet on a machine without TPU chips, and says Ctrl-C while it starts in
one line."""
import os
import subprocess
import sys

import pytest
from jax._src import cloud_tpu_init, hardware_utils, xla_bridge

from jaxlm import entry

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
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # libtpu starts (and logs) even where another process holds its lock
    return subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(cloud_tpu_init.get_tpu_library_path() is None, reason="needs libtpu (the dev extra)")
@pytest.mark.skipif(hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0, reason="this machine has TPUs")
def test_libtpu_starts_only_where_there_are_tpu_chips():
    plain, skipped = devices_probe("plain"), devices_probe("skip")
    assert plain.returncode == 0 and skipped.returncode == 0, plain.stderr + skipped.stderr
    assert LIBTPU_NOISE in plain.stderr, "libtpu started quietly: this test no longer shows what the skip is for"
    assert LIBTPU_NOISE not in skipped.stderr and skipped.stdout == plain.stdout


@pytest.mark.parametrize("setting", [{"JAX_PLATFORMS": "cpu"}, {"JAX_FORCE_TPU_INIT": "1"}])
def test_libtpu_is_left_alone_where_the_user_names_the_platforms(monkeypatch, setting):
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    registration = xla_bridge._backend_factories["tpu"]
    before = registration.factory
    entry.skip_absent_tpu()
    assert registration.factory is before


INTERRUPTED_IMPORT = """\
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: a test worker's children may ignore it


class CtrlCOnImport:  # the real signal, sent as the program imports its command line (jax with it)
    def find_spec(self, name, path=None, target=None):
        if name == "jaxlm.cli":
            os.kill(os.getpid(), signal.SIGINT)


sys.meta_path.insert(0, CtrlCOnImport())
sys.argv = ["jaxlm", "--help"]
from jaxlm import entry
entry.main()
"""


def test_ctrl_c_while_the_program_starts_is_one_line():
    """Ctrl-C in the seconds `jaxlm` spends importing jax printed a KeyboardInterrupt traceback."""
    env = dict(os.environ, JAXLM_RESTARTED_WITH_HUGE_PAGES="1")  # no restart: the hook stays in this process
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "jaxlm: interrupted\n")
