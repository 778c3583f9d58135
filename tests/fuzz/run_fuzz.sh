#!/bin/sh
# run_fuzz.sh TARGET_EXE SEED_CORPUS WORK_DIR [SECONDS] [extra libFuzzer args]
# A bounded libFuzzer run: new inputs go to WORK_DIR/corpus (the committed
# seed corpus is only read), crashes to WORK_DIR/. Prints the number of
# executions. Exit status non-zero on any crash, leak or sanitizer report.
set -u
exe=$1 seeds=$2 work=$3 secs=${4:-${SHMCACHE_FUZZ_SECONDS:-20}}
shift 3; [ $# -gt 0 ] && shift
mkdir -p "$work/corpus"
# The target's shm and run dirs go under one directory of this run, removed
# however the target ends (a crash skips its own clean-up).
SHMCACHE_FUZZ_TMPDIR=$(mktemp -d /dev/shm/shmcache-fuzz-run.XXXXXX) || exit 1
export SHMCACHE_FUZZ_TMPDIR
trap 'rm -rf "$SHMCACHE_FUZZ_TMPDIR"' EXIT
# sh runs the EXIT trap on a signal only when the signal has a trap: a run
# stopped (meson's timeout, a CI job cancelled) must not leave the dir.
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
name=$(basename "$exe")
log="$work/$name.log"
"$exe" -max_total_time="$secs" -max_len=20000 -timeout=10 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds" >"$log" 2>&1
rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
echo "fuzz $name: ${runs:-0} executions in ${secs} s, exit $rc"
if [ $rc -ne 0 ]; then tail -n 60 "$log"; fi
exit $rc
