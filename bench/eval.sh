#!/usr/bin/env bash
# `jaxlm eval` throughput (items/s) on this machine: the demo run (held-out batches, and the
# pseudo-perplexity of 64 lines of Austen) and SmolLM2-135M converted from its GGUF (BIG-bench
# `general_knowledge`, zero-shot). Run `make demo` first; results go to .bench-eval/.
#   bash bench/eval.sh
set -euo pipefail
cd "$(dirname "$0")/.."
jaxlm() { command ${JAXLM:-python3 -m jaxlm.cli} "$@"; }
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
mkdir -p .bench-eval
read -r austen gguf task < <(${PYTHON:-python3} -c "
from jaxlm.corpora.bigbench import bigbench_task
from jaxlm.corpora.models import smollm2_gguf_path
from jaxlm.corpora.registry import fetch_austen
print(fetch_austen(), smollm2_gguf_path(), bigbench_task('general_knowledge'))")
awk 'NF && ++n <= 64' "$austen" > .bench-eval/austen-64.txt
[ -d .bench-eval/smollm2 ] || jaxlm convert from-gguf "$gguf" .bench-eval/smollm2 > /dev/null
rm -rf .bench-eval/out-demo .bench-eval/out-smollm2
jaxlm eval runs/bert-tiny --select latest --tasks heldout,ppl:.bench-eval/austen-64.txt \
  --out .bench-eval/out-demo 2> /dev/null | grep "items/s"
jaxlm eval .bench-eval/smollm2 --tasks "choice:$task@0" --out .bench-eval/out-smollm2 2> /dev/null | grep "items/s"
