#!/usr/bin/env bash
# Runs the test suites again and again under CPU load, each run in a new
# shuffled order, to find tests that pass only when timing is kind.
#
#   scripts/stress-tests.sh [--repeat N] [--load K] [--suite python|cpp]...
#                           [--seed S]
#
# --repeat N   runs of each suite (default 5)
# --load K     busy processes running beside the suites (default: CPU count);
#              started here and always killed, on failure and Ctrl-C too
# --suite X    only this suite (python: pytest over tests/python; cpp: the
#              meson tests of the build); repeatable; default both
# --seed S     seed of the first run (default: drawn); run i uses S+i-1
#
# Python order: SHMCACHE_TEST_SEED (tests/python/conftest.py shuffles the
# modules, and the tests in each). C++ order: the meson test names shuffled
# with the same seed, run one at a time; around each one a leak check
# (scripts/lib/leak_check_cpp.py) fails it if it left a process or a
# /dev/shm entry behind. The Python suite checks itself (conftest.py).
#
# Prints each run's seed and wall time, then every failing test with how
# many runs it failed in; exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
source scripts/lib/common.sh

repeat=5
load=$(nproc)
suites=()
seed=""
while [ $# -gt 0 ]; do
  case $1 in
    --repeat) repeat=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --suite) suites+=("$2"); shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "stress-tests.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#suites[@]} -eq 0 ] && suites=(python cpp)
for s in "${suites[@]}"; do
  case $s in python|cpp) ;; *)
    echo "stress-tests.sh: --suite must be python or cpp, not '$s'" >&2; exit 2 ;;
  esac
done
for v in "$repeat" "$load" ${seed:+"$seed"}; do
  case $v in ''|*[!0-9]*)
    echo "stress-tests.sh: --repeat, --load and --seed take a number, not '$v'" >&2
    exit 2 ;;
  esac
done
[ -n "$seed" ] || seed=$(( RANDOM << 15 | RANDOM ))

ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}" || exit 1
build_project build || { echo "build failed"; exit 1; }

# One dir per invocation: two stress runs of one tree do not share results.
out=$root/build/stress-results/$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$out"
SHMCACHE_RUN_DIR=$(mktemp -d /tmp/shmcache-stress.XXXXXX) || exit 1
export SHMCACHE_RUN_DIR
# Every server a test starts stops by itself when this script ends.
export SHMCACHE_WATCH_PID=$$
export PYTHONPATH=$root/build/clients/python${PYTHONPATH:+:$PYTHONPATH}
export SHMCACHE_BUILD_DIR=$root/build

busy=()
stop_load() {
  local p
  for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${busy[@]}"; do wait "$p" 2>/dev/null; done
  busy=()
}
trap 'stop_load; rm -rf "$SHMCACHE_RUN_DIR"' EXIT
# A Ctrl-C reaches the running suite too; whether or not it dies of it,
# stop after it.
interrupted=0
trap 'interrupted=1' INT TERM
check_interrupt() {
  if [ $interrupted -eq 1 ]; then echo "interrupted"; exit 130; fi
}
for ((i = 0; i < load; i++)); do
  ( trap - INT TERM; while :; do :; done ) &
  busy+=($!)
done

echo "stress: ${repeat} run(s) of ${suites[*]}, ${load} busy process(es), first seed ${seed}"
start_all=$SECONDS
for ((run = 1; run <= repeat; run++)); do
  s=$((seed + run - 1))
  dir=$out/run$run
  mkdir -p "$dir"
  echo "$s" >"$dir/seed"
  for suite in "${suites[@]}"; do
    t0=$SECONDS
    if [ "$suite" = python ]; then
      SHMCACHE_TEST_SEED=$s /usr/bin/python3 -m pytest -q tests/python \
        -p no:cacheprovider --junitxml="$dir/pytest.xml" >"$dir/pytest.log" 2>&1
      check_interrupt
      echo "run $run python seed $s: $(tail -1 "$dir/pytest.log") ($((SECONDS - t0)) s)"
    else
      mapfile -t names < <(meson test -C build --list 2>/dev/null |
        sed -n 's/^.* \/ //p' | /usr/bin/python3 -c '
import random, sys
names = sys.stdin.read().split()
random.Random(int(sys.argv[1])).shuffle(names)
print("\n".join(names))' "$s")
      check_interrupt
      if [ ${#names[@]} -eq 0 ]; then
        echo '{"name": "meson test --list", "result": "FAIL", "why": "no tests listed"}' \
          >>"$dir/cpp.jsonl"
      fi
      fails=0
      for name in "${names[@]}"; do
        /usr/bin/python3 scripts/lib/leak_check_cpp.py "$dir/cpp.jsonl" "$name" -- \
          meson test -C build --no-rebuild --print-errorlogs "$name" \
          >>"$dir/cpp.log" 2>&1 || fails=$((fails + 1))
        check_interrupt
      done
      echo "run $run cpp seed $s: ${#names[@]} tests, $fails failed ($((SECONDS - t0)) s)"
    fi
  done
done
stop_load
echo "stress: done in $((SECONDS - start_all)) s (logs: $out)"
/usr/bin/python3 scripts/lib/stress_summary.py "$out"
