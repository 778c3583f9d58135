#include "daemon/rocksdb_crc32c.h"

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <utility>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace shmcache {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // Castagnoli, reflected

// RocksDB's Extend, the definition after ours in the lookup order.
using ExtendFn = uint32_t (*)(uint32_t, const char*, size_t);
constexpr const char kExtendSymbol[] = "_ZN7rocksdb6crc32c6ExtendEjPKcm";

// One byte at a time with one table: only where RocksDB's Extend cannot
// be found (then nothing of RocksDB calls ours either).
uint32_t ExtendByTable(uint32_t crc, const char* buf, size_t size) {
  static const auto table = [] {
    struct T {
      uint32_t v[256];
    } t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t.v[n] = c;
    }
    return t;
  }();
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) {
    c = table.v[(c ^ static_cast<uint8_t>(buf[i])) & 0xff] ^ (c >> 8);
  }
  return ~c;
}

ExtendFn RocksdbExtend() {
  static const ExtendFn fn = [] {
    void* sym = dlsym(RTLD_NEXT, kExtendSymbol);
    ExtendFn f = ExtendByTable;
    if (sym != nullptr) std::memcpy(&f, &sym, sizeof f);
    return f;
  }();
  return fn;
}

std::atomic<bool> g_on{true};
std::atomic<uint64_t> g_calls{0};

#if defined(__x86_64__)

bool CpuHasCrc32() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return has;
}

// Three streams of crc32 instructions run at once (the instruction's
// latency is three times its throughput); the three CRCs are joined by
// shifting one over the next stream's length, a linear map of its 32 bits
// applied with four byte tables (after Mark Adler's crc32c.c).
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

struct ShiftTables {
  uint32_t t[4][256];
};

// GF(2) matrix (32 columns) times a vector.
uint32_t MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = MatrixTimes(mat, mat[n]);
}

// The tables that append `len` zero bytes to a CRC (len a power of two).
ShiftTables ZerosTables(size_t len) {
  uint32_t odd[32], even[32];
  odd[0] = kPoly;  // one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  MatrixSquare(even, odd);  // two zero bits
  MatrixSquare(odd, even);  // four
  // Each squaring doubles the zeros: the first gives one byte's.
  uint32_t* from = odd;
  uint32_t* to = even;
  do {
    MatrixSquare(to, from);
    std::swap(from, to);
    len >>= 1;
  } while (len != 0);
  const uint32_t* op = from;
  ShiftTables z{};
  for (uint32_t n = 0; n < 256; ++n) {
    for (int b = 0; b < 4; ++b) z.t[b][n] = MatrixTimes(op, n << (8 * b));
  }
  return z;
}

uint32_t Shift(const ShiftTables& z, uint32_t crc) {
  return z.t[0][crc & 0xff] ^ z.t[1][(crc >> 8) & 0xff] ^ z.t[2][(crc >> 16) & 0xff] ^
         z.t[3][crc >> 24];
}

const ShiftTables& LongTables() {
  static const ShiftTables z = ZerosTables(kLong);
  return z;
}

const ShiftTables& ShortTables() {
  static const ShiftTables z = ZerosTables(kShort);
  return z;
}

__attribute__((target("sse4.2"))) uint64_t Load64Crc(uint64_t crc,
                                                     const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm_crc32_u64(crc, v);
}

// Three interleaved streams of `block` bytes each, `rounds` times.
__attribute__((target("sse4.2"))) uint64_t ThreeWay(uint64_t crc0,
                                                    const unsigned char** next,
                                                    size_t* size, size_t block,
                                                    const ShiftTables& z) {
  while (*size >= 3 * block) {
    const unsigned char* p = *next;
    const unsigned char* end = p + block;
    uint64_t crc1 = 0, crc2 = 0;
    for (; p < end; p += 8) {
      crc0 = Load64Crc(crc0, p);
      crc1 = Load64Crc(crc1, p + block);
      crc2 = Load64Crc(crc2, p + 2 * block);
    }
    crc0 = Shift(z, static_cast<uint32_t>(crc0)) ^ crc1;
    crc0 = Shift(z, static_cast<uint32_t>(crc0)) ^ crc2;
    *next += 3 * block;
    *size -= 3 * block;
  }
  return crc0;
}

#endif  // __x86_64__

}  // namespace

#if defined(__x86_64__)

__attribute__((target("sse4.2"))) uint32_t Crc32cExtendByCpu(uint32_t crc,
                                                             const char* buf,
                                                             size_t size) {
  const auto* next = reinterpret_cast<const unsigned char*>(buf);
  uint64_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(next) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *next++);
    --size;
  }
  c = ThreeWay(c, &next, &size, kLong, LongTables());
  c = ThreeWay(c, &next, &size, kShort, ShortTables());
  for (; size >= 8; next += 8, size -= 8) c = Load64Crc(c, next);
  for (; size > 0; --size) c = _mm_crc32_u8(static_cast<uint32_t>(c), *next++);
  return ~static_cast<uint32_t>(c);
}

// The CPU's CRC stands in for RocksDB's only where both agree on a buffer
// that crosses every path of Crc32cExtendByCpu (its unaligned head, both
// three-way lengths, the 8-byte loop, the tail): a wrong join would
// otherwise write logs that a restart rejects as corrupt. Checked once, on
// RocksDB's first call.
namespace {
bool CpuAgreesWithRocksdb() {
  static const bool agrees = [] {
    constexpr size_t kBytes = 3 * kLong + 3 * kShort + 29;
    static char buf[kBytes + 1];
    for (size_t i = 0; i < sizeof buf; ++i)
      buf[i] = static_cast<char>((i * 131) ^ (i >> 7));
    return Crc32cExtendByCpu(0x1234u, buf + 1, kBytes) ==
           RocksdbExtend()(0x1234u, buf + 1, kBytes);
  }();
  return agrees;
}
}  // namespace

bool RocksdbCrc32cByCpu() {
  return CpuHasCrc32() && g_on.load(std::memory_order_relaxed) && CpuAgreesWithRocksdb();
}

#else

uint32_t Crc32cExtendByCpu(uint32_t crc, const char* buf, size_t size) {
  return ExtendByTable(crc, buf, size);
}

bool RocksdbCrc32cByCpu() { return false; }

#endif  // __x86_64__

void SetRocksdbCrc32cByCpu(bool on) { g_on.store(on, std::memory_order_relaxed); }

uint32_t Crc32cExtendByRocksdb(uint32_t crc, const char* buf, size_t size) {
  return RocksdbExtend()(crc, buf, size);
}

uint64_t RocksdbCrc32cCallsForTest() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace shmcache

#if defined(__x86_64__)
namespace rocksdb::crc32c {

// RocksDB's declaration (util/crc32c.h, not installed); the mangled name
// is kExtendSymbol above.
__attribute__((visibility("default"))) uint32_t Extend(uint32_t crc, const char* buf,
                                                       size_t size);

uint32_t Extend(uint32_t crc, const char* buf, size_t size) {
  shmcache::g_calls.fetch_add(1, std::memory_order_relaxed);
  if (shmcache::RocksdbCrc32cByCpu()) return shmcache::Crc32cExtendByCpu(crc, buf, size);
  return shmcache::Crc32cExtendByRocksdb(crc, buf, size);
}

}  // namespace rocksdb::crc32c
#endif  // __x86_64__
