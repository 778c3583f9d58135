// Shared-memory files in a directory every user can write to: an existing
// file is opened only when it is ours (regular, our uid, 0600, one link),
// and creation never opens a file someone else put under the name. (The
// names themselves: instance_test.cc.)
#include "format/shm_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/test_server.h"

namespace shmcache {
namespace {

class ShmFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::MakeTempDir("/dev/shm", "shmcache-sf"); }
  void TearDown() override { test::RemoveTree(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // A file of ours made by Create, 4 KB.
  std::string Made(const std::string& name) {
    ShmFile f;
    Status s = ShmFile::Create(Path(name), 4096, -1, &f);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return Path(name);
  }
  // Open must refuse `path` with PermissionDenied naming it and `why`.
  static void ExpectRefused(const std::string& path, const std::string& why) {
    ShmFile f;
    Status s = ShmFile::Open(path, &f);
    EXPECT_TRUE(s.IsPermissionDenied()) << s.ToString();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("not ours"), std::string::npos) << s.message();
    EXPECT_FALSE(f.mapped());
  }

  std::string dir_;
};

TEST_F(ShmFileTest, OpensAFileOfOurs) {
  std::string p = Made("ours");
  ShmFile f;
  ASSERT_TRUE(ShmFile::Open(p, &f).ok());
  EXPECT_EQ(f.size(), 4096u);
}

TEST_F(ShmFileTest, RefusesAFileOthersMayWrite) {
  std::string p = Made("wide");
  ASSERT_EQ(chmod(p.c_str(), 0666), 0);
  ExpectRefused(p, "mode 0666");
}

TEST_F(ShmFileTest, RefusesASymbolicLinkToAFileOfOurs) {
  std::string target = Made("target");
  ASSERT_EQ(symlink(target.c_str(), Path("link").c_str()), 0);
  ExpectRefused(Path("link"), "symbolic link");
}

TEST_F(ShmFileTest, RefusesAFileWithAnotherLink) {
  std::string p = Made("linked");
  ASSERT_EQ(link(p.c_str(), Path("other-name").c_str()), 0);
  ExpectRefused(p, "2 links");
}

TEST_F(ShmFileTest, RefusesWhatIsNotARegularFile) {
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  ExpectRefused(Path("fifo"), "not a regular file");
}

TEST_F(ShmFileTest, RefusesAFileOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another uid";
  std::string p = Made("foreign");
  ASSERT_EQ(chown(p.c_str(), 65534, 65534), 0);
  ExpectRefused(p, "uid 65534");
}

TEST_F(ShmFileTest, CreateMakes0600WhateverTheUmask) {
  mode_t old = umask(0277);
  std::string p = Made("narrow");
  umask(old);
  struct stat st;
  ASSERT_EQ(stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ShmFile f;
  EXPECT_TRUE(ShmFile::Open(p, &f).ok());
}

TEST_F(ShmFileTest, CreateNeverOpensWhatIsUnderTheName) {
  std::string target = Path("target");
  {
    int fd = open(target.c_str(), O_CREAT | O_WRONLY, 0666);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  ASSERT_EQ(symlink(target.c_str(), Path("link").c_str()), 0);
  ShmFile f;
  for (const std::string& name : {std::string("target"), std::string("link")}) {
    Status s = ShmFile::Create(Path(name), 4096, -1, &f);
    EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
    EXPECT_NE(s.message().find("owned by"), std::string::npos) << s.message();
  }
  struct stat st;
  ASSERT_EQ(stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the file under the name was written";
}

TEST_F(ShmFileTest, CreateFreshSkipsTakenNames) {
  for (const char* n : {"n.0", "n.1"}) {
    int fd = open(Path(n).c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  auto name = [&](uint32_t i) { return Path("n." + std::to_string(i)); };
  ShmFile f;
  uint32_t chosen = 99;
  std::string skipped;
  ASSERT_TRUE(ShmFile::CreateFresh(name, 4, 4096, -1, &f, &chosen, &skipped).ok());
  EXPECT_EQ(chosen, 2u);
  EXPECT_NE(skipped.find(Path("n.0")), std::string::npos) << skipped;
  struct stat st;
  ASSERT_EQ(stat(Path("n.0").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);

  // Every name taken: one line naming the last, its owner and the fix.
  Status s = ShmFile::CreateFresh(name, 3, 4096, -1, &f, &chosen);
  EXPECT_TRUE(s.IsAlreadyExists());
  EXPECT_EQ(chosen, 3u);
  EXPECT_NE(s.message().find(Path("n.2")), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("owned by"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("remove it"), std::string::npos) << s.message();
}

// Pages of [p, p + size) mapped in this process (/proc/self/pagemap's
// present bit), or -1 when pagemap cannot be read.
long PresentPages(const char* p, size_t size) {
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long present = 0;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / 4096;
  for (uintptr_t page = first; page < first + size / 4096; ++page) {
    uint64_t entry = 0;
    if (pread(fd, &entry, sizeof entry, static_cast<off_t>(page * 8)) != sizeof entry) {
      close(fd);
      return -1;
    }
    present += (entry >> 63) & 1;
  }
  close(fd);
  return present;
}

// A writer maps a leased chunk with PopulateForWrite, one read per 64 KB:
// the kernel maps the neighbouring pages with it (fault-around) only when
// they are already cleared, which Create does on tmpfs. Without that the
// writer would fault (and clear) every page itself, one by one.
TEST_F(ShmFileTest, CreatedPagesAreClearedSoOneReadMapsTheirWholeWindow) {
  std::string around;
  if (FILE* f = fopen("/sys/kernel/debug/fault_around_bytes", "r")) {
    char buf[32] = {};
    around = fgets(buf, sizeof buf, f) ? buf : "";
    fclose(f);
    if (!around.empty() && std::stoul(around) != 65536) {
      GTEST_SKIP() << "fault_around_bytes is " << around << ", not the default 64 KB";
    }
  }
  const size_t size = 1u << 20;
  {
    ShmFile made;
    ASSERT_TRUE(ShmFile::Create(Path("cleared"), size, -1, &made).ok());
  }
  ShmFile f;  // a fresh mapping, as a client's
  ASSERT_TRUE(ShmFile::Open(Path("cleared"), &f).ok());
  ASSERT_EQ(PresentPages(f.data(), size), 0);
  PopulateForWrite(f.data(), size);
  EXPECT_EQ(PresentPages(f.data(), size), static_cast<long>(size / 4096));
  for (size_t off = 0; off < size; off += 4096) ASSERT_EQ(f.data()[off], 0) << off;
  std::memset(f.data(), 7, size);  // and writable
}

}  // namespace
}  // namespace shmcache
