"""Peak device FLOP/s and model FLOPs utilisation, by DESIGN.md's formula."""
from __future__ import annotations

import jax

# Dense bf16 peak per device (one chip / one GPU), from the vendors' data sheets; matched in order, so
# "tpu v5" (the device kind of a v5p chip) after "tpu v5 lite".
PEAK_BF16_FLOPS = {
    "h200": 989e12, "h100": 989e12, "a100": 312e12, "l40s": 362e12, "l4": 121e12, "a10": 125e12,
    "tpu v6": 918e12, "tpu v5p": 459e12, "tpu v5 lite": 197e12, "tpu v5e": 197e12, "tpu v4": 275e12,
    "tpu v5": 459e12,
}
# Memory bytes/s per GPU, from the same data sheets (H100 SXM, H200, A100 80GB, L40S, L4, A10), and NVLink's
# bytes/s each way between the GPUs of one host (SXM boards; PCIe cards have none listed).
HBM_BANDWIDTH = {"h200": 4.8e12, "h100": 3.35e12, "a100": 2.04e12, "l40s": 0.864e12, "l4": 0.3e12, "a10": 0.6e12}
LINK_BANDWIDTH = {"h200": 450e9, "h100": 450e9, "a100": 300e9}


def device_figure(table: dict, device_kind: str) -> float | None:
    """The value of `table` (PEAK_BF16_FLOPS, HBM_BANDWIDTH) whose key is in `device_kind`; None if none is."""
    return next((value for name, value in table.items() if name in device_kind.lower()), None)


def roofline(device_kind: str, peak_override: float = 0.0) -> tuple[float, float, float | None] | None:
    """(peak FLOP/s, memory bytes/s, link bytes/s or None) of a GPU of `device_kind` from the tables above; None
    if its peak or memory bandwidth is unknown."""
    peak = peak_override or device_figure(PEAK_BF16_FLOPS, device_kind)
    bandwidth = device_figure(HBM_BANDWIDTH, device_kind)
    return (peak, bandwidth, device_figure(LINK_BANDWIDTH, device_kind)) if peak and bandwidth else None


def peak_flops(device=None, override: float = 0.0) -> tuple[float | None, str]:
    """(peak FLOP/s per device or None when unknown, a description of where it came from)."""
    if override > 0:
        return override, f"{override:.3g} FLOP/s per device (bench.peak_flops_per_device)"
    device = device or jax.devices()[0]
    value = device_figure(PEAK_BF16_FLOPS, device.device_kind)
    if value is not None:
        return value, f"{value / 1e12:.0f} TFLOP/s bf16 dense ({device.device_kind})"
    return None, f"unknown peak for {device.device_kind}; set bench.peak_flops_per_device"


def mfu(tokens_per_second: float, flops_per_token: float, device_count: int, peak: float | None) -> float | None:
    if not peak:
        return None
    return tokens_per_second * flops_per_token / (peak * device_count)
