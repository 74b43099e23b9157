# Shell helpers the launchers share (sourced).

# The words as a shell needs them typed: plain words bare, the others in single quotes.
quote() {
  local word words=()
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then words+=("$word"); else words+=("'${word//\'/\'\\\'\'}'"); fi
  done
  echo "${words[*]}"
}
