#!/usr/bin/env bash
# Runs every benchmark of benchmarks/ in one go on this machine: installs
# what is missing (Debian packages), builds a release tree in build-bench/,
# starts a private cache server (with a spill dir) and a private Redis on a
# Unix socket, runs the C++ harness, the Python API measurement, the
# PyTorch DataLoader end-to-end run, the shared-session check, the host
# sweep (processes and threads 1, 2, 4, ... up to the CPUs, for puts, page
# supply, GetBatch and CachedLoader warm and cold, and the GPU feed where
# CUDA is available: the C++ harness's sweep section and
# benchmarks/host_sweep.py) and the multi-node run
# (benchmarks/multinode_bench.py: 2 simulated nodes), then
# prints the table, writes benchmarks/results/latest.json,
# benchmarks/RESULTS.md and docs/bench.png. Everything it starts is
# stopped on exit.
#
# The headline server runs in its default configuration (/dev/shm; the
# table says which pages it has). When root, a second server started with
# SHMCACHE_HUGE_TMPFS=1 mounts a tmpfs of its own with huge=within_size (2 MB
# pages for segments; see daemon/huge_tmpfs.h) and measures the C++
# put/get/view again there: an extra, labelled configuration. Both servers
# are stopped on exit, which unmounts the tmpfs.
# The load average is sampled at each stage and printed with the table:
# figures taken with a load above the CPU count are unreliable.
#
#   scripts/bench.sh            # full run (7-8 minutes on a quiet 2-CPU VM)
#   BENCH_QUICK=1 scripts/bench.sh   # shorter timings, smaller data
#   BENCH_AB=main scripts/bench.sh   # and the read path against main's build
#
# Benchmarks measure; they assert nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source scripts/lib/common.sh

started=$(date +%s)
# The tree measured, for the report: the commit, and whether files it
# tracks differ from it (the run's own outputs aside).
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
if [ "$commit" = "?" ]; then
  commit="not a git checkout"
elif [ -n "$(git status --porcelain --untracked-files=no -- . \
      ':!benchmarks/RESULTS.md' ':!docs/bench.png' 2>/dev/null)" ]; then
  commit="$commit with uncommitted changes"
fi
skips=()   # parts this script skips itself: --skip WHAT=WHY for report.py

# The harness needs hiredis and liblmdb to build; the peers' servers and
# the Python extras are optional: what cannot be installed is said, and
# the part that needs it skipped.
ensure_packages "${SHMCACHE_BUILD_PACKAGES[@]}" libhiredis-dev liblmdb-dev librocksdb-dev
ensure_packages redis-server python3-matplotlib python3-lmdb ||
  echo "could not install redis-server, python3-matplotlib or python3-lmdb;" \
    "the parts that need one are skipped, and the report says which"
build=${BENCH_BUILD_DIR:-build-bench}
results=benchmarks/results
mkdir -p "$results" docs

# ---- build (release; Python extension when it builds) -----------------
configure() {
  if [ -f "$build/build.ninja" ]; then
    meson configure "$build" -Dbuildtype=release -Db_ndebug=true -Dtests=false "-Dpython=$1" >/dev/null
  else
    meson setup "$build" --buildtype=release -Db_ndebug=true -Dtests=false "-Dpython=$1" >/dev/null
  fi
}
echo "== build ($build, release)"
python_build=yes
configure auto
if ! ninja -C "$build" >"$build/bench-build.log" 2>&1; then
  echo "build with the Python extension failed (see $build/bench-build.log); building without it"
  python_build="no: the Python extension did not build"
  configure disabled
  ninja -C "$build" || exit 1
fi
if [ ! -x "$build/benchmarks/shmcache_bench" ]; then
  echo "error: $build/benchmarks/shmcache_bench was not built (hiredis, lmdb or rocksdb missing?)" >&2
  exit 1
fi

# ---- private servers ----------------------------------------------------
tmp=$(mktemp -d /tmp/shmcache-bench.XXXXXX)
export SHMCACHE_RUN_DIR=$tmp/run
export SHMCACHE_PORT=${BENCH_PORT:-50777}
mkdir -p "$SHMCACHE_RUN_DIR" "$tmp/spill" "$tmp/rocksdb" "$tmp/log"
lmdb_dir=$(mktemp -d /dev/shm/shmcache-bench-lmdb.XXXXXX)
admin=$build/clients/admin/shmcache
redis_pid=
extra_port=$((SHMCACHE_PORT + 1))
cleanup() {
  "$admin" --stop >/dev/null 2>&1 || true
  "$admin" -p "$extra_port" --stop >/dev/null 2>&1 || true
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$tmp" "$lmdb_dir"
}
trap cleanup EXIT
: >"$results/load.txt"
load_sample() {  # load_sample STAGE: the 1-minute load average now
  echo "$1 $(cut -d' ' -f1 /proc/loadavg)" >>"$results/load.txt"
}
load_sample start

echo "== servers"
"$admin" --start -s "$tmp/spill" --log_dir "$tmp/log" >/dev/null 2>&1 ||
  "$admin" --start -s "$tmp/spill" >/dev/null
# Where its segments are, and their pages: the headline's configuration.
info=$("$admin" --server_info --json)
shm_dir=$(sed -n 's/.*"shm_dir": "\([^"]*\)".*/\1/p' <<<"$info")
if grep -q '"shm_huge_pages": true' <<<"$info"; then
  headline="$shm_dir (huge pages: $(sed -n 's/.*"shm_pages": "\([^"]*\)".*/\1/p' <<<"$info"))"
else
  headline="$shm_dir (4 KB pages)"
fi
echo "shmcache server on port $SHMCACHE_PORT (spill dir $tmp/spill), segments in $headline"
redis_args=()
if command -v redis-server >/dev/null; then
  redis-server --port 0 --unixsocket "$tmp/redis.sock" --unixsocketperm 700 \
    --save "" --appendonly no --daemonize no --logfile "$tmp/redis.log" \
    --dir "$tmp" &
  redis_pid=$!
  for _ in $(seq 100); do [ -S "$tmp/redis.sock" ] && break; sleep 0.1; done
  echo "redis-server $(redis-server --version | awk '{print $3}') on $tmp/redis.sock (no persistence)"
  redis_args=(--redis_socket "$tmp/redis.sock")
else
  echo "Redis: skipped (redis-server is not installed)"
  skips+=(--skip "redis=redis-server is not installed")
fi

seconds=0.4 ws=512 images=1200
if [ -n "${BENCH_QUICK:-}" ]; then seconds=0.15 ws=128 images=300; fi

# ---- C++ harness ----------------------------------------------------------
echo "== C++ harness"
"$build/benchmarks/shmcache_bench" --seconds "$seconds" --working_set_mb "$ws" \
  --procs 1,2 --port "$SHMCACHE_PORT" "${redis_args[@]}" \
  --lmdb_dir "$lmdb_dir" --rocksdb_dir "$tmp/rocksdb" --out "$results/cpp.json"
load_sample "C++ harness"

# ---- the other pages: when the headline has 4 KB pages and this is root, the
# put and shmcache sections again on a server with its own huge-page tmpfs ---
rm -f "$results/extra.json"
extra_label="huge pages" extra_how="SHMCACHE_HUGE_TMPFS=1: the server's own tmpfs, huge=within_size"
if ! grep -q '"shm_huge_pages": true' <<<"$info" && [ "$(id -u)" = 0 ]; then
  echo "== C++ harness, segments on a huge-page tmpfs"
  if SHMCACHE_HUGE_TMPFS=1 "$admin" -p "$extra_port" --start --log_dir "$tmp/log" >/dev/null; then
    "$build/benchmarks/shmcache_bench" --sections put,shmcache \
      --seconds "$seconds" --working_set_mb "$ws" --procs 1,2 --port "$extra_port" \
      --out "$results/extra.json" || echo "huge-page run failed; its figures are missing"
    "$admin" -p "$extra_port" --stop >/dev/null 2>&1 || true
  else
    echo "could not start a server with a huge-page tmpfs; skipped"
    skips+=(--skip "huge pages=could not start a server with a huge-page tmpfs")
  fi
  load_sample "huge pages"
else
  echo "== no second run (the headline has huge pages already, or this is not root)"
  if [ "$(id -u)" != 0 ] && ! grep -q '"shm_huge_pages": true' <<<"$info"; then
    skips+=(--skip "huge pages=not root: a server cannot mount a huge-page tmpfs of its own")
  fi
fi

# ---- Python and PyTorch -----------------------------------------------------
echo "== Python"
export PYTHONPATH=$root/$build/clients/python${PYTHONPATH:+:$PYTHONPATH}
/usr/bin/python3 benchmarks/python_bench.py --port "$SHMCACHE_PORT" \
  --seconds "$seconds" --images "$images" --workdir "$tmp" \
  --python_build "$python_build" --out "$results/python.json" || {
  echo "python_bench.py failed; its figures are missing from the table"
  skips+=(--skip "python_bench.py=failed (its output above)"); }
load_sample "Python and DataLoader"

# ---- the read path against an older build: BENCH_AB=<git rev> -------------
# That revision's tree is built (release) under the run's temporary dir
# and its Python package measured against this one in interleaved rounds
# (benchmarks/ab_bench.py): read_into and warm CachedLoader epochs; and
# its PartitionedLoader exchange against this one (benchmarks/exchange_ab.py).
rm -f "$results/ab.json" "$results/exchange_ab.json"   # an A/B of this run only
if [ -n "${BENCH_AB:-}" ]; then
  echo "== A/B: $BENCH_AB (A) against this tree (B)"
  ab_src=$tmp/ab-src
  mkdir -p "$ab_src"
  if git archive "$BENCH_AB" | tar -x -C "$ab_src" &&
     (cd "$ab_src" && meson setup build --buildtype=release -Db_ndebug=true \
        -Dtests=false -Dpython=enabled >/dev/null && ninja -C build >/dev/null); then
    /usr/bin/python3 benchmarks/ab_bench.py --port "$SHMCACHE_PORT" --a "$ab_src/build" \
      --b "$build" ${BENCH_QUICK:+--rounds 2} --out "$results/ab.json" ||
      echo "ab_bench.py failed"
    # The partitioned exchange's remote-row fetch (2 nodes x 2 ranks).
    /usr/bin/python3 benchmarks/exchange_ab.py --a "$ab_src/build" --b "$build" \
      ${BENCH_QUICK:+--rounds 2 --rows 512 --side 64} --out "$results/exchange_ab.json" ||
      echo "exchange_ab.py failed"
  else
    echo "could not build $BENCH_AB; no A/B"
  fi
  load_sample "A/B"
fi

# ---- the host sweep, Python half: CachedLoader by workers and threads, GPU ----
echo "== host sweep (CachedLoader by workers and threads; GPU where CUDA is)"
rm -f "$results/sweep.json"
/usr/bin/python3 benchmarks/host_sweep.py --port "$SHMCACHE_PORT" ${BENCH_QUICK:+--quick} \
  --out "$results/sweep.json" || {
  echo "host_sweep.py failed; its figures are missing from the table"
  skips+=(--skip "host_sweep.py=failed (its output above)"); }
load_sample "host sweep"

# ---- more than one host: 2 simulated nodes (servers of their own) x 2 ranks ---
echo "== multinode"
rm -f "$results/multinode.json"
/usr/bin/python3 benchmarks/multinode_bench.py --build "$build" ${BENCH_QUICK:+--quick} \
  --out "$results/multinode.json" || {
  echo "multinode_bench.py failed; its figures are missing from the table"
  skips+=(--skip "multinode_bench.py=failed (its output above)"); }
load_sample "multinode"

# ---- report -------------------------------------------------------------------
elapsed=$(( $(date +%s) - started ))
/usr/bin/python3 benchmarks/report.py --cpp "$results/cpp.json" \
  --python "$results/python.json" --extra "$results/extra.json" \
  --multinode "$results/multinode.json" --sweep "$results/sweep.json" \
  --ab "$results/ab.json" --ab_label "${BENCH_AB:-}" \
  --headline "$headline" --extra_label "$extra_label" --extra_how "$extra_how" \
  --load "$results/load.txt" --elapsed "$elapsed" --started "$started" \
  --commit "$commit" "${skips[@]}" \
  --command "scripts/bench.sh${BENCH_QUICK:+ (BENCH_QUICK=1)}" \
  --json "$results/latest.json" --markdown benchmarks/RESULTS.md \
  --plot docs/bench.png
