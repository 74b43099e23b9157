#!/usr/bin/env bash
# Input-pipeline throughput of every objective at sequence length 128 and 512: prepares the demo corpus
# for each tiny config (cached under .bench-data/), then times `jaxlm bench data` (read shards, decode,
# mask or corrupt, stack): examples/s on one core, in one thread; with WORKERS=0,1,2 instead through the
# trainer's grain loader with 0 (a background thread), 1 and 2 worker processes, wall time, and the cores
# that the trainer and its workers kept busy meanwhile (cores_used).
#   bash bench/data.sh
#   WORKERS=0,1,2 bash bench/data.sh
#   WORKERS=1,2 REPEAT=5 BATCHES=120 bash bench/data.sh   # each setting 5 times in turn: median and range
#   FAMILIES='bert spanbert' bash bench/data.sh     # some objectives only
set -euo pipefail
cd "$(dirname "$0")/.."
jaxlm() { command ${JAXLM:-python3 -m jaxlm.cli} "$@"; }
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
workers=(${WORKERS:+--workers "$WORKERS" --batches ${BATCHES:-60} --repeat ${REPEAT:-1}})
for seq in 128 512; do
  for family in ${FAMILIES:-bert roberta albert spanbert gpt2 t5 bart}; do
    common=(data.prepared_dir=.bench-data/$family-$seq data.max_seq_length=$seq
            data.max_predictions=$((seq * 20 / 128)) data.dupe_factor=1 model.max_position_embeddings=$((seq + 2)))
    mkdir -p .bench-data
    log=.bench-data/prepare-$family-$seq.log
    jaxlm prepare configs/$family-tiny.yaml "${common[@]}" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
    jaxlm bench data configs/$family-tiny.yaml "${common[@]}" "${workers[@]}" | sed '1d;$d'
  done
done | { echo "config  family  layout  seq_len  batch  workers  examples_per_s  examples_per_s_range  examples_per_s_core  tokens_per_s_core  cores_used  ms_per_batch"; cat; }
