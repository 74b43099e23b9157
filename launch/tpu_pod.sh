#!/usr/bin/env bash
# Run jaxlm on every worker of a Cloud TPU VM (or of a queued resource's node) with gcloud.
#
#   launch/tpu_pod.sh [options] ACTION [CONFIG [section.key=value ...]]   (options may also follow ACTION)
#
# CONFIG is a path from the checkout's root, committed: the workers run the copy of HEAD that install gives them.
#
# ACTION
#   install  copy this checkout (git archive of HEAD) to every worker and pip-install it with jax[tpu]; the files
#            of the install before are replaced, what runs made beside them (runs/, data/) is kept
#   train    start `jaxlm train CONFIG` on every worker at once (--worker=all), in the background, joined by
#            jax.distributed from the TPU VM's metadata (distributed.enabled=true)
#   wait     until no worker runs jaxlm any more
#   logs     copy each worker's log (every attempt, appended) to logs/NAME/worker-N.log (every one that can be;
#            exits 1 if one cannot); its last line says how jaxlm exited
#   stop     SIGTERM on every worker: each saves a checkpoint at the step they agree on and exits 143
#   run      install, train, wait, logs: the whole job; exits 0 when every worker's jaxlm did, else with the
#            first other status (75, 130, 143: stopped early); run it again after a fault and it resumes
#
# Options
#   --tpu NAME         the TPU VM (required)         --zone ZONE      its zone (required)
#   --project ID       the Google Cloud project      --queued         NAME is a queued resource's node:
#                                                                      wait until the resource is ACTIVE
#                                                                      (an error if it fails or is gone)
#   --workers N        the worker count (default: asked from gcloud)
#   --python CMD       the workers' Python 3.11+, which install makes the venv with (default: python3)
#   --env KEY=VALUE    passed to jaxlm on every worker (repeat it)
#   --dry-run          print every command instead of running it
set -euo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }  # the header comment
fail() { echo "tpu_pod.sh: error: $*" >&2; exit 2; }
need() {  # need OPTION WHAT WORD: an error unless WORD is OPTION's value (not missing, empty or the next option)
  [[ -n $3 && $3 != -* ]] || fail "$1 needs a value: $1 $2"
}

given=$# tpu="" zone="" project="" queued=0 workers="" python=python3 dry_run=0 envs=() words=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tpu) need "$1" NAME "${2-}"; tpu=$2; shift 2 ;;
    --zone) need "$1" ZONE "${2-}"; zone=$2; shift 2 ;;
    --project) need "$1" ID "${2-}"; project=$2; shift 2 ;;
    --queued) queued=1; shift ;;
    --workers) need "$1" N "${2-}"; workers=$2; shift 2 ;;
    --python) need "$1" CMD "${2-}"; python=$2; shift 2 ;;
    --env) need "$1" KEY=VALUE "${2-}"; [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || fail "--env takes KEY=VALUE, got '$2'"
      envs+=("$2"); shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    -*) fail "unknown option $1 (see --help)" ;;
    *) words+=("$1"); shift ;;
  esac
done
[ "$given" -gt 0 ] || usage
[ ${#words[@]} -ge 1 ] || fail "name an ACTION: install, train, wait, logs, stop or run (see --help)"
set -- "${words[@]}"
action=$1; shift
[ -n "$tpu" ] || fail "--tpu NAME is required"
# Cloud TPU's rule for a node's name; the name is also the directory of its logs (logs/NAME)
[[ $tpu =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || fail "--tpu '$tpu': a TPU's name is lower-case letters, digits and \
'-', starting with a letter and not ending with '-'"
[ -n "$zone" ] || fail "--zone ZONE is required"
[[ $zone =~ ^[a-z0-9-]+$ ]] || fail "--zone '$zone': a zone is lower-case letters, digits and '-', like us-east5-a"
case "$action" in
  install|train|wait|logs|stop|run) ;;
  *) fail "unknown action '$action'; choose install, train, wait, logs, stop or run" ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/launch/lib.sh"
if [[ $action == train || $action == run ]]; then
  [ $# -ge 1 ] || fail "$action needs a CONFIG (a path inside this checkout)"
  config=$1
  case /$config/ in
    "/$here"/*) fail "config $config: give it as ${config#"$here"/}, its path from the checkout's root \
(the workers' copy)" ;;
    //*) fail "config $config is outside this checkout ($here): the workers get only the checkout; copy it in \
and commit it" ;;
    */../*) fail "config $config: give its path from the checkout's root without '..' (the workers' copy)" ;;
  esac
  [ -f "$here/$config" ] || fail "config $config not found in $here (a path from the checkout's root, as the \
workers read it)"
  git -C "$here" ls-files --error-unmatch -- "$config" > /dev/null 2>&1 || fail "config $config is not in git: \
the workers get the checkout's HEAD; git add and commit it"
  git -C "$here" diff --quiet HEAD -- "$config" 2> /dev/null || fail "config $config has uncommitted changes: the \
workers would run HEAD's; commit them"
  # the overrides as jaxlm reads them, with this checkout's jaxlm where it is installed: not after every worker's install
  (cd "$here" && "$(checking_python)" launch/check_config.py tpu_pod.sh "$@") || exit 2
elif [ $# -gt 0 ]; then
  fail "$action takes no CONFIG or overrides, got '$1'"
fi
[[ -z $workers || $workers =~ ^[1-9][0-9]*$ ]] || fail "--workers must be a positive count, got '$workers'"
if [[ $dry_run == 1 && -z $workers && ($action == logs || $action == run) ]]; then
  fail "--dry-run needs --workers N (it asks gcloud nothing)"
fi

gcloud_tpu=(gcloud compute tpus tpu-vm)
where=(--zone="$zone")
[ -n "$project" ] && where+=(--project="$project")
remote_dir=jaxlm
logs_dir=jaxlm-logs
EXITED="tpu_pod.sh: jaxlm train exited "  # the last line of a worker's log, before the status

run() {  # print the command (dry run) or run it
  if [ "$dry_run" = 1 ]; then quote "$@"; else "$@"; fi
}

on_workers() {  # on_workers WORKER COMMAND: one shell command on one worker (or all)
  run "${gcloud_tpu[@]}" ssh "$tpu" "${where[@]}" --worker="$1" --command="$2"
}

worker_count() {
  if [ -n "$workers" ]; then echo "$workers"; return; fi
  "${gcloud_tpu[@]}" describe "$tpu" "${where[@]}" --format='value(networkEndpoints)' | tr ';' '\n' | grep -c .
}

wait_until_active() {
  [ "$queued" = 1 ] || return 0
  local state=(gcloud compute tpus queued-resources describe "$tpu" "${where[@]}" --format='value(state.state)') now
  if [ "$dry_run" = 1 ]; then
    echo "until [ \"\$($(quote "${state[@]}"))\" = ACTIVE ]; do sleep 30; done"
    return
  fi
  while true; do
    now=$("${state[@]}") || fail "gcloud cannot describe queued resource $tpu (its message is above): check --tpu, \
--zone and --project"
    case $now in
      ACTIVE) return ;;
      FAILED|SUSPENDING|SUSPENDED|DELETING) fail "queued resource $tpu is $now, and will not become ACTIVE: \
create it again" ;;
    esac
    echo "waiting for queued resource $tpu to be ACTIVE (it is ${now:-in no state yet})" >&2
    sleep 30
  done
}

# On each worker: refuse while a run trains, or a Python older than jax's; then replace the files the install
# before extracted (listed in .installed-files), keeping what runs wrote beside them (a relative run_dir, data).
INSTALL=$(cat <<'SCRIPT'
say() { echo "tpu_pod.sh: error: $(hostname): $*" >&2; exit 1; }
! pgrep -f "[.]venv/bin/jaxlm train" > /dev/null || say "jaxlm train still runs: stop it first (stop, then wait)"
PYTHON -c "import sys; sys.exit(sys.version_info < (3, 11))" \
  || say "jaxlm needs Python 3.11+ (--python): $(PYTHON -V 2>&1)"
mkdir -p DIR && cd DIR || exit 1
[ ! -f .installed-files ] || xargs -d "\n" rm -f < .installed-files
tar -xzf ../jaxlm.tar.gz && tar -tzf ../jaxlm.tar.gz | grep -v "/$" > .installed-files || exit 1
PYTHON -m venv .venv && .venv/bin/pip install --quiet --upgrade pip && .venv/bin/pip install --quiet -e ".[tpu]"
SCRIPT
)

install() {
  local archive=/tmp/jaxlm-$tpu.tar.gz
  run git -C "$here" archive --format=tar.gz -o "$archive" HEAD
  run "${gcloud_tpu[@]}" scp "$archive" "$tpu:jaxlm.tar.gz" "${where[@]}" --worker=all
  local script=${INSTALL//DIR/$remote_dir}
  on_workers all "${script//PYTHON/$(quote "$python")}"
}

train() {
  local command="" arg
  for arg in "${envs[@]}"; do command+="$(quote "$arg") "; done
  # jaxlm's distributed.enabled=auto looks for cluster variables, which a TPU VM does not set: JAX reads its workers
  # from the VM's metadata. Overrides after it win.
  command+=".venv/bin/jaxlm train $(quote "$1") distributed.enabled=true $(quote "${@:2}")"
  # One log per worker, named by its TPU worker id (from the VM's metadata), each attempt appended (a resumed run
  # keeps the log of the fault before), ending with jaxlm's exit status. Only
  # the sh that runs jaxlm goes to the background (a backgrounded list kept ssh's output open, so that `train`
  # returned when training ended); it reads the command from its environment, so that `stop` signals only jaxlm,
  # and outlives a SIGTERM to every process (its trap runs once jaxlm has ended; jaxlm starts with TERM's default).
  on_workers all "cd $remote_dir && mkdir -p ~/$logs_dir && id=\$(curl -s -H Metadata-Flavor:Google \
http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number) \
&& { JAXLM_WORKER_COMMAND=$(quote "env ${command% }") nohup sh -c 'trap : TERM; \
eval \"\$JAXLM_WORKER_COMMAND\"; echo \"$EXITED\$?\"' >> ~/$logs_dir/worker-\$id.log 2>&1 < /dev/null & }"
}

# The patterns read [.]venv so that they do not match the shell that runs them; `wait` waits for the sh that writes
# jaxlm's exit status too.
wait_for_workers() {
  local check='while pgrep -f "[.]venv/bin/jaxlm train|JAXLM_WORKER_[C]OMMAND" > /dev/null; do sleep 30; done'
  on_workers all "$check"
}

collect_logs() {
  local count i missing=()
  count=$(worker_count)
  run mkdir -p "logs/$tpu"
  for ((i = 0; i < count; i++)); do
    run "${gcloud_tpu[@]}" scp "$tpu:$logs_dir/worker-$i.log" "logs/$tpu/worker-$i.log" "${where[@]}" --worker="$i" \
      || missing+=("$i")
  done
  [ ${#missing[@]} -eq 0 ] || { echo "tpu_pod.sh: error: no log copied from worker ${missing[*]} (gcloud's message is \
above); the others are in logs/$tpu" >&2; exit 1; }
}

# The job's status from the copied logs: 0 when every worker's jaxlm exited 0, else the first other, each named.
job_status() {
  local count i last status first=0
  count=$(worker_count)
  for ((i = 0; i < count; i++)); do
    last=$(tail -n 1 "logs/$tpu/worker-$i.log")
    [[ $last =~ $EXITED([0-9]+)$ ]] && status=${BASH_REMATCH[1]} || status=""
    case $status in
      0) continue ;;
      75|130|143) echo "tpu_pod.sh: worker $i stopped early (jaxlm exited $status): run again to resume" >&2 ;;
      "") status=1; echo "tpu_pod.sh: error: worker $i's jaxlm ended without an exit status (killed, or its VM \
restarted): see logs/$tpu/worker-$i.log" >&2 ;;
      *) echo "tpu_pod.sh: error: worker $i failed (jaxlm exited $status): see logs/$tpu/worker-$i.log" >&2 ;;
    esac
    [ "$first" != 0 ] || first=$status
  done
  return "$first"
}

stop() {
  on_workers all 'pkill -TERM -f "[.]venv/bin/jaxlm train" || true'
}

wait_until_active
case "$action" in
  install) install ;;
  train) train "$@" ;;
  wait) wait_for_workers ;;
  logs) collect_logs ;;
  stop) stop ;;
  run) install; train "$@"; wait_for_workers; collect_logs; [ "$dry_run" = 1 ] || job_status ;;
esac
