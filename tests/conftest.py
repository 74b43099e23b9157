"""Test session setup: 8 simulated CPU devices, set before JAX is imported anywhere."""
import os

from jaxlm import host_memory

# LLVM at -O1, not XLA's default -O2, for every program the suite compiles, here and in the processes it starts:
# many tests mostly compile small models (a family's train step and initialiser: 29 -> 25 s of backend compile
# on two cores), and the steps run as fast (bert-tiny: 733 and 750 ms)
COMPILE_FASTER = "--xla_backend_optimization_level=1"


def xla_flags(devices: int | None = 8) -> str:
    """XLA_FLAGS for a test process: `devices` simulated CPU devices (None: as many as its launcher sets)."""
    return COMPILE_FASTER if devices is None else f"--xla_force_host_platform_device_count={devices} {COMPILE_FASTER}"


os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags()).strip()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the processes the suite starts (its xdist workers and each `jaxlm` command) begin with huge pages for XLA's
# host memory, as the `jaxlm` program restarts itself to (jaxlm/host_memory.py); here, before they start
if (with_huge_pages := host_memory.environment()) is not None:
    os.environ["GLIBC_TUNABLES"] = with_huge_pages["GLIBC_TUNABLES"]

import functools
import gc
import json
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest
import yaml
from jax.experimental.compilation_cache import compilation_cache

from jaxlm import families
from jaxlm.convert.names import flatten
from jaxlm.corpora.choice_tasks import choice_task
from jaxlm.corpora.registry import fetch_austen
from jaxlm.data.tokenizers.trainer import train_wordpiece, write_vocab

ROOT = pathlib.Path(__file__).resolve().parents[1]

def outputs_loss_and_gradients(config, data, params, batch):
    """A model's outputs on `batch` (no dropout), its objective's loss and the gradients by parameter path."""
    objective = families.make_objective(config, data)
    outputs = objective.apply(params, batch, None, deterministic=True)
    (loss, _), grads = jax.value_and_grad(objective.loss, has_aux=True)(params, batch, jax.random.key(1))
    return outputs, loss, dict(flatten(grads))


# An even vocabulary size that 4 does not divide, as bert-base-uncased's 30,522: every mesh that splits one
# splits the other, and the tensor axis of 4 splits neither
VOCAB_SIZE = 2002
# One layer deep: at two, test_families_train's tiny BERT and BART compiled step and initialiser in 15 and 24 s, at
# one in 9 and 15.
TINY = {
    "model": {"preset": "bert-tiny", "hidden_size": 64, "num_layers": 1, "num_heads": 2,
              "intermediate_size": 256, "max_position_embeddings": 64, "vocab_size": VOCAB_SIZE, "dtype": "float32"},
    "data": {"corpus": ["demo:austen"], "max_seq_length": 64, "max_predictions": 10, "seed": 7},
    "mesh": {"data": -1, "rules": "dp"},
    "optim": {"peak_lr": 2e-3, "warmup_steps": 10},
    "train": {"steps": 20, "global_batch": 32, "log_every": 1, "eval_every": 1000, "eval_batches": 4,
              "checkpoint_every": 10},
}
shared_dir: pathlib.Path | None = None  # the directory both xdist workers share, once the session has started


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """JAX's caches of traced and compiled functions dropped after each test file: an xdist worker runs many
    files, and its memory grew with every program they compiled (to 8 GiB; CI's machine has 24 for two)."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(autouse=True, scope="session")
def _shared_between_workers(tmp_path_factory):
    """One directory for every process the tests start, under both xdist workers: it holds the tests' vocabulary
    and JAX's compilation cache. A `jaxlm` run that compiles what an earlier test's run compiled loads it (the
    tiny BERT's steps: 15-25 s on two cores, 2-3 s loaded), where each run would otherwise keep its own in its run
    directory. The tests' own process uses it too: a test that builds its step again (a fresh `jax.jit`, which
    JAX's in-memory cache does not know) loads what an earlier build compiled."""
    global shared_dir
    base = tmp_path_factory.getbasetemp()
    shared_dir = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache = os.environ["JAX_COMPILATION_CACHE_DIR"] = str(shared_dir / "compile-cache")
    jax.config.update("jax_compilation_cache_dir", cache)
    compilation_cache.reset_cache()  # JAX decides whether it has a cache at its first compile, maybe at collection


@functools.cache
def austen_vocab() -> pathlib.Path:
    """A WordPiece vocabulary of VOCAB_SIZE pieces learnt from the Austen novels by the trainer of `jaxlm tokenizer
    train` (4 s), for the tiny BERT of the tests' runs: with bert-base-uncased's 30,522 its masked-LM head and
    embedding took most of every step (a 40-step run on 8 devices: 31 s against 22)."""
    path = shared_dir / f"austen-wordpiece-{VOCAB_SIZE}.txt"
    if not path.exists():  # written atomically: both workers may write it, the same bytes
        vocab = train_wordpiece(fetch_austen().read_text(encoding="utf-8").splitlines(), VOCAB_SIZE)
        assert len(vocab) == VOCAB_SIZE
        write_vocab(vocab, path)
    return path


def merged(base: dict, extra: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


def write_config(directory: pathlib.Path, extra: dict | None = None, name: str = "config.yaml") -> pathlib.Path:
    path = directory / name
    tiny = merged(TINY, {"data": {"vocab": str(austen_vocab())}})
    path.write_text(yaml.safe_dump(merged(tiny, extra or {})))
    return path


def run_cli(*args, devices: int = 8, check: bool = True, timeout: float = 900, env_extra=None):
    """`jaxlm ARGS` in a fresh process with `devices` simulated CPU devices."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices))
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-m", "jaxlm.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"jaxlm {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def kill_when(proc: subprocess.Popen, ready, timeout: float = 600) -> None:
    """SIGKILL `proc` as soon as `ready()` holds (or it ends, or `timeout` passes); the caller checks
    `proc.returncode == -signal.SIGKILL` to know it was still running."""
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory) -> pathlib.Path:
    """The Austen novels prepared at sequence length 64 with the vocabulary learnt from them."""
    directory = tmp_path_factory.mktemp("prepared")
    config = write_config(directory, {"data": {"prepared_dir": str(directory / "data")}})
    run_cli("prepare", config, devices=1)
    return directory / "data"


@pytest.fixture
def tiny_config(tmp_path, prepared_dir):
    """A function: overrides -> path of a tiny-BERT config on the prepared Austen data in tmp_path."""
    def make(extra: dict | None = None, name: str = "config.yaml") -> pathlib.Path:
        base = {"data": {"prepared_dir": str(prepared_dir)}, "train": {"run_dir": str(tmp_path / "run")}}
        for section, values in (extra or {}).items():
            base.setdefault(section, {}).update(values)
        return write_config(tmp_path, base, name)
    return make


@pytest.fixture(scope="session")
def minilm_converted(tmp_path_factory):
    """all-MiniLM-L6-v2 converted (`jaxlm convert from-hf`): a BERT encoder without the masked-LM head."""
    from jaxlm.cli import main
    from jaxlm.corpora.models import minilm_dir
    out = tmp_path_factory.mktemp("minilm") / "ckpt"
    assert main(["convert", "from-hf", str(minilm_dir()), str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def arithmetic_task(tmp_path_factory) -> pathlib.Path:
    """The first 8 questions of the real `basic_arithmetic` choice task (4 choices each) whose choices are
    all whole numbers without a sign (WordPiece decodes "-1" as "- 1"), as a BIG-bench task.json of their own
    in BIG-bench's default format: few enough for a parity sweep."""
    task = json.loads(choice_task("basic_arithmetic").read_text(encoding="utf-8"))
    unsigned = [e for e in task["examples"] if all(choice.isdigit() for choice in e["target_scores"])]
    path = tmp_path_factory.mktemp("choice") / "basic_arithmetic" / "task.json"
    path.parent.mkdir()
    # without the named task's prompt settings: prompted in BIG-bench's default format
    path.write_text(json.dumps({"name": task["name"], "examples": unsigned[:8]}), encoding="utf-8")
    return path
