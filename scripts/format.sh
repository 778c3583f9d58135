#!/usr/bin/env bash
# Applies .clang-format to the project's C++ files, in place.
#
#   scripts/format.sh                 formats every C++ file
#   scripts/format.sh FILE...         formats those files only
#   scripts/format.sh --check [FILE...]
#                                     changes nothing; lists the files out of
#                                     format and exits 1 if there is any
#
# "Every C++ file": *.cc, *.h, *.cpp, *.hpp under the source directories
# below, tracked by git or new (not ignored). The version matters (another
# clang-format formats some lines differently): Debian 12's clang-format 14,
# or $CLANG_FORMAT.
set -euo pipefail
cd "$(dirname "$0")/.."

dirs=(include util port format lib common daemon clients tests benchmarks examples)

check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
case "${1:-}" in -*) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 2 ;; esac

cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  if command -v clang-format-14 >/dev/null; then cf=clang-format-14; else cf=clang-format; fi
fi
if ! command -v "$cf" >/dev/null; then
  echo "format.sh: $cf not found: install Debian's clang-format (apt-get install clang-format)" >&2
  exit 2
fi
version=$("$cf" --version)
case "$version" in
  *" version 14."*) ;;
  *) echo "format.sh: warning: $version; the project's format is clang-format 14's" >&2 ;;
esac

files=()
if [ $# -gt 0 ]; then
  files=("$@")
elif git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    "${dirs[@]/%//*.cc}" "${dirs[@]/%//*.h}" "${dirs[@]/%//*.cpp}" "${dirs[@]/%//*.hpp}" |
    sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t files < <(find "${dirs[@]}" -type f \
    \( -name '*.cc' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' \) | sort)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "format.sh: no C++ files found" >&2
  exit 2
fi

if [ $check -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P 2 "$cf" -i --style=file
  exit 0
fi

# --check: a file is out of format when clang-format would change it. One
# process reads many files (a few seconds for the tree); its report names
# each file at each line it would change.
report=$(printf '%s\0' "${files[@]}" |
         xargs -0 -n 64 "$cf" --dry-run --Werror --style=file 2>&1) || true
bad=$(printf '%s\n' "$report" |
      sed -n 's/^\(.*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' |
      sort -u)
if [ -z "$bad" ] && printf '%s\n' "$report" | grep -q .; then
  echo "clang-format failed:"
  printf '%s\n' "$report" | head -20
  exit 1
fi
if [ -n "$bad" ]; then
  n=$(printf '%s\n' "$bad" | wc -l)
  echo "$n of ${#files[@]} C++ files are out of format (.clang-format):"
  printf '%s\n' "$bad" | sed 's/^/  /'
  echo "Run scripts/format.sh to format them (or scripts/format.sh FILE...)."
  exit 1
fi
echo "${#files[@]} C++ files in format"
