// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/)
// from the real encoders and layout structs, so seeds start deep inside the
// formats. Run by hand after a format change:
//   ninja -C build-fuzz tests/fuzz/fuzz_make_seeds &&
//   build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "format/layout.h"
#include "format/protocol_messages.h"
#include "format/row_codec.h"
#include "tests/protocol_samples.h"

using namespace shmcache;
namespace pr = shmcache::protocol;

namespace {

void Save(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

// Appends a frame of `type` whose header says `body_len` and whose body is
// `body` (shorter when the frame is cut).
void RawFrame(std::string* out, pr::MsgType type, const std::string& body,
              size_t body_len) {
  pr::FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.body_len = static_cast<uint32_t>(body_len);
  std::byte hdr[pr::kFrameHeaderBytes];
  pr::EncodeFrameHeader(h, hdr);
  out->append(reinterpret_cast<const char*>(hdr), sizeof hdr);
  out->append(body);
}

// Appends a frame of `request`, cut after `cut` bytes of its body when given.
template <typename Request>
void Frame(std::string* out, const Request& request, int cut = -1) {
  const std::string body = pr::EncodeBody(request);
  RawFrame(out, Request::kType, cut < 0 ? body : body.substr(0, static_cast<size_t>(cut)),
           body.size());
}

// Two seeds per request type for fuzz_messages: the request and its
// response, each its pick byte (see fuzz_messages.cc) and its sample.
template <typename... R>
void SaveMessageSeeds(const std::string& dir, pr::TypeList<R...>) {
  char pick = 0;
  auto save = [&](const std::string& name, const std::string& body) {
    Save(dir + "/fuzz_messages/" + name, std::string(1, pick++) + body);
  };
  ((save(std::string(R::kName) + ".request", pr::EncodeBody(pr::samples::Sample<R>())),
    save(std::string(R::kName) + ".response",
         pr::EncodeBody(pr::samples::Sample<typename R::Response>()))),
   ...);
}

std::string EncodeRow(uint64_t key, std::vector<ColumnRef> cols) {
  size_t n = 0;
  if (!RowCodec::EncodedSize(cols, &n).ok()) std::exit(2);
  std::vector<uint64_t> buf((n + 7) / 8);
  RowCodec::Encode(key, cols, reinterpret_cast<std::byte*>(buf.data()), n);
  return std::string(reinterpret_cast<const char*>(buf.data()), n);
}

template <typename T>
std::string Bytes(const T& v, size_t size = sizeof(T)) {
  return std::string(reinterpret_cast<const char*>(&v), size);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "tests/fuzz/corpus";

  // ---- protocol: whole conversations ----
  {
    // Ids below 4 name the session or cache created that many requests
    // before (see fuzz_protocol.cc): 0 is the latest.
    const pr::OpenCacheRequest open{
        .session_id = 0, .name = "train", .fingerprint = "fingerprint", .size_mb = 16};
    const pr::LeaseChunkRequest lease{.cache_id = 0, .need = 4000};
    const pr::CheckSessionRequest check{.session_id = 0};
    std::string s;
    Frame(&s, pr::HelloRequest{.pid = 1234});
    Save(dir + "/fuzz_protocol/hello", s);
    s.clear();
    Frame(&s, pr::CreateSessionRequest{});
    Frame(&s, open);
    Frame(&s, lease);
    Frame(&s, lease);
    Frame(&s, pr::GrowIndexRequest{.cache_id = 0, .seen_tables = 1});
    Frame(&s, pr::ReturnChunkRequest{.cache_id = 0, .seg_no = 0, .offset = 4096});
    Frame(&s, pr::ListSessionsRequest{});
    Frame(&s, pr::ServerInfoRequest{});
    Frame(&s, check);
    Frame(&s, pr::DestroySessionRequest{.session_id = 0});
    Save(dir + "/fuzz_protocol/session_lifecycle", s);
    s.clear();
    Frame(&s, pr::CreateSessionRequest{});
    Frame(&s, open, 9);  // truncated body
    Save(dir + "/fuzz_protocol/truncated", s);
    s.clear();
    Frame(&s, pr::CheckSessionRequest{.session_id = 7});
    const std::string no_count =
        pr::EncodeBody(pr::SpillGetRequest{.cache_id = 7}).substr(0, 4);
    RawFrame(&s, pr::MsgType::kSpillGet, no_count, no_count.size());
    Frame(&s, pr::StopRequest{});
    Save(dir + "/fuzz_protocol/misc", s);
  }
  SaveMessageSeeds(dir, pr::Requests{});

  // ---- rows ----
  {
    int64_t one[1] = {1}, two_by_three[2] = {2, 3}, n[1] = {13};
    uint64_t id = 77;
    float f[6] = {1, 2, 3, 4, 5, 6};
    const char text[13] = "hello, world";
    Save(dir + "/fuzz_row_codec/three_columns",
         EncodeRow(77, {{"id", DType::kUInt64, one, &id, 8},
                        {"image", DType::kFloat32, two_by_three, f, sizeof f},
                        {"label", DType::kBytes, n, text, 13}}));
    Save(dir + "/fuzz_row_codec/one_column",
         EncodeRow(5, {{"data", DType::kUInt8, n, text, 13}}));
    Save(dir + "/fuzz_row_codec/empty_column",
         EncodeRow(6, {{"", DType::kInt16, std::span<const int64_t>(), f, 2}}));
  }

  // ---- shared-memory files: a cache with one table and one segment ----
  {
    constexpr uint64_t kCap = 16;
    constexpr size_t kCacheFile = (sizeof(layout::CacheHeader) + 4095) / 4096 * 4096;
    std::vector<char> cache(kCacheFile, 0), table(layout::TableFileSize(kCap), 0),
        seg(2 * layout::kSegmentHeaderSize, 0);
    auto* c = reinterpret_cast<layout::CacheHeader*>(cache.data());
    c->file = {layout::kCacheMagic, layout::kLayoutVersion, sizeof(layout::CacheHeader),
               kCacheFile};
    c->cache_id = 1;
    c->session_id = 7;
    c->budget_bytes = 1 << 20;
    c->name_len = 5;
    std::memcpy(c->name, "train", 5);
    c->fingerprint_len = 2;
    std::memcpy(c->fingerprint, "fp", 2);
    c->num_tables.store(1);
    c->tables[0].capacity.store(kCap);
    c->stats[0].rows.store(1);
    auto* t = reinterpret_cast<layout::TableHeader*>(table.data());
    t->file = {layout::kTableMagic, layout::kLayoutVersion, sizeof(layout::TableHeader),
               table.size()};
    t->cache_id = 1;
    t->generation = 0;
    t->capacity = kCap;
    t->capacity_log2 = 4;
    auto* sh = reinterpret_cast<layout::SegmentHeader*>(seg.data());
    sh->file = {layout::kSegmentMagic, layout::kLayoutVersion,
                sizeof(layout::SegmentHeader), seg.size()};
    sh->seg_id = 0;
    sh->cache_id = 1;
    sh->carved.store(layout::kSegmentHeaderSize + 1024);
    auto* chunk =
        reinterpret_cast<layout::ChunkHeader*>(seg.data() + layout::kSegmentHeaderSize);
    chunk->magic = layout::kChunkMagic;
    chunk->cache_id = 1;
    chunk->size = 1024;
    chunk->used.store(64);
    std::string in = Bytes(static_cast<uint32_t>(cache.size())) +
                     Bytes(static_cast<uint32_t>(table.size())) +
                     Bytes(static_cast<uint32_t>(seg.size())) +
                     std::string(cache.begin(), cache.end()) +
                     std::string(table.begin(), table.end()) +
                     std::string(seg.begin(), seg.end()) + "7\n";
    Save(dir + "/fuzz_shm_headers/one_cache", in);
    in = Bytes(static_cast<uint32_t>(cache.size())) + Bytes(uint32_t{0}) +
         Bytes(uint32_t{0}) + std::string(cache.begin(), cache.end()) + "7\n9\n";
    Save(dir + "/fuzz_shm_headers/header_only", in);
  }
  std::printf("seeds written under %s\n", dir.c_str());
  return 0;
}
