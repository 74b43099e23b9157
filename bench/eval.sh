#!/usr/bin/env bash
# `jaxlm eval` throughput (items/s) on this machine: the demo run (held-out batches, and the
# pseudo-perplexity of 64 lines of Austen) and SmolLM2-135M converted from its GGUF (ARC-Challenge's
# validation questions, zero-shot). Run `make demo` first; results go to .bench-eval/.
#   bash bench/eval.sh
set -euo pipefail
cd "$(dirname "$0")/.."
jaxlm() { command ${JAXLM:-python3 -m jaxlm.cli} "$@"; }
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
if [ ! -d runs/bert-tiny/checkpoints ]; then
  echo "bench/eval.sh: no demo run in runs/bert-tiny: make it with \`make demo\` first" >&2
  exit 1
fi
mkdir -p .bench-eval
read -r austen gguf < <(${PYTHON:-python3} -c "
from jaxlm.corpora.models import smollm2_gguf_path
from jaxlm.corpora.registry import fetch_austen
print(fetch_austen(), smollm2_gguf_path())")
awk 'NF && ++n <= 64' "$austen" > .bench-eval/austen-64.txt
[ -d .bench-eval/smollm2 ] || jaxlm convert from-gguf "$gguf" .bench-eval/smollm2 > /dev/null
rm -rf .bench-eval/out-demo .bench-eval/out-smollm2
evaluate() {  # NAME ARGS: the items/s line of `jaxlm eval ARGS`, or why there is none, its log in .bench-eval/
  local name=$1 log=.bench-eval/eval-$1.log
  shift
  if ! jaxlm eval "$@" --out ".bench-eval/out-$name" 2> "$log" | grep "items/s"; then
    echo "bench/eval.sh: jaxlm eval of $name failed: $(tail -n 1 "$log") (all of it in $log)" >&2
    exit 1
  fi
}
evaluate demo runs/bert-tiny --select latest --tasks heldout,ppl:.bench-eval/austen-64.txt
evaluate smollm2 .bench-eval/smollm2 --tasks choice:arc_challenge@0
