// The shared-memory formats (layout.h) are checked when a process maps a
// file: a damaged header is Corruption naming the file, never a crash. A
// real daemon per test (integration_fixture.h).
#include "format/layout.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "format/shm_file.h"
#include "tests/support/child_process.h"
#include "tests/support/integration_fixture.h"

namespace shmcache::test {
namespace {

// A segment whose header is damaged is refused when mapped: Corruption
// naming the file, never a crash.
TEST_F(IntegrationTest, DamagedSegmentHeaderIsRefused) {
  std::unique_ptr<Client> client;
  std::unique_ptr<Cache> cache;
  Attach(&client, &cache);
  ASSERT_TRUE(PutPattern(*cache, 1, 0, kRowBytes).ok());
  std::string seg = server_->shm_dir() + "/" + server_->shm_prefix() + "seg." +
                    std::to_string(cache->cache_id()) + ".0";
  ShmFile f;
  ASSERT_TRUE(ShmFile::Open(seg, &f).ok());
  auto* h = reinterpret_cast<layout::FileHeader*>(f.data());
  for (int field = 0; field < 2; ++field) {
    layout::FileHeader saved = *h;
    if (field == 0) h->magic ^= 1;
    if (field == 1) h->version = layout::kLayoutVersion + 1;
    pid_t kid = ForkChild([&]() -> int {  // a fresh process maps it anew
      std::unique_ptr<Client> c2;
      if (!server_->Connect(&c2).ok()) return 2;
      std::unique_ptr<Cache> k2;
      if (!c2->OpenCache(Options(session_), &k2).ok()) return 3;
      Row row;
      Status s = k2->Get(1, &row);
      if (!s.IsCorruption() || s.message().find(seg) == std::string::npos) {
        fprintf(stderr, "%s\n", s.ToString().c_str());
        return 4;
      }
      return 0;
    });
    EXPECT_EQ(WaitChild(kid), 0) << "field " << field;
    *h = saved;
  }
  Row row;
  ASSERT_TRUE(cache->Get(1, &row).ok());
  EXPECT_TRUE(RowMatches(row, 1, 0, kRowBytes));
}

}  // namespace
}  // namespace shmcache::test
