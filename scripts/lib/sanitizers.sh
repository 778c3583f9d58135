# shellcheck shell=bash
# The sanitizer builds and runs, shared by scripts/test.sh and
# scripts/sanitize.sh. Source it after common.sh; it defines functions only.
#
# Two clang builds, each doing double duty so that CI compiles the tree
# twice more, not four times:
#   build-fuzz  ASan + UBSan (-Dfuzz=true instruments everything): the
#               libFuzzer targets, and the C++ suites
#   build-tsa   TSan, compiled with clang's thread-safety analysis as errors
#               (-Wthread-safety -Werror=thread-safety): that check, and the
#               C++ suites
# Both with assertions on. The suites are every C++ suite but the ones about
# the installed shared library (suite "library": a sanitized static build
# has none). Stress lengths are short (SHMCACHE_KILL_SECONDS,
# SHMCACHE_SOAK_SECONDS). Every sanitizer report, the daemons' included (they
# detach from the test's stderr), is written under the run's log dir, and
# san_reports fails on any; scripts/sanitizers/ holds the suppressions, each
# with its reason.

# san_dir MODE: the build dir of a mode (address or thread).
san_dir() {
  case $1 in
    address) echo build-fuzz ;;
    thread) echo build-tsa ;;
    *) return 1 ;;
  esac
}

# san_configure MODE: sets up (or reconfigures) that build with clang.
san_configure() {
  local dir opts
  dir=$(san_dir "$1") || return 1
  case $1 in
    address)
      opts=(-Dfuzz=true -Dtests=true -Dpython=disabled -Ddefault_library=static
            -Db_lundef=false -Db_ndebug=false) ;;
    thread)
      opts=(-Dtests=true -Dpython=enabled -Db_sanitize=thread -Db_lundef=false
            -Db_ndebug=false "-Dcpp_args=-Wthread-safety -Werror=thread-safety") ;;
  esac
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "${opts[@]}" >/dev/null
  else
    CXX=clang++ meson setup "$dir" "${opts[@]}" >/dev/null
  fi
}

# TSan's die_after_fork=0: a child forked from a process with threads
# starting threads of its own is what the library supports and the suites
# test (a DataLoader worker forked mid-epoch opens its spill reader, whose
# RocksDB starts threads); TSan would kill that child instead. Its runtime
# after such a fork is best-effort, its reports there too.
#
# san_run MODE LOGDIR [meson test args...]: runs the C++ suites in that
# build (built already), sanitizer reports into LOGDIR (emptied first); the
# meson verdicts are in <build>/meson-logs/testlog.json. Fails when a test
# failed.
san_run() {
  local mode=$1 logs=$2 root=$PWD dir
  shift 2
  dir=$(san_dir "$mode") || return 1
  rm -rf "$logs" && mkdir -p "$logs"
  local supp=$root/scripts/sanitizers
  local common="log_path=$logs/report:log_exe_name=1"
  # Left out under ASan + UBSan: HostileSocket.OutOfDescriptorsTheDaemonWaitsInsteadOfSpinning.
  # Its daemon uses up its 64 descriptors on purpose, and UBSan's vptr check
  # needs one pipe (two descriptors) to probe a vtable it has not seen yet:
  # the probe fails with EMFILE and UBSan kills the daemon with a false
  # "invalid vptr" on the accept retry timer. A runtime suppression cannot
  # stop it (the build is -fno-sanitize-recover). Passes in the plain build
  # and under TSan. See the sanitizers section of docs/contributing.md.
  local filter=${GTEST_FILTER:-}
  if [ "$mode" = address ] && [ -z "$filter" ]; then
    filter=-HostileSocket.OutOfDescriptorsTheDaemonWaitsInsteadOfSpinning
  fi
  # A subshell: GTEST_FILTER is set only when there is a filter (an empty
  # one would be read as a filter).
  (
  if [ -n "$filter" ]; then export GTEST_FILTER=$filter; fi
  SHMCACHE_KILL_SECONDS=${SHMCACHE_KILL_SECONDS:-4} \
  SHMCACHE_SOAK_SECONDS=${SHMCACHE_SOAK_SECONDS:-5} \
  ASAN_OPTIONS=${ASAN_OPTIONS:-$common:detect_leaks=1:abort_on_error=1} \
  LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$supp/lsan.supp} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-$common:print_stacktrace=1:halt_on_error=1} \
  TSAN_OPTIONS=${TSAN_OPTIONS:-$common:halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$supp/tsan.supp} \
    meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes 2 \
      --timeout-multiplier 4 --no-suite library --no-suite fuzz "$@"
  )
}

# san_reports LOGDIR: prints every sanitizer report written there (a
# daemon's too, which no test may have noticed); fails when there is one.
san_reports() {
  local r n=0
  for r in "$1"/report*; do
    [ -e "$r" ] || continue
    echo "== sanitizer report $r"
    cat "$r"
    n=$((n + 1))
  done
  [ $n -eq 0 ] && echo "no sanitizer report" && return 0
  echo "$n sanitizer report(s)"
  return 1
}
