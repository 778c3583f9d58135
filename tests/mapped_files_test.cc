// Which unlinked files processes still map (FindMappedDeleted), read from
// /proc/<pid>/maps.
#include "daemon/mapped_files.h"

#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/shm_file.h"
#include "tests/support/child_process.h"
#include "tests/support/files.h"

namespace shmcache {
namespace {

class MappedFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::MakeTempDir("/dev/shm", "shmcache-held"); }
  void TearDown() override { test::RemoveTree(dir_); }

  // A 1 MB file, mapped by this process, and its identity.
  FileId Make(const std::string& name, ShmFile* map) {
    std::string path = dir_ + "/" + name;
    EXPECT_TRUE(ShmFile::Create(path, 1 << 20, -1, map).ok());
    FileId id;
    uint64_t bytes = 0;
    EXPECT_TRUE(StatFile(path, &id, &bytes));
    EXPECT_EQ(bytes, 1u << 20);
    return id;
  }
  void Unlink(const std::string& name) {
    ASSERT_TRUE(ShmFile::Unlink(dir_ + "/" + name).ok());
  }
  static bool Mapped(const FileId& id) {
    return FindMappedDeleted(std::vector<FileId>{id}).mapped.count(id) != 0;
  }

  std::string dir_;
};

TEST_F(MappedFilesTest, AnUnlinkedFileIsFoundWhileThisProcessMapsIt) {
  ShmFile map;
  FileId id = Make("a", &map);
  Unlink("a");
  EXPECT_TRUE(Mapped(id));
  map.Unmap();
  EXPECT_FALSE(Mapped(id));
}

TEST_F(MappedFilesTest, ALiveFileIsNeverTakenForAHeldOne) {
  ShmFile map;
  FileId id = Make("live", &map);
  EXPECT_FALSE(Mapped(id)) << "only unlinked files are looked for";
  Unlink("live");
}

TEST_F(MappedFilesTest, AForkedProcessThatNeverConnectedHoldsItsInheritedMapping) {
  ShmFile map;
  FileId id = Make("b", &map);
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  pid_t child = test::ForkChild([&]() -> int {
    close(hold[1]);
    char c;
    return read(hold[0], &c, 1) == 0 ? 0 : 1;  // until killed
  });
  close(hold[0]);
  Unlink("b");
  const std::vector<FileId> ids{id};
  // Both map it; a holder named first that maps every file ends the scan.
  for (int pid : {static_cast<int>(getpid()), static_cast<int>(child)}) {
    const std::vector<int> first{pid};
    EXPECT_EQ(FindMappedDeleted(ids, first).holders, first);
  }
  map.Unmap();  // only the child maps it now
  EXPECT_TRUE(Mapped(id));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  EXPECT_EQ(test::WaitChild(child), -SIGKILL);
  EXPECT_FALSE(Mapped(id));
  close(hold[1]);
}

}  // namespace
}  // namespace shmcache
