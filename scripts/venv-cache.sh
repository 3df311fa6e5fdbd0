# Sourced by scripts/*-venv. A virtualenv of a third-party stack is built once per machine: under
# $FARM_VENV_CACHE (default ~/.cache/rollout-farm/venvs), one directory per stack and version, and
# the checkout's .venv-NAME is a link to it, so another checkout (a fresh clone in CI) reuses the
# build instead of running pip for minutes again. The caller sets VENV (the checkout's name, e.g.
# .venv-harbor), STAMP (the file in the venv that holds the installed version) and VERSION.
VENV_CACHE=${FARM_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout-farm/venvs}
CACHED=$VENV_CACHE/${VENV#.venv-}-$VERSION
mkdir -p "$VENV_CACHE"

built() { [ -f "$1/$STAMP" ] && [ "$(cat "$1/$STAMP")" = "$VERSION" ] && [ -x "$1/bin/python" ]; }

# When the checkout's venv holds VERSION, or the machine's build of it does (linked here): print the
# venv's python and exit 0. Otherwise return.
use_built() {
  if ! built "$VENV"; then
    built "$CACHED" || return 0
    rm -rf "$VENV"
    ln -sfn "$CACHED" "$VENV"
  fi
  echo "$PWD/$VENV/bin/python"
  exit 0
}

# A fresh venv for VERSION, made by the python $1 in the machine's cache and linked from the checkout.
# Build it through $CACHED/bin/python: pip writes the path of the python it runs under into the
# scripts it installs, and the checkout's link may not outlive the build.
fresh_venv() {
  rm -rf "$VENV" "$CACHED"
  "$1" -m venv "$CACHED"
  ln -sfn "$CACHED" "$VENV"
}
