#!/usr/bin/env bash
# Start N jaxlm processes on this machine, joined by jax.distributed through a local coordinator.
#   launch/local_multiprocess.sh [--dry-run] N CONFIG [section.key=value ...]
# Each process gets TOTAL_DEVICES / N simulated CPU devices (JAXLM_TOTAL_DEVICES, default 8) when
# run on the CPU. JAXLM_COMMAND picks the subcommand (default: train); JAXLM_PORT the coordinator's port (default:
# a random one from 20000); JAXLM_BIN the jaxlm program (default: this checkout's .venv/bin/jaxlm). Exits non-zero
# if any fails. A training's config and overrides are checked once, here, before any process starts.
# SIGTERM or SIGINT to this script reaches every process as SIGTERM (each stops at one step, saves and exits 143);
# it then waits for them all. A process that fails (a status other than 0, and a stopped run's 75, 130 and 143)
# ends the others (SIGTERM, then SIGKILL after JAXLM_GRACE_S, default 30): without it they cannot save, and waited
# for it until JAX's heartbeat timeout. --dry-run prints the commands.
set -euo pipefail
dry_run=0 words=()
for word in "$@"; do  # --dry-run anywhere, as the other launchers take it: a trailing one started N trainings
  if [ "$word" = --dry-run ]; then dry_run=1; else words+=("$word"); fi
done
set -- ${words[@]+"${words[@]}"}
if [ $# -lt 2 ]; then
  echo "usage: $0 [--dry-run] N CONFIG [section.key=value ...]" >&2
  exit 2
fi
count=$1; config=$2; shift 2
total=${JAXLM_TOTAL_DEVICES:-8}
if ! [[ $count =~ ^[1-9][0-9]*$ && $total =~ ^[1-9][0-9]*$ ]]; then
  echo "local_multiprocess.sh: error: N=$count processes and JAXLM_TOTAL_DEVICES=$total: give positive whole" \
    "numbers" >&2
  exit 2
fi
if [ $((total % count)) -ne 0 ]; then
  echo "local_multiprocess.sh: error: $total devices cannot be split evenly over $count processes" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/launch/lib.sh"
port=${JAXLM_PORT:-$((20000 + RANDOM % 20000))}
if ! coordinator_port "$port"; then
  echo "local_multiprocess.sh: error: JAXLM_PORT=$port: $COORDINATOR_PORT_FIX" >&2
  exit 2
fi
# said once here, not once by each process; eval's first argument may be a run that does not exist yet (--watch)
if [[ ${JAXLM_COMMAND:-train} != eval && ! -e $config ]]; then
  echo "local_multiprocess.sh: error: config $config does not exist" >&2
  exit 2
fi
grace=${JAXLM_GRACE_S:-30}
[[ $grace =~ ^[0-9]+$ ]] || { echo "local_multiprocess.sh: error: JAXLM_GRACE_S=$grace: give whole seconds" >&2; exit 2; }
grace=$((10#$grace))  # 08 is not octal
jaxlm=${JAXLM_BIN:-$here/.venv/bin/jaxlm}
if [[ ${JAXLM_COMMAND:-train} == train ]]; then  # a bad override was said once by each process
  "$(checking_python "$jaxlm")" "$here/launch/check_config.py" local_multiprocess.sh "$config" "$@" || exit 2
fi
pids=()
for ((i = 0; i < count; i++)); do
  command=(env JAXLM_COORDINATOR=127.0.0.1:$port JAXLM_NUM_PROCESSES=$count JAXLM_PROCESS_ID=$i
           JAXLM_LOCAL_DEVICE_COUNT=$((total / count)) JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
           "$jaxlm" "${JAXLM_COMMAND:-train}" "$config" "$@")
  if [ "$dry_run" = 1 ]; then quote "${command[@]}"; continue; fi
  "${command[@]}" &
  pids+=($!)
done
[ "$dry_run" = 0 ] || exit 0
# as SIGTERM, not SIGINT: a terminal's Ctrl-C also reaches the processes themselves, and a second one aborts
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
status=0 failed_at="" killed=0 running=("${!pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  still=()
  for i in "${running[@]}"; do
    if kill -0 "${pids[i]}" 2>/dev/null; then still+=("$i"); continue; fi
    if wait "${pids[i]}"; then code=0; else code=$?; fi
    if [[ $code -ne 0 && $status -eq 0 ]]; then status=$code; fi
    # a run stopped early exits 143, 130 or 75 once saved (jaxlm.train.faults.stop_status), every process alike
    if [[ ! $code =~ ^(0|75|130|143)$ && -z $failed_at ]]; then
      failed_at=$SECONDS
      echo "local_multiprocess.sh: process $i exited with status $code; stopping the others" >&2
      kill -TERM "${pids[@]}" 2>/dev/null || true
    fi
  done
  running=("${still[@]}")
  if [[ -n $failed_at && $killed == 0 && ${#running[@]} -gt 0 && $((SECONDS - failed_at)) -ge $grace ]]; then
    echo "local_multiprocess.sh: processes ${running[*]} still run ${grace} s after SIGTERM; killing them" >&2
    for i in "${running[@]}"; do kill -KILL "${pids[i]}" 2>/dev/null || true; done
    killed=1
  fi
  if [ ${#running[@]} -gt 0 ]; then
    sleep 0.2 || true  # a terminal's Ctrl-C ends the sleep too: set -e would end this script before the saves
  fi
done
exit $status
