// A cache's memory: what is left of its budget and of the server's cap,
// and what it says when one of them is used up.
#include "cache_state.h"

#include <algorithm>

#include <fmt/format.h>

#include "logger.h"

namespace shmcache {

namespace {
double Megabytes(uint64_t n) { return static_cast<double>(n) / (1 << 20); }

// if/return, not ?: (clang-analyzer reads a Status out of ?: as a leak).
Status FullStatus(const std::string& msg, bool by_cap) {
  if (by_cap) return Status::FullServerCap(msg);
  return Status::Full(msg);
}
}  // namespace

uint64_t CacheState::BudgetLeft() const {
  return budget_bytes_ > data_bytes_ ? budget_bytes_ - data_bytes_ : 0;
}

Status CacheState::NoRoomFor(uint64_t chunk_bytes, uint64_t min_bytes,
                             const MemoryAccount& account) {
  const uint64_t left = BudgetLeft();
  const uint64_t room = std::min(left, account.available());
  if (room >= layout::kMinSegmentBytes) {
    // Room for ordinary rows is left: refusing them all for one big row
    // would waste it.
    std::string where = room < left
                            ? fmt::format(
                                  "{:.1f} MB are left under the server's memory cap "
                                  "of {} MB (the cache's budget is {} MB)",
                                  Megabytes(room), account.cap >> 20, budget_bytes_ >> 20)
                            : fmt::format("{:.1f} MB are left of its budget of {} MB",
                                          Megabytes(room), budget_bytes_ >> 20);
    return Status::TooLarge(fmt::format(
        "a row of {:.1f} MB does not fit in cache {}: {}; it is not cached, "
        "smaller rows still are",
        Megabytes(chunk_bytes - sizeof(layout::ChunkHeader)), cache_id_, where));
  }
  if (left < min_bytes) {
    return MemoryUsedUp(
        fmt::format("its budget of {} MB is used up", budget_bytes_ >> 20), false);
  }
  return MemoryUsedUp(
      fmt::format("the server's memory cap of {} MB is used up", account.cap >> 20),
      true);
}

Status CacheState::MemoryUsedUp(const std::string& why, bool by_cap) {
  if (header_->state.load() & layout::kStateSpilling) {
    if (!(header_->state.fetch_or(layout::kStateMemFull) & layout::kStateMemFull) &&
        log_) {
      log_->Info("cache {}: {}; further rows spill to disk", cache_id_, why);
    }
    if (by_cap) MarkByCap(layout::kStateMemFull);
    return FullStatus(
        fmt::format("cache {} memory is full: {}; rows spill to disk", cache_id_, why),
        by_cap);
  }
  MarkFull(why);
  if (by_cap) MarkByCap(layout::kStateFull);
  return FullStatus(fmt::format("cache {} is full: {}", cache_id_, why), by_cap);
}

void CacheState::MarkByCap(uint32_t bits) {
  cap_full_bits_ |= bits;
  header_->state.fetch_or(layout::kStateByCap);
}

bool CacheState::ResumeIfCapAllows(const MemoryAccount& account) {
  if (cap_full_bits_ == 0 || destroyed_ ||
      account.available() < layout::kMinSegmentBytes) {
    return false;
  }
  header_->state.fetch_and(~(cap_full_bits_ | layout::kStateByCap));
  cap_full_bits_ = 0;
  if (log_) {
    log_->Info(
        "cache {} (session {}, '{}') takes rows again: {} MB are free under "
        "the server's memory cap",
        cache_id_, session_id_, name_, account.available() >> 20);
  }
  return true;
}

}  // namespace shmcache
