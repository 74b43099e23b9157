"""The XLA options jaxlm sets on the programs it compiles, per platform (the user's XLA_FLAGS win)."""
from __future__ import annotations

import os

# On GPUs, XLA's dot merger makes projections of one input into one GEMM below a size (16k tokens a step: BERT-512's,
# GPT-2's query, key and value), whose output the attention then takes as slices copied out with the bias added,
# and whose input needs the three gradients concatenated. The model stacks projections itself where that pays
# (model.fused_projections). On compile-only H100 plans, without the merger: BERT-512's step bound 17.74 -> 16.62 ms
# (47.4 -> 45.1 GB moved), GPT-2's 22.62 -> 21.50 ms. They apply to every program over batches of rows: the train
# and held-out steps, fine-tunes' forward passes, eval sweeps' scoring and sentence embeddings. Generation keeps
# XLA's defaults: a decoding step projects a few tokens, where one launch for three small GEMMs is the cheaper.
GPU_XLA_OPTIONS = {"xla_disable_hlo_passes": "dot-merger"}


def project_xla_options(devices) -> dict:
    """GPU_XLA_OPTIONS on GPUs, less any that XLA_FLAGS already sets (the user's flags win); nothing elsewhere."""
    if devices[0].platform != "gpu":
        return {}
    user = os.environ.get("XLA_FLAGS", "")
    return {name: value for name, value in GPU_XLA_OPTIONS.items() if f"--{name}=" not in user}
