#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (C++ GoogleTest
# suites through meson, checked for what they left behind, then the Python
# suites through pytest, mypy over the Python package, the docs' links and
# references, clang's thread-safety analysis, the C++ format check,
# clang-tidy, the fuzz targets, and the C++ suites again under
# ThreadSanitizer and under AddressSanitizer + UBSan). The last line is the
# summary over all suites: "N passed, N failed, N skipped".
# Exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.." || { echo "0 passed, 1 failed"; exit 1; }
root=$PWD
source scripts/lib/common.sh
source scripts/lib/sanitizers.sh

ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}" || { echo "0 passed, 1 failed"; exit 1; }
build_project build || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }

results=$root/build/test-results
rm -rf "$results" && mkdir -p "$results"
# Tests make their own daemons, sockets and segments; keep them apart from
# any server the user runs.
SHMCACHE_RUN_DIR=$(mktemp -d /tmp/shmcache-test.XXXXXX) || { echo "0 passed, 1 failed"; exit 1; }
export SHMCACHE_RUN_DIR
trap 'rm -rf "$SHMCACHE_RUN_DIR"' EXIT
# Every server a test starts stops by itself when this script ends, even if
# the test that started it crashed.
export SHMCACHE_WATCH_PID=$$

echo "== C++ suites"
# SHMCACHE_TEST_ARGS: extra meson test arguments, split at blanks.
read -ra test_args <<<"${SHMCACHE_TEST_ARGS:-}"
# One more counted case: the suites left no process and no /dev/shm entry
# behind (scripts/lib/leak_check_cpp.py; the Python suites check that per
# test in tests/python/conftest.py).
GTEST_OUTPUT="json:$results/" /usr/bin/python3 scripts/lib/leak_check_cpp.py \
  --junit "$results/cpp-leftovers.xml" "the C++ suites left nothing behind" -- \
  meson test -C build --print-errorlogs --num-processes 2 "${test_args[@]}"

echo "== Python suites"
export PYTHONPATH=$root/build/clients/python${PYTHONPATH:+:$PYTHONPATH}
export SHMCACHE_BUILD_DIR=$root/build
if [ -d tests/python ]; then
  /usr/bin/python3 -m pytest -q tests/python --junitxml="$results/pytest.xml" \
    -p no:cacheprovider
  pytest_rc=$?
  # pytest ended before it wrote its report (killed, or a test's deadline
  # backstop in tests/python/deadline.py ended it): one failed case, so the
  # summary never counts the Python suites as passed by their absence.
  if [ ! -s "$results/pytest.xml" ]; then
    echo "pytest ended (status $pytest_rc) without its report"
    echo "<testsuite><testcase name=\"python suites\"><failure message=\"pytest ended (status $pytest_rc) without its report\"/></testcase></testsuite>" \
      >"$results/pytest-ended.xml"
  fi
fi

# counted_check NAME PACKAGE FAILURE COMMAND...: runs COMMAND (after
# installing PACKAGE) as one counted case, $results/NAME.xml; on success
# prints the last line of its output, on failure all of it and FAILURE.
counted_check() {
  local name=$1 package=$2 failure=$3
  shift 3
  local log=$results/$name.log
  if ensure_packages "$package" && "$@" >"$log" 2>&1; then
    tail -1 "$log"
    echo "<testsuite><testcase name=\"$name\"/></testsuite>" >"$results/$name.xml"
  else
    cat "$log"
    echo "<testsuite><testcase name=\"$name\"><failure message=\"$failure\"/></testcase></testsuite>" \
      >"$results/$name.xml"
  fi
}

# ---- Types of the Python package -------------------------------------------
# mypy over clients/python/shmcache (clients/python/mypy.ini). One check.
echo "== mypy over the Python package"
mypy_check() {
  (cd clients/python &&
   mypy --config-file mypy.ini --cache-dir "$root/build/mypy-cache" shmcache)
}
counted_check mypy mypy "mypy found type errors: see above" mypy_check

# ---- Links and references of the docs ------------------------------------------
# scripts/check_docs.py: every relative link of a page (README.md, docs/,
# any *.md) and its #section exist, every file of the repository a page
# names exists, and every docs/ page a source cites. One check.
echo "== Links and references of the docs (scripts/check_docs.py)"
counted_check docs python3 "broken links or references in the docs: see above" \
  /usr/bin/python3 scripts/check_docs.py

# ---- Shell scripts -------------------------------------------------------------
# Every shell script, through shellcheck: the user's commands, CI's entry point,
# the libraries they source and the Slurm scripts root runs. Any finding,
# style included, fails it. One check.
echo "== Shell scripts (shellcheck)"
shell_check() {
  shellcheck -x .ci/run scripts/*.sh scripts/lib/*.sh examples/slurm/*.sh \
    tests/fuzz/*.sh && echo "shellcheck: no finding"
}
counted_check shellcheck shellcheck "shellcheck findings: see above" shell_check

# ---- Thread-safety analysis, and ThreadSanitizer ---------------------------
# A clang build in build-tsa with -Wthread-safety -Werror=thread-safety: a
# member read or written without the mutex its GUARDED_BY names, or a call
# without the lock its REQUIRES names, fails it (port/thread_annotations.h).
# One check. The same build is ThreadSanitizer's (scripts/lib/sanitizers.sh):
# the C++ suites run there, each a counted case, and any report (a daemon's
# too) fails one more check.
echo "== Thread-safety analysis (clang -Wthread-safety), ThreadSanitizer build"
tsa_build() {
  # meson's progress bars would share a line with this check's result.
  san_configure thread >"$results/tsa-setup.log" 2>&1 ||
    { cat "$results/tsa-setup.log"; return 1; }
  if ! ninja -C build-tsa >build-tsa/build.log 2>&1; then
    grep -E "error: " -A2 build-tsa/build.log | head -40
    return 1
  fi
  echo "thread-safety: build-tsa compiled with no warning"
}
counted_check thread-safety clang \
  "clang -Wthread-safety build failed: see above, or build-tsa/build.log" tsa_build
san_logs=()
# san_suites MODE LABEL WHO: the C++ suites under a sanitizer in its build
# (scripts/lib/sanitizers.sh), their failures printed, their verdicts
# counted with the other suites (san_logs), and one counted check that no
# report was written.
san_suites() {
  local mode=$1 label=$2 who=$3 dir
  dir=$(san_dir "$mode")
  rm -f "$dir/meson-logs/testlog.json"
  san_run "$mode" "$results/$label" >"$results/$label-run.log" 2>&1
  grep -E "^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT|ERROR)|^(Ok|Fail|Timeout):" "$results/$label-run.log"
  san_logs+=("cases:$root/$dir/meson-logs/testlog.json")
  counted_check "$label-reports" clang "$who reported: see above" \
    san_reports "$results/$label"
}
if ! grep -q "<failure" "$results/thread-safety.xml"; then
  echo "== C++ suites under ThreadSanitizer"
  san_suites thread tsan "ThreadSanitizer"
fi

# ---- C++ format --------------------------------------------------------------
# scripts/format.sh --check: a C++ file that clang-format 14 (.clang-format)
# would change fails it, listed; scripts/format.sh fixes it. One check.
echo "== C++ format (scripts/format.sh --check)"
counted_check format clang-format "C++ files out of format: run scripts/format.sh" \
  scripts/format.sh --check

# ---- clang-tidy ---------------------------------------------------------------
# scripts/tidy.sh: clang-tidy 14 (.clang-tidy) over format/, lib/, common/,
# daemon/ and clients/ with build's compile flags; any finding fails it, printed.
# Sources unchanged since found clean are not checked again (its cache is in
# ~/.cache/shmcache/tidy, shared by every clone, as ccache's is).
# One check.
echo "== clang-tidy (scripts/tidy.sh)"
counted_check clang-tidy clang-tidy "clang-tidy findings: see above, or run scripts/tidy.sh" \
  scripts/tidy.sh

# ---- Fuzz targets, and AddressSanitizer + UBSan --------------------------
# A bounded libFuzzer run per target ($SHMCACHE_FUZZ_SECONDS, default 20 s)
# in a separate clang build with ASan/UBSan (build-fuzz); each run is a meson
# test of that build, counted below. Longer runs: tests/fuzz/README.md. The
# same build is AddressSanitizer's and UBSan's (scripts/lib/sanitizers.sh):
# the C++ suites run there, each a counted case, and any report fails one
# more check.
echo "== Fuzz targets (${SHMCACHE_FUZZ_SECONDS:-20} s each)"
fuzz_log=$root/build-fuzz/meson-logs/fuzz-testlog.json
rm -f "$fuzz_log"
fuzz_ok=0
if ensure_packages clang libclang-rt-14-dev; then
  if { san_configure address && ninja -C build-fuzz >build-fuzz/build.log 2>&1; } ||
     { grep -E "error|FAILED" -A3 build-fuzz/build.log | head -40; false; }; then
    fuzz_ok=1
    rm -f build-fuzz/meson-logs/testlog.json
    meson test -C build-fuzz --no-rebuild --suite fuzz --num-processes 2 \
      --print-errorlogs
    cp build-fuzz/meson-logs/testlog.json "$fuzz_log"
    grep -ho 'fuzz fuzz_[a-z_]*: [0-9]* executions in [0-9]* s' \
      build-fuzz/meson-logs/testlog.txt
  fi
fi
if [ $fuzz_ok -eq 0 ]; then
  echo "fuzz build failed"
  mkdir -p "$(dirname "$fuzz_log")"
  echo '{"name": "fuzz build", "result": "FAIL", "cmd": ["fuzz-build"]}' >"$fuzz_log"
else
  echo "== C++ suites under AddressSanitizer + UBSan"
  san_suites address asan "AddressSanitizer or UBSan"
fi
# ---- end of fuzz targets and sanitizers ----------------------------------

/usr/bin/python3 scripts/lib/count_results.py "$results" \
  "$root/build/meson-logs/testlog.json" "$fuzz_log" "${san_logs[@]}"
