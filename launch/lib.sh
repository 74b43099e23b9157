# Shell helpers the launchers share (sourced).

# The words as a shell needs them typed: plain words bare, the others in single quotes.
quote() {
  local word words=()
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then words+=("$word"); else words+=("'${word//\'/\'\\\'\'}'"); fi
  done
  echo "${words[*]}"
}

# Whether $1 is a port a coordinator can take: JAX's service takes the next one too.
coordinator_port() { [[ $1 =~ ^[1-9][0-9]{0,4}$ ]] && (($1 < 65535)); }
COORDINATOR_PORT_FIX="give a port from 1 to 65534 (the next one is taken too)"

# The python that checks a config before the launch (launch/check_config.py): the one beside the jaxlm program $1
# where one is given, else this checkout's install, else python3 (which may lack jaxlm: the check then says so).
checking_python() {
  local candidate
  for candidate in ${1:+"$(dirname "$1")/python"} "$(dirname "${BASH_SOURCE[0]}")/../.venv/bin/python"; do
    if [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
  echo python3
}
