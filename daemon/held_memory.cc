#include "daemon/held_memory.h"

#include <algorithm>

#include "daemon/logger.h"
#include "format/shm_file.h"

namespace shmcache {

uint64_t UnlinkHeldFile(const std::string& path, uint64_t bytes,
                        std::vector<HeldFile>* held) {
  HeldFile f;
  uint64_t size = 0;
  bool known = held != nullptr && StatFile(path, &f.id, &size);
  ShmFile::Unlink(path).PermitUncheckedError();
  if (!known) return 0;
  f.bytes = std::min(bytes, size);
  held->push_back(f);
  return f.bytes;
}

void HeldMemory::Add(uint32_t session, const std::vector<HeldFile>& files,
                     Clock::time_point now) {
  if (files.empty()) return;
  Session& s = sessions_[session];
  s.destroyed = now;
  for (const HeldFile& f : files) {
    files_.push_back(Entry{session, f});
    bytes_ += f.bytes;
    ++s.files;
  }
  next_scan_ = now;
  interval_ = kFirstScanInterval;
}

std::vector<FileId> HeldMemory::Wanted() const {
  std::vector<FileId> out;
  out.reserve(files_.size());
  for (const Entry& e : files_) out.push_back(e.file.id);
  return out;
}

void HeldMemory::NoteMapped(Entry* e, Logger* log) {
  if (e->seen_mapped) return;
  e->seen_mapped = true;
  Session& s = sessions_[e->session];
  if (s.seen_bytes == 0 && log != nullptr) {
    log->Info(
        "session {} was destroyed while processes still map its memory; "
        "it stays counted against the memory cap until they unmap it",
        e->session);
  }
  s.seen_bytes += e->file.bytes;
}

void HeldMemory::NoteReleased(const Entry& e, Clock::time_point now, Logger* log) {
  auto it = sessions_.find(e.session);
  if (it == sessions_.end() || --it->second.files > 0) return;
  const Session& s = it->second;
  if (s.seen_bytes > 0 && log != nullptr) {
    double seconds = std::chrono::duration<double>(now - s.destroyed).count();
    log->Info(
        "session {}: the {:.1f} MB that processes kept mapped after destroy "
        "are free again, {:.1f} s later",
        e.session, static_cast<double>(s.seen_bytes) / (1 << 20), seconds);
  }
  sessions_.erase(it);
}

uint64_t HeldMemory::Settle(const std::vector<FileId>& looked_for, const MappedScan& scan,
                            Clock::time_point now, MemoryAccount* account, Logger* log) {
  const std::set<FileId>& mapped = scan.mapped;
  std::set<FileId> scanned(looked_for.begin(), looked_for.end());
  uint64_t released = 0;
  std::erase_if(files_, [&](Entry& e) {
    if (scanned.count(e.file.id) == 0) return false;
    if (mapped.count(e.file.id) != 0) {
      NoteMapped(&e, log);
      return false;
    }
    account->Release(e.file.bytes);
    bytes_ -= e.file.bytes;
    released += e.file.bytes;
    NoteReleased(e, now, log);
    return true;
  });
  holders_ = scan.holders;
  next_scan_ = now + interval_;
  interval_ = std::min<Clock::duration>(interval_ * 2, kMaxScanInterval);
  return released;
}

}  // namespace shmcache
