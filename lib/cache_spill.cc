// Rows on disk: puts of spilled rows are staged in shared memory for the
// daemon, which writes the RocksDB spill store (spill_stage.h; one request
// per row, with the row in it, only when no stage can be had); gets read the
// store in this process (spill_reader.h), and ask the daemon only for what
// its view lacks.

#include <algorithm>
#include <cstring>
#include <vector>

#include "format/row_codec.h"
#include "format/row_copy.h"
#include "lib/cache_impl.h"
#include "lib/spill_reader.h"

namespace shmcache {

namespace {

// Fills *row from an encoded spilled row; false (the row is left to the
// daemon) when it is not whole or is not row `id`'s.
// `rows_in_call`: the rows the fetch reads (row_copy.h).
bool AdoptSpilled(uint64_t id, std::span<const std::byte> bytes, Row* row,
                  size_t rows_in_call) {
  // Straight from the page cache (the table files are mapped): copied as a
  // hit in memory is.
  CopyRowBytes(RowCodec::Reserve(row, bytes.size()), bytes.data(), bytes.size(),
               rows_in_call);
  return RowCodec::Adopt(row, bytes.size()).ok() && RowCodec::KeyOf(row->view()) == id;
}

}  // namespace

void CacheImpl::FetchSpilled(std::span<const uint64_t> ids, Row* const* rows,
                             Status* statuses) {
  std::shared_ptr<SpillReader> reader =
      SpillReader::ForInstance(client_->paths(), &reader_use_);
  if (!reader) return FetchSpilledFromDaemon(ids, rows, statuses);
  std::unique_ptr<bool[]> got(new bool[ids.size()]);
  // Positions still to read, and their ids.
  std::vector<size_t> left(ids.size());
  std::vector<uint64_t> left_ids(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) left[i] = i;
  const size_t row_bytes = SpilledRowBytes();
  for (int attempt = 0; attempt < 2 && !left.empty(); ++attempt) {
    reader->MultiGet(
        cache_id_, left_ids, row_bytes,
        [&](size_t k, std::span<const std::byte> bytes) {
          if (AdoptSpilled(left_ids[k], bytes, rows[left[k]], ids.size()))
            statuses[left[k]] = Status::OK();
          else got[k] = false;
        },
        std::span(got.get(), left.size()));
    size_t kept = 0;
    for (size_t k = 0; k < left.size(); ++k) {
      if (got[k]) continue;
      left[kept] = left[k];
      left_ids[kept++] = left_ids[k];
    }
    left.resize(kept);
    left_ids.resize(kept);
    // Rows spilled after the reader's last catch-up: catch up once and
    // look again.
    if (left.empty() || attempt > 0) break;
    SpillReader::CatchUp c = reader->MaybeCatchUp();
    if (c == SpillReader::CatchUp::kFailed)
      SpillReader::Forget(client_->paths(), reader.get());
    if (c != SpillReader::CatchUp::kDone) break;
  }
  stats_.CountSpillReads(ids.size() - left.size());
  if (left.empty()) return;
  std::vector<Row*> left_rows(left.size());
  std::vector<Status> left_statuses(left.size());
  for (size_t k = 0; k < left.size(); ++k) left_rows[k] = rows[left[k]];
  FetchSpilledFromDaemon(left_ids, left_rows.data(), left_statuses.data());
  for (size_t k = 0; k < left.size(); ++k)
    statuses[left[k]] = std::move(left_statuses[k]);
}

// The rows a call reads are drawn from these: their mean is what the
// call's rows average, give or take. A reader that chose by the average
// of the rows its last call read (as it did) flipped from call to call
// for rows of sizes about kSeekRowBytes (the mean of 64 rows drawn at
// random wanders by an eighth of the sizes' spread around this one), and
// each cache read with another's choice where caches of small and large
// rows shared the instance's reader. This one moves by at most a row's
// difference from it over the rows counted, as rows are spilled, and not
// at all once they stop; it is known before the cache's first read.
size_t CacheImpl::SpilledRowBytes() const {
  const layout::StatsSlot& daemon = header_->stats[0];
  const uint64_t rows = daemon.disk_rows.load(std::memory_order_relaxed);
  if (rows == 0) return 0;
  return daemon.disk_bytes.load(std::memory_order_relaxed) / rows;
}

void CacheImpl::FetchSpilledFromDaemon(std::span<const uint64_t> ids, Row* const* rows,
                                       Status* statuses) {
  size_t done = 0;
  while (done < ids.size()) {
    size_t n = std::min<size_t>(ids.size() - done, protocol::kMaxSpillBatch);
    protocol::SpillGetRequest request{.cache_id = cache_id_};
    request.ids.assign(ids.begin() + static_cast<long>(done),
                       ids.begin() + static_cast<long>(done + n));
    protocol::SpillGetResponse answer;
    std::string body;
    Status s = client_->Call(request, &answer, &body);
    if (s.ok() && answer.answers.size() != n) {
      s = Status::Corruption("malformed spill response");
    }
    if (!s.ok()) {
      for (size_t i = done; i < ids.size(); ++i) statuses[i] = s;
      return;
    }
    size_t answered = 0;
    for (const protocol::SpillGetResponse::Answer& a : answer.answers) {
      if (a.mark == protocol::kSpillAskAgain) break;
      const size_t k = done + answered++;
      if (a.mark == protocol::kSpillFailed) {
        // The daemon dropped the row (Store::SpillGet): a miss now.
        statuses[k] = Status::RowDropped(
            std::string_view(reinterpret_cast<const char*>(a.row.data()), a.row.size()));
        rows_dropped_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (a.mark != protocol::kSpillFound) {
        statuses[k] = Miss(ids[k]);
        continue;
      }
      std::memcpy(RowCodec::Reserve(rows[k], a.row.size()), a.row.data(), a.row.size());
      statuses[k] = RowCodec::Adopt(rows[k], a.row.size());
      if (statuses[k].ok() && RowCodec::KeyOf(rows[k]->view()) != ids[k]) {
        statuses[k] = Status::Corruption("spilled row carries another id");
      }
    }
    if (answered == 0) {  // the daemon answers a first row always; never spin
      for (size_t i = done; i < ids.size(); ++i) {
        statuses[i] = Status::Corruption(
            "the cache server answered none of the "
            "spilled rows asked for");
      }
      return;
    }
    done += answered;
  }
}

bool CacheImpl::SpillingOn() const {
  return layout::SpillingOn(header_->state.load(std::memory_order_relaxed));
}

bool CacheImpl::SpillsNow() const {
  return layout::SpillsNow(header_->state.load(std::memory_order_relaxed));
}

Status CacheImpl::ToDisk(uint64_t id, size_t size, size_t* disk_bytes) {
  // Checked before anything is staged or sent: a row the daemon could not
  // read back whole in one answer (kSpillGet) is not spilled.
  if (size > protocol::kMaxSpilledRowBytes) {
    return protocol::SpilledRowTooLarge(id, size);
  }
  *disk_bytes = size;
  return Status::OK();
}

void CacheImpl::SpillRows(std::span<const SpillStage::Row> rows, Status* statuses,
                          bool* inserted) {
  size_t done = 0;
  Status s = stage_.Put(client_.get(), cache_id_, rows, statuses, inserted, &done);
  // No stage could be had (no room in the shm dir for one, say): a request
  // per row, until the cache takes no more.
  bool stop = s.IsUnavailable();
  for (size_t k = done; k < rows.size(); ++k) {
    const SpillStage::Row& r = rows[k];
    bool added = false;
    if (!stop) {
      s = SpillPut(r.id, r.columns, r.size, &added);
      stop = s.IsFull() || s.IsUnavailable();
    }
    statuses[r.index] = s;
    if (inserted) inserted[r.index] = added;
  }
  uint64_t full = 0;
  for (const SpillStage::Row& r : rows) full += statuses[r.index].IsFull() ? 1 : 0;
  if (full > 0) stats_.CountPutsFull(full);
}

Status CacheImpl::SpillPut(uint64_t id, std::span<const ColumnRef> columns, size_t size,
                           bool* inserted) {
  // Checked before anything is sent: a frame over the limit would make the
  // daemon drop the connection.
  if (size > protocol::kMaxSpilledRowBytes) {
    return protocol::SpilledRowTooLarge(id, size);
  }
  static thread_local std::vector<uint64_t> buf;
  buf.resize((size + 7) / 8);
  auto* bytes = reinterpret_cast<std::byte*>(buf.data());
  RowCodec::Encode(id, columns, bytes, size);
  protocol::SpillPutResponse answer;
  Status s = client_->Call(
      protocol::SpillPutRequest{.cache_id = cache_id_,
                                .row_id = id,
                                .row = std::span<const std::byte>(bytes, size)},
      &answer);
  if (!s.ok()) return s;
  if (inserted) *inserted = answer.inserted;
  return Status::OK();
}

}  // namespace shmcache
