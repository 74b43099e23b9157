"""Compile-only GPUs: XLA's description of each GPU we compile for without one, and its devices.

JAX's CUDA plugin (`jax-cuda12-plugin`, `jax-cuda12-pjrt`) makes a compile-only client from a GPU's target
description, no driver or CUDA library needed; XLA then compiles for that GPU as if one were attached,
choosing its kernels without autotuning (which needs the device). The description is XLA's `GpuTargetConfig`
text: the H100 SXM's figures as CUDA reports them (132 SMs, 80 GB HBM3 at 3.35 TB/s, compute capability 9.0).
GEMMs compile to cuBLAS calls (COMPILER_OPTIONS, given to the compile): without autotuning, XLA's default
Triton tiles fail on some shapes.
"""
from __future__ import annotations

import contextlib
import importlib.util
import re
from unittest import mock

import jax

from jaxlm.errors import first_line

H100_SXM = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84929347584
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 }
runtime_version { major: 12 minor: 8 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
TARGETS = {"h100": H100_SXM}
# What JAX's cuDNN attention asks the attached GPU as it traces, answered from the description above
# (dnn_version_info 9.8 as cuDNN numbers its versions, cuda_compute_capability 9.0)
CUDNN_VERSION, COMPUTE_CAPABILITY = 90800, (9, 0)
# Without autotuning, XLA's default Triton tiling fails on some GEMMs (T5's); cuBLAS takes every shape.
COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}
MEMORY_BYTES = {"NVIDIA H100 80GB HBM3": 84929347584}
PLUGIN_FOLDER = ".venv/cuda-plugin"  # where `make install` puts the plugin, off the venv's path
_TOPOLOGY = re.compile(r"^(?P<gpu>[a-z]\w*)(?::(?:(?P<hosts>\d+)x)?(?P<gpus>\d+))?$")


class TopologyError(ValueError):
    """A topology that cannot be compiled for here; the message says what to change."""


def is_gpu(topology: str) -> bool:
    return topology.lower().split(":")[0] in TARGETS


def plugin_hint() -> str:
    return (f"pip install jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__} (or put them on "
            f"PYTHONPATH: `make install` puts them in {PLUGIN_FOLDER})")


def plugin_installed() -> bool:
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


def devices(topology: str) -> list:
    """Compile-only devices for "h100" (one GPU), "h100:8" (8 GPUs of one host), "h100:2x8" (2 hosts of 8)."""
    found = _TOPOLOGY.match(topology.lower())
    counts = [int(found[name]) for name in ("hosts", "gpus") if found and found[name] is not None]
    if found is None or found["gpu"] not in TARGETS or not all(0 < count < 2 ** 31 for count in counts):
        raise TopologyError(f"GPU topology {topology!r} must look like h100, h100:8 or h100:2x8 "
                            f"(GPUs known: {', '.join(TARGETS)})")
    if not plugin_installed():
        raise TopologyError(f"compiling for {found['gpu']} needs JAX's CUDA plugin, which is not installed: "
                            f"{plugin_hint()}")
    from jax.experimental import topologies  # only here: importing it touches the accelerator plugins

    shape = f"1x{found['hosts'] or 1}x{found['gpus'] or 1}"
    try:
        return list(topologies.get_topology_desc(platform="cuda", target_config=TARGETS[found["gpu"]],
                                                 topology=shape).devices)
    except Exception as err:  # the plugin raises JaxRuntimeError / RuntimeError with its own text
        raise TopologyError(f"could not make compile-only devices for {topology!r} ({first_line(err)}); "
                            f"{plugin_hint()}") from err


@contextlib.contextmanager
def cudnn_attention_traced():
    """Within it, jax.nn.dot_product_attention(implementation="cudnn") traces for the compile-only GPU: it asks
    the attached GPU for cuDNN's version and its compute capability, and there is none, so JAX's private checks
    answer from the target description. XLA then compiles cuDNN's custom calls into the step as for a real GPU
    (cuDNN builds their kernels when the step first runs there), so a plan sees the layouts they impose."""
    def capability(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("."))

    answers = {"check_cudnn_version": lambda: CUDNN_VERSION,
               "check_compute_capability": lambda wanted: capability(wanted) <= COMPUTE_CAPABILITY,
               "is_cuda_compute_capability_equal": lambda wanted: capability(wanted) == COMPUTE_CAPABILITY}
    try:
        from jax._src.cudnn import fused_attention_stablehlo as cudnn  # private: the checks patched below
    except ImportError:
        cudnn = None
    if cudnn is None or not all(hasattr(cudnn, check) for check in answers):
        raise TopologyError(f"this JAX ({jax.__version__}) cannot trace cuDNN's attention without a GPU; set "
                            "model.attention_kernel=xla")
    with mock.patch.multiple(cudnn, **answers):
        yield
