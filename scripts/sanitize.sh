#!/usr/bin/env bash
# scripts/sanitize.sh address|thread [meson test args...]
# Builds the project with AddressSanitizer+UBSan (address) or
# ThreadSanitizer (thread) in build-san-<mode> and runs the concurrency
# suites there: the reliability suites (killed writers, killed daemon,
# hostile sockets, soak, ...) plus any suite named in SHMCACHE_SAN_SUITES.
# Stress lengths are shortened (sanitizers are slow); override with
# SHMCACHE_KILL_SECONDS / SHMCACHE_SOAK_SECONDS.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/common.sh
mode=${1:-}
case $mode in
  address) sanitize=address,undefined ;;
  thread) sanitize=thread ;;
  *) echo "usage: scripts/sanitize.sh address|thread [meson test args]" >&2; exit 2 ;;
esac
shift
dir=build-san-$mode
ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}" || exit 1
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" -Db_sanitize=$sanitize -Db_lundef=false -Dpython=disabled \
    -Dbuildtype=debugoptimized -Db_ndebug=false >/dev/null || exit 1
fi
ninja -C "$dir" || exit 1
export SHMCACHE_KILL_SECONDS=${SHMCACHE_KILL_SECONDS:-8}
export SHMCACHE_SOAK_SECONDS=${SHMCACHE_SOAK_SECONDS:-10}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
suites=(--suite reliability)
for s in ${SHMCACHE_SAN_SUITES:-}; do suites+=(--suite "$s"); done
meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 \
  --timeout-multiplier 4 "${suites[@]}" "$@"
