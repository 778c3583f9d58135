#include "shmcache/batch_reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
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

// The row's column for each target, when every one matches exactly.
bool Match(const RowView& row, std::span<const ColumnTarget> targets, ColumnView* cols) {
  for (size_t t = 0; t < targets.size(); ++t) {
    std::optional<ColumnView> c = row.find(targets[t].name);
    if (!c || c->dtype != targets[t].dtype ||
        !std::ranges::equal(c->shape, targets[t].shape)) {
      return false;
    }
    cols[t] = *c;
  }
  return true;
}

void CopyRow(std::span<const ColumnTarget> targets, const ColumnView* cols, size_t i) {
  for (size_t t = 0; t < targets.size(); ++t) {
    auto* dst =
        static_cast<std::byte*>(targets[t].base) + i * targets[t].row_stride_bytes;
    CopyRowBytes(dst, cols[t].data, cols[t].nbytes);
  }
}

// Copies row i when it matches; its hit flag says whether it did.
void Deliver(const RowView& row, std::span<const ColumnTarget> targets,
             std::vector<ColumnView>& cols, size_t i, uint8_t* hit) {
  hit[i] = Match(row, targets, cols.data()) ? 1 : 0;
  if (hit[i]) CopyRow(targets, cols.data(), i);
}

// What one share of a batch leaves for the calling thread.
struct ShareResult {
  std::vector<size_t> spilled;  // positions of rows on disk
  Status error;
};

// Reads ids [first, last) of the batch from memory.
void ReadShare(Cache* cache, std::span<const uint64_t> ids, size_t first, size_t last,
               std::span<const ColumnTarget> targets, uint8_t* hit, ShareResult* out) {
  RowView views[kBatchWindow];
  Status statuses[kBatchWindow];
  std::vector<ColumnView> cols(targets.size());
  for (size_t base = first; base < last; base += kBatchWindow) {
    size_t n = std::min(kBatchWindow, last - base);
    Status s = cache->ViewBatch(ids.subspan(base, n), std::span(views, n),
                                std::span(statuses, n));
    if (!s.ok()) {
      out->error = s;
      return;
    }
    for (size_t k = 0; k < n; ++k) {
      size_t i = base + k;
      hit[i] = 0;
      if (statuses[k].ok()) {
        Deliver(views[k], targets, cols, i, hit);
      } else if (statuses[k].IsNotSupported()) {
        out->spilled.push_back(i);
      } else if (!statuses[k].IsNotFound()) {
        out->error = statuses[k];
      }
    }
  }
}

}  // namespace

// num_threads - 1 helper threads; the caller of Run works too.
class BatchReader::Pool {
 public:
  explicit Pool(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this] { Loop(); });
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
    mu_.Lock();  // let go around each share of work
    for (;;) {
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) break;
      seen = generation_;
      mu_.Unlock();
      Work();
      mu_.Lock();
      if (--busy_ == 0) done_cv_.Signal();
    }
    mu_.Unlock();
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
                             std::span<uint8_t> hit_flags) {
  const size_t n = ids.size();
  if (hit_flags.size() != n) {
    return Status::InvalidArgument("ReadInto: " + std::to_string(n) + " ids but " +
                                   std::to_string(hit_flags.size()) + " hit flags");
  }
  uint8_t* hit = hit_flags.data();
  AfterFork();
  size_t row_bytes = 0;
  for (const ColumnTarget& t : targets) row_bytes += t.row_stride_bytes;
  size_t shares = std::clamp<size_t>(n * row_bytes / kMinShareBytes, 1, pool_->size());
  shares = std::min(shares, n);
  std::vector<ShareResult> results(shares);
  pool_->Run(shares, [&](size_t k) {
    ReadShare(cache_, ids, n * k / shares, n * (k + 1) / shares, targets, hit,
              &results[k]);
  });
  Status error;
  std::vector<size_t> spilled;
  for (ShareResult& r : results) {
    if (!r.error.ok()) error = r.error;
    spilled.insert(spilled.end(), r.spilled.begin(), r.spilled.end());
  }
  if (error.ok() && !spilled.empty()) error = ReadSpilled(ids, spilled, targets, hit);
  if (!error.ok()) std::fill(hit, hit + n, 0);
  return error;
}

Status BatchReader::ReadSpilled(std::span<const uint64_t> ids,
                                const std::vector<size_t>& where,
                                std::span<const ColumnTarget> targets, uint8_t* hit) {
  std::vector<uint64_t> want(where.size());
  for (size_t k = 0; k < where.size(); ++k) want[k] = ids[where[k]];
  std::vector<Row> rows(where.size());
  std::vector<Status> statuses(where.size());
  Status s = cache_->GetBatch(want, rows, statuses);
  if (!s.ok()) return s;
  std::vector<ColumnView> cols(targets.size());
  for (size_t k = 0; k < where.size(); ++k) {
    if (statuses[k].ok()) {
      Deliver(rows[k].view(), targets, cols, where[k], hit);
    } else if (!statuses[k].IsNotFound()) {
      return statuses[k];
    }
  }
  return Status::OK();
}

}  // namespace shmcache
