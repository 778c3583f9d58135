#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (C++ GoogleTest
# suites through meson, then the Python suites through pytest). The last
# line is the summary over all suites: "N passed, N failed, N skipped".
# Exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/lib/common.sh

ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}" || { echo "0 passed, 1 failed"; exit 1; }
build_project build || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

results=$root/build/test-results
rm -rf "$results" && mkdir -p "$results"
# Tests make their own daemons, sockets and segments; keep them apart from
# any server the user runs.
export SHMCACHE_RUN_DIR=$(mktemp -d /tmp/shmcache-test.XXXXXX)
trap 'rm -rf "$SHMCACHE_RUN_DIR"' EXIT

echo "== C++ suites"
GTEST_OUTPUT="json:$results/" meson test -C build --print-errorlogs \
  --num-processes 2 ${SHMCACHE_TEST_ARGS:-}
meson_rc=$?

echo "== Python suites"
export PYTHONPATH=$root/build/clients/python${PYTHONPATH:+:$PYTHONPATH}
export SHMCACHE_BUILD_DIR=$root/build
if [ -d tests/python ]; then
  /usr/bin/python3 -m pytest -q tests/python --junitxml="$results/pytest.xml" \
    -p no:cacheprovider
fi

/usr/bin/python3 scripts/lib/count_results.py "$results" \
  "$root/build/meson-logs/testlog.json"
