#!/usr/bin/env bash
# Readies what a GPU lease carries, here, where the package registries and ../shared are, so that the lease spends
# its minutes on measurements: the wheels of the packages the GPU machine's image lacks (.whl), the demo corpus
# prepared for `bench/gpu.py --train` (.gpudata) and the peer's script (.peer), each kept out of git by
# .git/info/exclude; then prints the device command that installs the wheels and runs the benchmark with the peer,
# writing its logs and profiles (ops.json, step.hlo) where the lease brings them back ($OUT).
#   bash bench/lease.sh [CASES]     (default: bert128,bert512,gpt2,t5)
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-bert128,bert512,gpt2,t5}
python=.venv/bin/python
[ -x "$python" ] || { echo "bench/lease.sh: error: no .venv here: run make install first" >&2; exit 2; }
peer=../shared/bench/peers_torch.py
[ -f "$peer" ] || { echo "bench/lease.sh: error: $peer not found: the peer comes from ../shared" >&2; exit 2; }
for folder in .whl .gpudata .peer; do
  grep -qx "/$folder/" .git/info/exclude 2> /dev/null || echo "/$folder/" >> .git/info/exclude
done
# what the image lacks (the device tool's KINDS.md lists what it holds), at the versions this checkout installs
missing=(grain array-record portpicker gguf tensorboardX)
pins=()
for name in "${missing[@]}"; do
  pins+=("$name==$("$python" -m pip show "$name" | sed -n 's/^Version: //p')")
done
rm -rf .whl && mkdir .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${pins[@]}"
mkdir -p .peer && cp "$peer" .peer/
"$python" bench/gpu.py --prepare .gpudata --cases "$cases"
echo "wheels: $(ls .whl | tr '\n' ' ')"
echo "carry: .whl .gpudata .peer; device command:"
echo "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&" \
  "export PYTHONPATH=/tmp/site:. JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache PYTHONUNBUFFERED=1 &&" \
  "timeout 540 python3 bench/gpu.py --peer .peer/peers_torch.py --profile --cases $cases --out \$OUT/bench"
echo "(--peer none --train .gpudata in place of --peer ... --profile times jaxlm train against the bench)"
