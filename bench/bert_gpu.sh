#!/usr/bin/env bash
# BERT-base training throughput on one GPU: jaxlm (xla and cudnn attention, seq 128 and 512)
# next to the Hugging Face transformers peer (torch.compile, bf16), in the same run.
#   bash bench/bert_gpu.sh [path/to/peers_torch.py]
set -uo pipefail
cd "$(dirname "$0")/.."
peers=${1:-../shared/bench/peers_torch.py}
jaxlm() { command ${JAXLM:-python3 -m jaxlm.cli} "$@"; }
for kernel in cudnn xla; do
  jaxlm bench configs/bert-base.yaml model.attention_kernel=$kernel train.global_batch=256 \
    data.max_seq_length=128 data.max_predictions=20 --json
  jaxlm bench configs/bert-base.yaml model.attention_kernel=$kernel train.global_batch=32 \
    data.max_seq_length=512 data.max_predictions=80 --json
done
python3 "$peers" bert128 bert512
