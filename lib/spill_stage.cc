#include "lib/spill_stage.h"

#include <algorithm>
#include <vector>

#include "format/protocol_messages.h"
#include "format/row_codec.h"

namespace shmcache {

Status SpillStage::Acquire(ClientImpl* client, uint32_t cache_id, uint64_t min_bytes) {
  file_.Unmap();
  protocol::SpillStageResponse answer;
  Status s = client->Call(
      protocol::SpillStageRequest{.cache_id = cache_id, .min_bytes = min_bytes}, &answer);
  if (!s.ok()) return s;
  ShmFile f;
  s = ShmFile::Open(client->paths().StageFile(cache_id, answer.tag), &f);
  if (!s.ok()) return s;
  if (f.size() < min_bytes || f.size() != answer.size) {
    return Status::Corruption("the staging file for spilled rows has another size");
  }
  file_ = std::move(f);
  tag_ = answer.tag;
  return Status::OK();
}

Status SpillStage::Put(ClientImpl* client, uint32_t cache_id, std::span<const Row> rows,
                       Status* statuses, bool* inserted, size_t* done) {
  ForkSafeLock lock(&mu_);
  *done = 0;
  if (fork_gen_ != ForkGeneration()) {
    // The parent's stage (and connection): this process asks for its own.
    file_.Unmap();
    fork_gen_ = ForkGeneration();
  }
  protocol::SpillPutStagedRequest request{.cache_id = cache_id};
  protocol::SpillPutStagedResponse answer;
  // One stage that the daemon no longer knows (a reconnect, a restarted
  // server) is asked for again once per call.
  bool asked_again = false;
  size_t i = 0;
  while (i < rows.size()) {
    if (file_.data() == nullptr || file_.size() < rows[i].size) {
      Status s = Acquire(client, cache_id, std::max<uint64_t>(rows[i].size, 1));
      if (!s.ok()) return s;
    }
    // As many rows as the stage and one request hold, back to back, up to
    // kRequestBytes (one row at least).
    request.tag = tag_;
    request.ids.clear();
    request.sizes.clear();
    size_t off = 0, end = i;
    while (end < rows.size() && request.ids.size() < protocol::kMaxSpillBatch &&
           rows[end].size <= file_.size() - off &&
           (end == i || off + rows[end].size <= kRequestBytes)) {
      RowCodec::Encode(rows[end].id, rows[end].columns,
                       reinterpret_cast<std::byte*>(file_.data() + off), rows[end].size);
      request.ids.push_back(rows[end].id);
      request.sizes.push_back(static_cast<uint32_t>(rows[end].size));
      off += rows[end].size;
      ++end;
    }
    Status s = client->Call(request, &answer);
    if (s.IsUnavailable() || s.IsCorruption()) {
      // No answer (a timeout, a broken connection) or none that could be
      // read: the daemon may still copy these rows out of the stage when it
      // gets to the request, so no row is staged there again (one
      // overwritten meanwhile would be stored torn).
      file_.Unmap();
    }
    if (s.IsNotFound() && !asked_again) {
      asked_again = true;
      file_.Unmap();
      continue;  // staged again into a new stage
    }
    if (s.ok() && answer.inserted.size() != end - i) {
      s = Status::Corruption("the answer to staged spilled rows has another count");
    }
    for (size_t k = i; k < end; ++k) {
      statuses[rows[k].index] = s;
      if (inserted) inserted[rows[k].index] = s.ok() && answer.inserted[k - i] != 0;
    }
    i = end;
    *done = i;
    if (s.IsFull() || s.IsUnavailable()) {
      // The cache takes no more rows (or the daemon is gone): so for the rest.
      for (size_t k = i; k < rows.size(); ++k) statuses[rows[k].index] = s;
      *done = rows.size();
      return Status::OK();
    }
  }
  return Status::OK();
}

}  // namespace shmcache
