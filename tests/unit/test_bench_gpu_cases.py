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


def test_profile_table_puts_each_bound_beside_its_measurement():
    """bench/gpu.py's profile table runs only on a GPU; its shape is checked here, with and without bounds."""
    measured = dict.fromkeys(("matmuls", "attention", "host gaps"), 2.0)
    rows = {"bert128": {"profile": {"ms_per_step": measured, "traced_ms_per_step": 6.5,
                                    "bound_ms_per_step": {"matmuls": 1.25, "attention": 0.5}}},
            "gpt2": {"profile": {"ms_per_step": measured, "traced_ms_per_step": 6.0}},
            "t5": {"profile_error": "ValueError: no trace"}}
    text = bench_gpu.profile_table(["bert128", "gpt2", "t5"], rows)
    assert "| bert128 | 2.00 (1.25) | 2.00 (0.50) | 2.00 | 6.50 |" in text
    assert "| gpt2 | 2.00 | 2.00 | 2.00 | 6.00 |" in text
    assert "jaxlm t5 profile: ValueError: no trace" in text
