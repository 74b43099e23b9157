"""Every case of bench/gpu.py is a valid config, so that a rare GPU session does not lose a case to a typo."""
import importlib.util
import pathlib

import pytest

from jaxlm import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
bench_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gpu)


@pytest.mark.parametrize("case", sorted(bench_gpu.CASES))
def test_case_config_loads(case):
    config, overrides, peer_case = bench_gpu.CASES[case]
    loaded = config_lib.load(ROOT / config, overrides)
    assert loaded.train.global_batch > 0 and peer_case
