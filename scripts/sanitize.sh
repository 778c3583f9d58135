#!/usr/bin/env bash
# scripts/sanitize.sh address|thread [meson test args...]
# Builds the project with AddressSanitizer + UBSan (address: build-fuzz, the
# fuzz targets' clang build) or ThreadSanitizer (thread: build-tsa, the
# thread-safety analysis' clang build) and runs the C++ suites there, as
# scripts/test.sh does (scripts/lib/sanitizers.sh): every sanitizer report,
# a daemon's included, is printed from build-<dir>/san-logs and fails the
# run. Stress lengths are short; override with SHMCACHE_KILL_SECONDS /
# SHMCACHE_SOAK_SECONDS. Extra arguments go to meson test, e.g. one suite:
#   scripts/sanitize.sh thread fork_test
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/lib/common.sh
source scripts/lib/sanitizers.sh
mode=${1:-}
dir=$(san_dir "$mode") ||
  { echo "usage: scripts/sanitize.sh address|thread [meson test args]" >&2; exit 2; }
shift
ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}" clang libclang-rt-14-dev || exit 1
san_configure "$mode" || exit 1
ninja -C "$dir" || exit 1
rc=0
san_run "$mode" "$PWD/$dir/san-logs" "$@" || rc=1
san_reports "$PWD/$dir/san-logs" || rc=1
exit $rc
