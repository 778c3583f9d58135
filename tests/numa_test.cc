// NUMA placement and "Numa hit" counting with an injected two-node topology
// (meson runs this suite with SHMCACHE_NUMA_NODES=2; the daemon and every
// client inherit it).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "format/index_table.h"
#include "format/instance.h"
#include "format/layout.h"
#include "format/numa_topology.h"
#include "format/shm_file.h"
#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

constexpr size_t kRowBytes = 3072;

CacheOptions Options(uint32_t session) {
  CacheOptions o;
  o.session_id = session;
  o.name = "numa";
  o.fingerprint = "numa-fp";
  return o;
}

// The segments of one cache, read from their files: seg_no -> node.
std::map<uint32_t, uint32_t> SegmentNodes(const TestServer& server, uint32_t cache_id) {
  std::map<uint32_t, uint32_t> nodes;
  std::string prefix = server.shm_prefix() + "seg." + std::to_string(cache_id) + ".";
  for (const std::string& f : server.ShmFiles()) {
    if (f.rfind(prefix, 0) != 0) continue;
    // The daemon prepares spare segments in the background, under their
    // final names: one not sized yet (ShmFile::Create sizes a file after
    // creating it), or whose header is not published yet, holds no rows.
    const std::string path = server.shm_dir() + "/" + f;
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && st.st_size == 0) continue;
    ShmFile file;
    Status s = ShmFile::Open(path, &file);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) continue;
    if (reinterpret_cast<layout::FileHeader*>(file.data())->magic == 0) continue;
    EXPECT_EQ(layout::CheckFileHeader(file.data(), file.size(), layout::kSegmentMagic,
                                      sizeof(layout::SegmentHeader)),
              nullptr)
        << f;
    auto* h = reinterpret_cast<layout::SegmentHeader*>(file.data());
    EXPECT_EQ(h->cache_id, cache_id);
    EXPECT_EQ(std::to_string(h->seg_id), f.substr(prefix.size()));
    nodes[h->seg_id] = h->node;
  }
  return nodes;
}

// The segment that holds row `id`, read from the index table files.
int SegmentOfRow(const TestServer& server, uint32_t cache_id, uint64_t id) {
  InstancePaths paths =
      MakeInstancePaths(server.port(), server.run_dir(), server.shm_dir());
  ShmFile header;
  if (!ShmFile::Open(paths.CacheFile(cache_id), &header).ok()) return -1;
  auto* h = reinterpret_cast<layout::CacheHeader*>(header.data());
  for (uint32_t gen = 0; gen < h->num_tables.load(); ++gen) {
    std::string path = paths.TableFile(cache_id, gen, h->tables[gen].tag);
    ShmFile f;
    if (!ShmFile::Open(path, &f).ok()) return -1;
    uint64_t loc = IndexTable(reinterpret_cast<layout::TableHeader*>(f.data())).Find(id);
    if (loc != layout::kEmpty) return static_cast<int>(layout::LocationSegment(loc));
  }
  return -1;
}

// In a child forced onto `node`: opens the cache and puts or reads rows.
int OnNode(const TestServer& server, uint32_t session, int node, bool put, uint64_t first,
           uint64_t count) {
  NumaTopology::Get().ForceCurrentNode(node);
  if (NumaTopology::Get().CurrentNode() != node) return 10;
  std::unique_ptr<Client> client;
  if (!server.Connect(&client).ok()) return 2;
  std::unique_ptr<Cache> cache;
  if (!client->OpenCache(Options(session), &cache).ok()) return 3;
  Row row;
  for (uint64_t id = first; id < first + count; ++id) {
    std::vector<uint8_t> want = Pattern(id, 0, kRowBytes);
    if (put) {
      if (!cache->Put(id, want.data(), want.size()).ok()) return 4;
    } else {
      if (!cache->Get(id, &row).ok()) return 5;
      if (row.column(0).nbytes != kRowBytes ||
          std::memcmp(row.column(0).data, want.data(), kRowBytes) != 0) {
        return 6;
      }
    }
  }
  return 0;
}

class NumaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(NumaTopology::Get().num_nodes(), 2)
        << "run with SHMCACHE_NUMA_NODES=2 (meson sets it)";
    server_ = std::make_unique<TestServer>();
    ASSERT_TRUE(server_->ok());
    session_ = server_->NewSession();
    ASSERT_TRUE(server_->Connect(&client_).ok());
    ASSERT_TRUE(client_->OpenCache(Options(session_), &cache_).ok());
  }
  void TearDown() override {
    cache_.reset();
    client_.reset();
    server_.reset();
  }
  int Run(int node, bool put, uint64_t first, uint64_t count) {
    return WaitChild(
        ForkChild([&] { return OnNode(*server_, session_, node, put, first, count); }));
  }
  CacheStats Stats() {
    CacheStats st;
    EXPECT_TRUE(cache_->GetStats(&st).ok());
    return st;
  }

  std::unique_ptr<TestServer> server_;
  uint32_t session_ = 0;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Cache> cache_;
};

TEST_F(NumaTest, ServerSeesTwoNodes) {
  ServerInfo info;
  ASSERT_TRUE(client_->GetServerInfo(&info).ok());
  EXPECT_EQ(info.numa_nodes, 2);
  EXPECT_EQ(info.workers % 2, 0) << "workers are a multiple of the nodes";
}

TEST_F(NumaTest, RowsLandInTheWritersNodePool) {
  ASSERT_EQ(Run(/*node=*/1, /*put=*/true, 0, 300), 0);
  std::map<uint32_t, uint32_t> nodes = SegmentNodes(*server_, cache_->cache_id());
  ASSERT_FALSE(nodes.empty());
  for (const auto& [seg, node] : nodes) EXPECT_EQ(node, 1u) << "segment " << seg;
  for (uint64_t id = 0; id < 300; id += 7) {
    int seg = SegmentOfRow(*server_, cache_->cache_id(), id);
    ASSERT_GE(seg, 0) << id;
    EXPECT_EQ(nodes[static_cast<uint32_t>(seg)], 1u) << "row " << id;
  }
  // A writer on node 0 gets a pool of its own.
  ASSERT_EQ(Run(0, true, 1000, 300), 0);
  nodes = SegmentNodes(*server_, cache_->cache_id());
  std::set<uint32_t> seen;
  for (const auto& [seg, node] : nodes) seen.insert(node);
  EXPECT_EQ(seen, (std::set<uint32_t>{0, 1}));
  for (uint64_t id = 1000; id < 1300; id += 7) {
    int seg = SegmentOfRow(*server_, cache_->cache_id(), id);
    ASSERT_GE(seg, 0) << id;
    EXPECT_EQ(nodes[static_cast<uint32_t>(seg)], 0u) << "row " << id;
  }
  for (uint64_t id = 0; id < 300; id += 7) {
    int seg = SegmentOfRow(*server_, cache_->cache_id(), id);
    EXPECT_EQ(nodes[static_cast<uint32_t>(seg)], 1u) << "row " << id << " stayed";
  }
}

TEST_F(NumaTest, NumaHitCountsReadsOnTheSameNode) {
  ASSERT_EQ(Run(1, true, 0, 200), 0);
  CacheStats s0 = Stats();
  EXPECT_EQ(s0.mem_rows, 200u);
  EXPECT_EQ(s0.hits, 0u);
  // Reads from node 1: hits, and local ones.
  ASSERT_EQ(Run(1, false, 0, 200), 0);
  CacheStats s1 = Stats();
  EXPECT_EQ(s1.hits, 200u);
  EXPECT_EQ(s1.numa_hits, 200u);
  // Reads from node 0: hits, but remote.
  ASSERT_EQ(Run(0, false, 0, 200), 0);
  CacheStats s2 = Stats();
  EXPECT_EQ(s2.hits, 400u);
  EXPECT_EQ(s2.numa_hits, 200u);
  EXPECT_EQ(s2.misses, 0u);

  // The admin listing shows the same counters.
  CommandResult r = server_->Admin({"--list_sessions", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  nlohmann::json tree = nlohmann::json::parse(r.out);
  const nlohmann::json& cache = tree.front().at("caches").front();
  EXPECT_EQ(cache.at("hits").get<uint64_t>(), 400u);
  EXPECT_EQ(cache.at("numa_hit").get<uint64_t>(), 200u);
  EXPECT_EQ(cache.at("mem_cached").get<uint64_t>(), 200u);
  CommandResult table = server_->Admin({"--list_sessions"});
  ASSERT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("Numa hit"), std::string::npos);
}

TEST_F(NumaTest, NodeForcedThroughTheEnvironment) {
  // shard_worker is a separate program: SHMCACHE_NUMA_NODE=1 places it.
  const char* worker = std::getenv("SHMCACHE_SHARD_WORKER");
  ASSERT_NE(worker, nullptr);
  Env env = server_->AdminEnv();
  env.emplace_back("SHMCACHE_NUMA_NODE", "1");
  CommandResult r =
      RunCommand({worker, "--session_id", std::to_string(session_), "--rows", "500",
                  "--epochs", "2", "--port", std::to_string(server_->port())},
                 env);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("0 wrong rows"), std::string::npos) << r.out;
  std::vector<SessionInfo> sessions;
  ASSERT_TRUE(client_->ListSessions(&sessions).ok());
  uint32_t shard_cache = 0;
  for (const CacheStats& c : sessions.at(0).caches) {
    if (c.name == "shard-example") {
      shard_cache = c.cache_id;
      EXPECT_EQ(c.mem_rows, 500u);
      EXPECT_EQ(c.hits, 500u);
      EXPECT_EQ(c.numa_hits, 500u) << "the writer reads its own node";
    }
  }
  ASSERT_NE(shard_cache, 0u);
  std::map<uint32_t, uint32_t> nodes = SegmentNodes(*server_, shard_cache);
  ASSERT_FALSE(nodes.empty());
  for (const auto& [seg, node] : nodes) EXPECT_EQ(node, 1u) << "segment " << seg;
}

TEST(NumaStartTest, WorkersAreRoundedUpToTheNodes) {
  ServerOptions o;
  o.extra_args = {"-w", "3"};
  TestServer server(o);
  ASSERT_TRUE(server.ok());
  EXPECT_NE(server.start_result().out.find("raised to 4"), std::string::npos)
      << server.start_result().out;
  std::unique_ptr<Client> client;
  ASSERT_TRUE(server.Connect(&client).ok());
  ServerInfo info;
  ASSERT_TRUE(client->GetServerInfo(&info).ok());
  EXPECT_EQ(info.workers, 4);
  EXPECT_EQ(info.numa_nodes, 2);
}

}  // namespace
}  // namespace shmcache::test
