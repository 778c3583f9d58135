#!/usr/bin/env bash
# Runs clang-tidy 14 with the checked-in .clang-tidy over the project's C++
# sources; prints every finding and exits 1 if there is any.
#
#   scripts/tidy.sh               checks every C++ source under util/, format/, lib/,
#                                 common/, daemon/ and clients/ (headers
#                                 through them)
#   scripts/tidy.sh FILE...       checks those sources only
#
# The compile flags come from build/compile_commands.json ($SHMCACHE_TIDY_BUILD
# for another build dir; configured with meson if missing). A source found
# clean is remembered under a key over clang-tidy's version, .clang-tidy, its
# flags and its preprocessed text (headers and comments included;
# scripts/lib/tidy_keys.py): an unchanged file is not checked again, in this
# tree or another clone (the keys hold no path of the tree). The cache is
# $SHMCACHE_TIDY_CACHE, default ~/.cache/shmcache/tidy ($XDG_CACHE_HOME), as
# ccache keeps its own. Two at a time ($SHMCACHE_TIDY_JOBS).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/common.sh

dirs=(include util format lib common daemon clients)
build=${SHMCACHE_TIDY_BUILD:-build}
jobs=${SHMCACHE_TIDY_JOBS:-2}
case "${1:-}" in -*) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 2 ;; esac

ct=${CLANG_TIDY:-}
if [ -z "$ct" ]; then
  if command -v clang-tidy-14 >/dev/null; then ct=clang-tidy-14; else ct=clang-tidy; fi
fi
if ! command -v "$ct" >/dev/null; then
  echo "tidy.sh: $ct not found: install Debian's clang-tidy (apt-get install clang-tidy)" >&2
  exit 2
fi
if [ ! -f "$build/compile_commands.json" ]; then
  meson setup "$build" -Dtests=true -Dpython=enabled >/dev/null
fi

files=()
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    "${dirs[@]/%//*.cc}" "${dirs[@]/%//*.cpp}" |
    sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done)
fi
[ ${#files[@]} -gt 0 ] || { echo "tidy.sh: no C++ sources found" >&2; exit 2; }

cache=${SHMCACHE_TIDY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shmcache/tidy}
mkdir -p "$cache"
salt="$("$ct" --version) $(sha256sum .clang-tidy)"
todo=()
cached=0
while read -r key f; do
  case "$key" in
    -) echo "tidy.sh: $f: not in $build/compile_commands.json (not built), skipped" >&2 ;;
    !) todo+=("-" "$f") ;;
    *) if [ -f "$cache/$key" ]; then cached=$((cached + 1)); else todo+=("$key" "$f"); fi ;;
  esac
done < <(/usr/bin/python3 scripts/lib/tidy_keys.py "$build" "$salt" "${files[@]}")

# One source: its findings go to stdout; a clean one is remembered.
check_one() {
  local out
  if out=$("$CT" -p "$BUILD" --quiet --warnings-as-errors='*' "$2" 2>&1); then
    [ "$1" = "-" ] || : >"$CACHE/$1"
  else
    printf '%s\n' "$out" | grep -v -E '^[0-9]+ (warnings?|errors?) generated\.$'
    return 1
  fi
}
export -f check_one
export CT=$ct BUILD=$build CACHE=$cache

report=
if [ ${#todo[@]} -gt 0 ]; then
  report=$(printf '%s\0' "${todo[@]}" |
           xargs -0 -n 2 -P "$jobs" bash -c 'check_one "$@"' _) || true
fi
n=$(( ${#todo[@]} / 2 ))
if printf '%s\n' "$report" | grep -q .; then
  printf '%s\n' "$report"
  bad=$(printf '%s\n' "$report" | grep -c -E ': (warning|error): ' || true)
  echo "clang-tidy: $bad findings over ${#files[@]} C++ sources ($n checked, $cached unchanged since clean)"
  echo "Fix them, or disable the check in place with // NOLINT(check) and the reason."
  exit 1
fi
echo "clang-tidy: ${#files[@]} C++ sources clean ($n checked, $cached unchanged since clean)"
