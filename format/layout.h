// The shared-memory layout: every structure that lives in a shared-memory
// file, and the rules for reading it. Structures link by offsets and
// segment ids, never by pointers. Every binary file (cache, table, seg)
// starts with a magic number, the layout version and its sizes; attaching
// checks all three and refuses a mismatch.
//
// Files of one instance: "<shm dir>/shmcache.<uid>.<port>." followed by
// (names written and parsed by InstancePaths and ParseShmName, instance.h;
// numbers in decimal):
//   cache.<cache_id>              CacheHeader: identity, state, stats, tables
//   table.<cache_id>.<gen>.<tag>  TableHeader + Slot[capacity] (the index);
//                                 tag: 8 lowercase hex digits, TableInfo::tag
//   seg.<cache_id>.<seg_no>       SegmentHeader + chunks of rows (one cache,
//                                 one NUMA node)
//   sessions                      (daemon only) live session ids, one per
//                                 line, as text: no header
//   spilldb                       (daemon only) text: the spill database the
//                                 index's spilled rows are in; absent when none
//   huge                          (daemon only, always in /dev/shm) a
//                                 directory: the server's own huge-page
//                                 tmpfs, when it mounts one
//
// Writers: the daemon alone creates, sizes and unlinks files and writes the
// fields marked (daemon). Clients write rows into chunks leased to them, the
// index slots, and their own stats slot.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "shmcache/types.h"  // kMaxNameBytes: CacheHeader's name and fingerprint

namespace shmcache::layout {

// 2: table file names carry a random tag (TableInfo::tag).
// 3: StatsSlot counts spilled bytes and puts refused because full.
// 4: CacheHeader::lanes, the reads one thread counts without a locked add.
inline constexpr uint32_t kLayoutVersion = 5;

inline constexpr uint64_t kSegmentMagic = 0x31474553434D4853ULL;  // "SHMCSEG1"
inline constexpr uint64_t kCacheMagic = 0x31484341434D4853ULL;    // "SHMCACH1"
inline constexpr uint64_t kTableMagic = 0x31424154434D4853ULL;    // "SHMCTAB1"
inline constexpr uint32_t kChunkMagic = 0x4B4E4843;               // CHNK

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kMaxTables = 40;
inline constexpr size_t kStatsSlots = 64;
inline constexpr size_t kMaxSessions = 4096;
// A cache's data segments grow from the smallest to the largest size. A
// server cap below the smallest leaves no cache room for a row
// (common/option_checks.h refuses it).
inline constexpr uint64_t kMinSegmentBytes = 4u << 20;
inline constexpr uint64_t kMaxSegmentBytes = 256u << 20;

// ---- Locations: where a row lives, as stored in an index slot ----------
// bits 0..39 offset inside the segment, 40..62 segment id, 63 "on disk".
// 0, 1 and 2 are never locations: an offset is always past the header.
inline constexpr uint64_t kEmpty = 0;    // slot never used
inline constexpr uint64_t kClaimed = 1;  // slot taken, row not yet published
inline constexpr uint64_t kRetired = 2;  // row no longer served (its spill
                                         // store is gone): a miss; only an
                                         // insert of the same key reuses it
inline constexpr int kOffsetBits = 40;
inline constexpr uint64_t kOffsetMask = (1ULL << kOffsetBits) - 1;
inline constexpr uint64_t kSpilledBit = 1ULL << 63;
inline constexpr uint32_t kMaxSegmentId = (1U << 23) - 1;

inline uint64_t MakeLocation(uint32_t seg_id, uint64_t offset) {
  return (static_cast<uint64_t>(seg_id) << kOffsetBits) | offset;
}
inline uint32_t LocationSegment(uint64_t loc) {
  return static_cast<uint32_t>((loc & ~kSpilledBit) >> kOffsetBits);
}
inline uint64_t LocationOffset(uint64_t loc) { return loc & kOffsetMask; }

// ---- Common file header --------------------------------------------------
struct FileHeader {
  uint64_t magic;
  uint32_t version;      // kLayoutVersion
  uint32_t header_size;  // sizeof the concrete header struct
  uint64_t file_size;    // bytes of the whole file
};
static_assert(sizeof(FileHeader) == 24);

// ---- Statistics: one cache line per slot; a client uses slot
// (client_id % kStatsSlots), so the hit path never shares a line with
// another process unless more than kStatsSlots clients are attached.
struct alignas(kCacheLine) StatsSlot {
  std::atomic<uint64_t> hits;
  std::atomic<uint64_t> misses;
  std::atomic<uint64_t> numa_hits;
  std::atomic<uint64_t> rows;   // rows published
  std::atomic<uint64_t> bytes;  // their encoded bytes
  std::atomic<uint64_t> disk_rows;
  std::atomic<uint64_t> disk_bytes;  // (daemon, slot 0) their encoded bytes
  std::atomic<uint64_t> puts_full;   // puts refused because the cache was full
};
static_assert(sizeof(StatsSlot) == kCacheLine);

// ---- Read counters with one writer: a locked add on every hit is a full
// fence on x86, which keeps one hit's memory misses from overlapping the
// next one's. A lane is owned by one process (`owner`: its pid, taken by
// CAS from 0 or from a pid that is gone), and inside it by one thread,
// which counts with a plain load and store. Readers add the lanes to the
// slots.
struct alignas(kCacheLine) StatsLane {
  std::atomic<uint64_t> owner;  // pid of the owning process; 0: free
  std::atomic<uint64_t> hits;
  std::atomic<uint64_t> misses;
  std::atomic<uint64_t> numa_hits;
  // Spilled rows the owning process read from the spill database itself,
  // added by any of its threads (a locked add, once per batch read from
  // disk; the owner thread's plain stores never touch this field).
  std::atomic<uint64_t> spill_reads;
};
static_assert(sizeof(StatsLane) == kCacheLine);

// Cache state bits.
inline constexpr uint32_t kStateFull = 1;          // takes no more rows, not
                                                   // even on disk
inline constexpr uint32_t kStateDestroyed = 2;     // session dropped
inline constexpr uint32_t kStateSpillEnabled = 4;  // spilling was requested
                                                   // (spill_requested) and has
                                                   // not stopped (a disk error,
                                                   // no spill store): cleared
                                                   // when it stops
inline constexpr uint32_t kStateMemFull = 8;       // memory budget used up; with
                                                   // kStateSpillEnabled, rows go
                                                   // to disk
inline constexpr uint32_t kStateByCap = 16;        // kStateFull or kStateMemFull
                                                   // came from the server's
                                                   // memory cap, not the cache's
                                                   // budget; cleared with them
                                                   // when the cap frees up

// The reading of the state bits, one for the library and the daemon.
// "Spilling" names four things, each with its own name everywhere:
//   spill_requested  what the cache was opened with (CacheOptions,
//                    OpenCacheRequest; MindSpore's and DatasetCache's
//                    `spilling=` argument)
//   spill enabled    requested and not stopped: kStateSpillEnabled
//   SpillingOn       enabled and the cache not full: a row memory cannot
//                    take goes to disk
//   SpillsNow        on, and memory is used up: every new row goes to disk
//                    (CacheStats::spills_now)
// A cache that is not destroyed is in one of three states: it takes rows in
// memory (and, when SpillingOn, sends to disk a row memory cannot take), it
// SpillsNow, or it IsFull.
//
// Full (or memory full) because the server's memory cap ran out: the
// reason a put that is refused gives (Status::FullServerCap).
inline bool FullByCap(uint32_t state) { return (state & kStateByCap) != 0; }
// The cache takes no more rows (CacheStats::full, Cache::IsFull): marked
// full, or its memory is used up and spilling is not enabled.
inline bool IsFull(uint32_t state) {
  return (state & kStateFull) ||
         ((state & kStateMemFull) && !(state & kStateSpillEnabled));
}
inline bool SpillingOn(uint32_t state) {
  return (state & kStateSpillEnabled) && !(state & kStateFull);
}
inline bool SpillsNow(uint32_t state) {
  return SpillingOn(state) && (state & kStateMemFull);
}

struct TableInfo {
  std::atomic<uint64_t> capacity;  // (daemon) 0 until the table exists
  uint32_t tag;                    // (daemon) of the file name; written
                                   // before capacity is published
  uint32_t pad;
};

struct alignas(kCacheLine) CacheHeader {
  FileHeader file;
  uint32_t cache_id;
  uint32_t session_id;
  std::atomic<uint64_t> budget_bytes;    // (daemon) raised by a later open asking more
  std::atomic<uint64_t> reserved_bytes;  // (daemon) segments + tables
  std::atomic<uint32_t> state;           // kState* bits
  std::atomic<uint32_t> num_tables;      // (daemon) published after the file
  // (daemon) The oldest table a lookup probes: every row of the tables
  // before it is in it too (the daemon copied them when it made the table,
  // then freed their slots). Below num_tables; raised only after the copy.
  std::atomic<uint32_t> first_table;
  uint8_t name_len;
  uint8_t fingerprint_len;
  char name[kMaxNameBytes];
  char fingerprint[kMaxNameBytes];
  TableInfo tables[kMaxTables];
  StatsSlot stats[kStatsSlots];
  StatsLane lanes[kStatsSlots];
};

// ---- Index table ---------------------------------------------------------
// Open addressing, linear probing, Fibonacci hashing. A slot is claimed by
// CAS of loc kEmpty -> kClaimed, then key is stored, then loc is stored with
// release order: the publication point of the row. A reader that loads a
// published loc with acquire order sees the key and the row bytes. A
// retired slot keeps its key for good; an insert of that key publishes a
// new loc into it with one CAS from kRetired.
struct Slot {
  std::atomic<uint64_t> loc;
  std::atomic<uint64_t> key;
};
static_assert(sizeof(Slot) == 16);

// `claimed` sits on a cache line of its own (every insert bumps it) and the
// field order is the segment format: the padding is on purpose.
// NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding)
struct alignas(kCacheLine) TableHeader {
  FileHeader file;
  uint32_t cache_id;
  uint32_t generation;
  uint64_t capacity;  // power of two
  uint32_t capacity_log2;
  uint32_t pad;
  alignas(kCacheLine) std::atomic<uint64_t> claimed;  // slots claimed
};

inline size_t TableFileSize(uint64_t capacity) {
  return sizeof(TableHeader) + capacity * sizeof(Slot);
}
inline Slot* TableSlots(TableHeader* t) {
  return reinterpret_cast<Slot*>(reinterpret_cast<char*>(t) + sizeof(TableHeader));
}

// ---- Data segments and chunks ---------------------------------------------
inline constexpr size_t kSegmentHeaderSize = 4096;

struct alignas(kCacheLine) SegmentHeader {
  FileHeader file;
  uint32_t seg_id;
  uint32_t cache_id;
  uint32_t node;  // NUMA node the memory is bound to
  uint32_t pad;
  // (daemon) next chunk offset: every chunk below it is carved, and never
  // moves back. A multiple of 4 KB (SegmentAllocator::ChunkSize; a segment
  // adopted from an older build may hold one off a page until its next
  // chunk); its pages are supplied (allocated) up to it and past it.
  std::atomic<uint64_t> carved;
};
static_assert(sizeof(SegmentHeader) <= kSegmentHeaderSize);

// A chunk is leased to one client, which alone advances `used`. The client
// advances `used` before writing a row, so whatever lies at or past `used`
// is free: the daemon may re-lease that tail when the client goes away.
// While the client lives, the daemon may take back the end of the room past
// `used` for another writer of a cache whose memory is used up: it swaps
// `used` for kRoomTaken | the chunk's new end (bytes from chunk start, on a
// cache line, at or past `used`; again for a lower end while the client has
// not seen the first), so both write `used` by compare-and-swap only; the
// client that finds kRoomTaken takes in the new end and swaps its own
// `used` back.
inline constexpr uint64_t kRoomTaken = 1ULL << 63;
struct alignas(kCacheLine) ChunkHeader {
  uint32_t magic;  // kChunkMagic
  uint32_t cache_id;
  uint64_t size;               // bytes including this header, as leased
  std::atomic<uint64_t> used;  // bytes from chunk start in use (>= header)
};
static_assert(sizeof(ChunkHeader) == kCacheLine);

// Segments grow in steps of this many bytes.
inline constexpr uint64_t kSegmentGrain = 64 << 10;
// The chunk that holds a row of `row_bytes` (its header included), and the
// smallest segment that holds a chunk of `chunk_bytes`. The client uses them
// to refuse, without asking the daemon, a row no segment within the budget
// could hold; the daemon to size what it leases.
inline uint64_t ChunkBytesFor(uint64_t row_bytes) {
  return (sizeof(ChunkHeader) + row_bytes + kCacheLine - 1) / kCacheLine * kCacheLine;
}
inline uint64_t SegmentBytesFor(uint64_t chunk_bytes) {
  return (kSegmentHeaderSize + chunk_bytes + kSegmentGrain - 1) / kSegmentGrain *
         kSegmentGrain;
}

// Validates a mapped file's common header: magic, version, header size and
// file size against the mapping. Returns nullptr when valid, else what was
// wrong.
const char* CheckFileHeader(const void* base, size_t mapped_bytes, uint64_t magic,
                            size_t header_size);
// The common header plus a table's geometry: generation `gen`, capacity
// `cap` as the cache header records it, a power of two below 2^40 (so the
// file size cannot overflow), and the file exactly that big.
const char* CheckTableFile(const void* base, size_t mapped_bytes, uint64_t cap,
                           uint32_t gen);
// The common header plus a segment's identity: segment `seg_no` of cache
// `cache_id`, with room past its header.
const char* CheckSegmentFile(const void* base, size_t mapped_bytes, uint32_t cache_id,
                             uint32_t seg_no);

}  // namespace shmcache::layout
