#include "shmcache/batch_reader.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "format/row_copy.h"
#include "lib/batch_window.h"
#include "lib/fork_safety.h"
#include "port/mutex.h"

namespace shmcache {

namespace {

// A helper thread is woken for at least this many bytes of rows: below,
// the hand-off costs more than the copy it would share.
constexpr size_t kMinShareBytes = 256 << 10;

template <typename To, typename From>
void Convert(const std::byte* src, std::byte* dst, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    From v;
    std::memcpy(&v, src + k * sizeof(From), sizeof(From));
    auto w = static_cast<To>(v);
    std::memcpy(dst + k * sizeof(To), &w, sizeof(To));
  }
}

// Copies one column into its target's row (widening where the target does),
// as one of the `rows_in_call` rows this thread copies (row_copy.h).
void CopyColumn(const ColumnTarget& t, const ColumnView& c, std::byte* dst,
                size_t rows_in_call) {
  if (c.dtype == DType::kUInt16 && t.dtype == DType::kInt32) {
    Convert<int32_t, uint16_t>(c.data, dst, c.nbytes / sizeof(uint16_t));
  } else if (c.dtype == DType::kUInt32 && t.dtype == DType::kInt64) {
    Convert<int64_t, uint32_t>(c.data, dst, c.nbytes / sizeof(uint32_t));
  } else {  // the same bytes (uint64 into int64: its bits)
    CopyRowBytes(dst, c.data, c.nbytes, rows_in_call);
  }
}

// The row's column a target named `name` reads: stored under that name, or
// under it with kNumberSuffix (a Python number's column). Two lookups, the
// second only for a name the row lacks; no allocation (names are at most
// kMaxNameBytes).
std::optional<ColumnView> FindColumn(const RowView& row, std::string_view name) {
  if (std::optional<ColumnView> c = row.find(name)) return c;
  std::array<char, kMaxNameBytes + kNumberSuffix.size()> tagged;
  if (name.size() > kMaxNameBytes) return std::nullopt;
  std::memcpy(tagged.data(), name.data(), name.size());
  std::memcpy(tagged.data() + name.size(), kNumberSuffix.data(), kNumberSuffix.size());
  return row.find(std::string_view(tagged.data(), name.size() + kNumberSuffix.size()));
}

// The row's column for each target, when every one matches (Takes, shape).
bool Match(const RowView& row, std::span<const ColumnTarget> targets, ColumnView* cols) {
  for (size_t t = 0; t < targets.size(); ++t) {
    std::optional<ColumnView> c = FindColumn(row, targets[t].name);
    if (!c || !Takes(targets[t].dtype, targets[t].accept, c->dtype) ||
        !std::ranges::equal(c->shape, targets[t].shape)) {
      return false;
    }
    cols[t] = *c;
  }
  return true;
}

}  // namespace

bool Takes(DType target, Accept accept, DType stored) {
  if (stored == target) return true;
  switch (accept) {
    case Accept::kExact: return false;
    case Accept::kSameBytes:
      return (stored == DType::kBFloat16 && target == DType::kUInt16) ||
             (stored == DType::kBytes && target == DType::kUInt8);
    case Accept::kTorch:
      return (stored == DType::kUInt16 && target == DType::kInt32) ||
             (stored == DType::kUInt32 && target == DType::kInt64) ||
             (stored == DType::kUInt64 && target == DType::kInt64);
  }
  return false;
}

// What one share of a batch (a range of its rows) leaves for the calling
// thread, and how it saw the targets' columns stored.
struct BatchReader::Share {
  std::vector<size_t> spilled;  // positions of rows on disk
  Status error;
  std::span<StoredColumn> stored;  // empty: not asked
  size_t unseen = 0;               // targets whose column no row showed yet

  // Notes how row i stores the targets' columns, for those not seen yet.
  void Saw(const RowView& row, std::span<const ColumnTarget> targets, size_t i) {
    if (unseen == 0) return;
    for (size_t t = 0; t < targets.size(); ++t) {
      if (stored[t].row <= i) continue;
      std::optional<ColumnView> c = FindColumn(row, targets[t].name);
      if (!c) continue;
      if (stored[t].row == StoredColumn::kNoRow) --unseen;
      stored[t].row = i;
      stored[t].dtype = c->dtype;
      stored[t].shape.assign(c->shape.begin(), c->shape.end());
    }
  }

  // Copies row i, one of `rows_in_call` this thread copies, when it
  // matches; hit[i] says what became of it.
  void Deliver(const RowView& row, std::span<const ColumnTarget> targets,
               ColumnView* cols, size_t i, size_t rows_in_call, uint8_t* hit) {
    Saw(row, targets, i);
    if (!Match(row, targets, cols)) {
      hit[i] = kRowOtherLayout;
      return;
    }
    for (size_t t = 0; t < targets.size(); ++t) {
      CopyColumn(
          targets[t], cols[t],
          static_cast<std::byte*>(targets[t].base) + i * targets[t].row_stride_bytes,
          rows_in_call);
    }
    hit[i] = kRowRead;
  }

  // Reads ids [first, last) of the batch from memory.
  void Read(Cache* cache, std::span<const uint64_t> ids, size_t first, size_t last,
            std::span<const ColumnTarget> targets, uint8_t* hit, bool count) {
    RowView views[kBatchWindow];
    Status statuses[kBatchWindow];
    constexpr size_t kInlineColumns = 8;
    ColumnView inline_cols[kInlineColumns];
    std::vector<ColumnView> more;
    ColumnView* cols = inline_cols;
    if (targets.size() > kInlineColumns) {
      more.resize(targets.size());
      cols = more.data();
    }
    for (size_t base = first; base < last; base += kBatchWindow) {
      size_t n = std::min(kBatchWindow, last - base);
      auto window = ids.subspan(base, n);
      Status s =
          count ? cache->ViewBatch(window, std::span(views, n), std::span(statuses, n))
                : cache->ViewBatchUncounted(window, std::span(views, n),
                                            std::span(statuses, n));
      if (!s.ok()) {
        error = s;
        return;
      }
      for (size_t k = 0; k < n; ++k) {
        size_t i = base + k;
        hit[i] = kRowMissing;
        if (statuses[k].ok()) {
          Deliver(views[k], targets, cols, i, last - first, hit);
        } else if (statuses[k].IsNotSupported()) {
          spilled.push_back(i);
        } else if (!statuses[k].IsNotFound()) {
          error = statuses[k];
        }
      }
    }
  }
};

// num_threads - 1 helper threads, or as many as the system would start;
// the caller of Run works too.
class BatchReader::Pool {
 public:
  explicit Pool(int helpers) {
    threads_.reserve(static_cast<size_t>(std::max(helpers, 0)));
    for (int i = 0; i < helpers; ++i) {
      // A refused thread (EAGAIN: a process or memory limit; bad_alloc for
      // the state std::thread allocates first) is one helper less: its
      // exception leaving the constructor would destroy the helpers
      // started, joinable, which ends the process (std::terminate).
      try {
        threads_.emplace_back([this] { Loop(); });
      } catch (const std::system_error&) {
        break;
      } catch (const std::bad_alloc&) {
        break;
      }
    }
  }
  ~Pool() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    work_cv_.SignalAll();
    for (std::thread& t : threads_) t.join();
  }
  size_t size() const { return threads_.size() + 1; }

  // Runs fn(k) for every k in [0, shares), on the helpers and the caller;
  // returns when all are done.
  void Run(size_t shares, const std::function<void(size_t)>& fn) EXCLUDES(mu_) {
    if (shares <= 1 || threads_.empty()) {  // no helper to wake and wait for
      for (size_t k = 0; k < shares; ++k) fn(k);
      return;
    }
    {
      MutexLock lock(&mu_);
      fn_ = &fn;
      shares_ = shares;
      next_.store(0, std::memory_order_relaxed);
      busy_ = threads_.size();
      ++generation_;
    }
    work_cv_.SignalAll();
    Work();
    MutexLock lock(&mu_);
    while (busy_ != 0) done_cv_.Wait(&mu_);
    fn_ = nullptr;
  }

 private:
  // Reads fn_ and shares_ without mu_: Run writes them under mu_ before it
  // wakes the helpers and not again until every helper has checked out
  // (busy_ == 0), so mu_'s hand-off orders those reads; taking it here would
  // serialise the shares.
  void Work() NO_THREAD_SAFETY_ANALYSIS {
    for (size_t k; (k = next_.fetch_add(1, std::memory_order_relaxed)) < shares_;) {
      (*fn_)(k);
    }
  }
  void Loop() EXCLUDES(mu_) {
    uint64_t seen = 0;
    MutexLock lock(&mu_);  // let go around each share of work
    for (;;) {
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) break;
      seen = generation_;
      {
        MutexUnlock unlocked(&mu_);
        Work();
      }
      if (--busy_ == 0) done_cv_.Signal();
    }
  }

  Mutex mu_;
  CondVar work_cv_, done_cv_;
  // The job: published under mu_ (see Work).
  const std::function<void(size_t)>* fn_ GUARDED_BY(mu_) = nullptr;
  size_t shares_ GUARDED_BY(mu_) = 0;
  std::atomic<size_t> next_{0};
  size_t busy_ GUARDED_BY(mu_) = 0;  // helpers still in the current job
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

BatchReader::BatchReader(Cache* cache, int num_threads)
    : cache_(cache),
      fork_gen_(ForkGeneration()),
      pool_(std::make_unique<Pool>(std::max(num_threads, 1) - 1)) {}

BatchReader::~BatchReader() {
  // A child process has none of its parent's helper threads: joining them
  // would fail, so their Pool is left to the process's exit.
  if (fork_gen_ != ForkGeneration()) (void)pool_.release();
}

int BatchReader::num_threads() const { return static_cast<int>(pool_->size()); }

void BatchReader::AfterFork() {
  if (fork_gen_ == ForkGeneration()) return;
  size_t helpers = pool_->size() - 1;
  (void)pool_.release();  // its threads are the parent's (see ~BatchReader)
  pool_ = std::make_unique<Pool>(static_cast<int>(helpers));
  fork_gen_ = ForkGeneration();
}

Status BatchReader::ReadInto(std::span<const uint64_t> ids,
                             std::span<const ColumnTarget> targets,
                             std::span<uint8_t> hit_flags, std::span<StoredColumn> stored,
                             bool count) {
  const size_t n = ids.size();
  if (hit_flags.size() != n) {
    return Status::InvalidArgument("ReadInto: " + std::to_string(n) + " ids but " +
                                   std::to_string(hit_flags.size()) + " hit flags");
  }
  if (!stored.empty() && stored.size() != targets.size()) {
    return Status::InvalidArgument("ReadInto: " + std::to_string(targets.size()) +
                                   " targets but " + std::to_string(stored.size()) +
                                   " stored columns");
  }
  uint8_t* hit = hit_flags.data();
  AfterFork();
  size_t row_bytes = 0;
  for (const ColumnTarget& t : targets) row_bytes += t.row_stride_bytes;
  size_t shares = std::clamp<size_t>(n * row_bytes / kMinShareBytes, 1, pool_->size());
  shares = std::min(shares, n);
  // Each share notes the columns of its own rows; the first share that
  // saw a column saw it in the batch's first row that has it.
  std::vector<std::vector<StoredColumn>> seen(stored.empty() ? 0 : shares);
  std::vector<Share> results(shares);
  for (size_t k = 0; k < seen.size(); ++k) {
    seen[k].resize(targets.size());
    results[k].stored = seen[k];
    results[k].unseen = targets.size();
  }
  pool_->Run(shares, [&](size_t k) {
    results[k].Read(cache_, ids, n * k / shares, n * (k + 1) / shares, targets, hit,
                    count);
  });
  Status error;
  Share disk;
  for (Share& r : results) {
    if (!r.error.ok()) error = r.error;
    disk.spilled.insert(disk.spilled.end(), r.spilled.begin(), r.spilled.end());
  }
  std::vector<StoredColumn> on_disk(seen.empty() ? 0 : targets.size());
  disk.stored = on_disk;
  disk.unseen = on_disk.size();
  if (error.ok() && !disk.spilled.empty()) {
    error = ReadSpilled(ids, disk.spilled, targets, hit, &disk, count);
  }
  if (!error.ok()) std::fill(hit, hit + n, kRowMissing);
  for (size_t t = 0; t < stored.size(); ++t) {
    stored[t] = StoredColumn();
    for (size_t k = 0; k <= seen.size(); ++k) {
      StoredColumn& c = k < seen.size() ? seen[k][t] : on_disk[t];
      if (c.row < stored[t].row) stored[t] = std::move(c);
    }
  }
  return error;
}

Status BatchReader::ReadSpilled(std::span<const uint64_t> ids,
                                const std::vector<size_t>& where,
                                std::span<const ColumnTarget> targets, uint8_t* hit,
                                Share* seen, bool count) {
  std::vector<uint64_t> want(where.size());
  for (size_t k = 0; k < where.size(); ++k) want[k] = ids[where[k]];
  std::vector<Row> rows(where.size());
  std::vector<Status> statuses(where.size());
  Status s = count ? cache_->GetBatch(want, rows, statuses)
                   : cache_->GetBatchUncounted(want, rows, statuses);
  if (!s.ok()) return s;
  std::vector<ColumnView> cols(targets.size());
  for (size_t k = 0; k < where.size(); ++k) {
    if (statuses[k].ok()) {
      seen->Deliver(rows[k].view(), targets, cols.data(), where[k], where.size(), hit);
    } else if (!statuses[k].IsNotFound()) {
      return statuses[k];
    }
  }
  return Status::OK();
}

}  // namespace shmcache
