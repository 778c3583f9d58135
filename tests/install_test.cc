// The library as a user gets it: `meson install` into a temporary root,
// then a trainer (examples/shard_worker.cc) compiled against the installed
// headers with `pkg-config --cflags --libs shmcache` only, linked to the
// installed libshmcache.so, and run against a daemon. And as a user of the
// build tree gets it: a program built with the flags of the uninstalled .pc
// (build/meson-uninstalled), run on the build's library.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

namespace fs = std::filesystem;

std::string FromEnv(const char* name) {
  const char* v = std::getenv(name);
  EXPECT_NE(v, nullptr) << name << " is unset: run through meson test";
  return v ? v : "";
}

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The directory of the one shmcache.pc under root, or "".
std::string FindPkgConfigDir(const std::string& root) {
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.path().filename() == "shmcache.pc") return e.path().parent_path();
  }
  return "";
}

class InstallTest : public testing::Test {
 protected:
  void SetUp() override { root_ = MakeTempDir(TestTmpRoot(), "install"); }
  void TearDown() override { RemoveTree(root_); }

  std::string root_;
};

TEST_F(InstallTest, TrainerBuiltWithPkgConfigRunsOnTheInstalledLibrary) {
  const std::string destdir = root_ + "/dest";
  CommandResult r = RunCommand(
      {FromEnv("SHMCACHE_MESON"), "install", "-C", FromEnv("SHMCACHE_BUILD_ROOT"),
       "--no-rebuild", "--quiet", "--destdir", destdir},
      {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const std::string pc_dir = FindPkgConfigDir(destdir);
  ASSERT_FALSE(pc_dir.empty()) << "no shmcache.pc under " << destdir;
  const std::string libdir = fs::path(pc_dir).parent_path();

  // The sysroot makes pkg-config point into the temporary root.
  r = RunCommand({FromEnv("SHMCACHE_PKG_CONFIG"), "--cflags", "--libs", "shmcache"},
                 {{"PKG_CONFIG_PATH", pc_dir}, {"PKG_CONFIG_SYSROOT_DIR", destdir}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  std::vector<std::string> flags = Words(r.out);
  for (const std::string& f : flags) {
    if (f.rfind("-I", 0) == 0 || f.rfind("-L", 0) == 0) {
      EXPECT_EQ(f.substr(2, destdir.size()), destdir)
          << f << " lies outside the installed tree";
    }
  }

  const std::string trainer = root_ + "/trainer";
  std::vector<std::string> cc = {FromEnv("SHMCACHE_CXX"),
                                 "-Wall",
                                 "-Wextra",
                                 "-Werror",
                                 FromEnv("SHMCACHE_TRAINER_SOURCE"),
                                 "-o",
                                 trainer,
                                 "-Wl,-rpath," + libdir};
  cc.insert(cc.end(), flags.begin(), flags.end());
  r = RunCommand(cc, {}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  // meson test points LD_LIBRARY_PATH at the build tree; a user's has none.
  const Env user = {{"LD_LIBRARY_PATH", ""}};
  r = RunCommand({FromEnv("SHMCACHE_LDD"), trainer}, user);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find(libdir + "/libshmcache.so"), std::string::npos)
      << "the trainer does not load the installed library:\n"
      << r.out;

  TestServer server;
  ASSERT_TRUE(server.ok());
  uint32_t session = server.NewSession();
  Env env = server.AdminEnv();
  env.insert(env.end(), user.begin(), user.end());
  r = RunCommand({trainer, "--session_id", std::to_string(session), "--port",
                  std::to_string(server.port()), "--rows", "200", "--row_bytes", "512",
                  "--epochs", "2"},
                 env);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  // Epoch 1 misses and puts every row; epoch 2 reads them all back.
  EXPECT_NE(r.out.find("device 0: 200 hits, 200 misses, 0 wrong rows"), std::string::npos)
      << r.Describe();
}

// A program that includes every public header and connects where no
// server runs: it compiles with those flags alone, links, and runs on
// the library of the build tree. The uninstalled .pc named only lib/ (the
// library's own directory), not include/: no `shmcache/...` header was
// found.
TEST_F(InstallTest, ProgramBuiltWithTheUninstalledPkgConfigRuns) {
  const std::string build = FromEnv("SHMCACHE_BUILD_ROOT");
  const std::string source = root_ + "/program.cc";
  {
    std::ofstream out(source);
    for (const auto& e :
         fs::directory_iterator(FromEnv("SHMCACHE_SOURCE_ROOT") + "/include/shmcache")) {
      out << "#include \"shmcache/" << e.path().filename().string() << "\"\n";
    }
    out << R"(#include <cstdio>
int main(int, char** argv) {
  shmcache::ClientOptions options;
  options.port = 31006;
  options.run_dir = argv[1];
  std::unique_ptr<shmcache::Client> client;
  shmcache::Status s = shmcache::Client::Connect(options, &client);
  std::printf("%s\n", s.ToString().c_str());
  return s.IsUnavailable() ? 0 : 1;
}
)";
  }
  // pkg-config takes shmcache-uninstalled.pc for shmcache where it finds one.
  CommandResult r =
      RunCommand({FromEnv("SHMCACHE_PKG_CONFIG"), "--cflags", "--libs", "shmcache"},
                 {{"PKG_CONFIG_PATH", build + "/meson-uninstalled"}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const std::string program = root_ + "/program";
  std::vector<std::string> cc = {
      FromEnv("SHMCACHE_CXX"), "-Wall", "-Wextra", "-Werror", source, "-o", program};
  for (const std::string& f : Words(r.out)) {
    cc.push_back(f);
    if (f.rfind("-L", 0) == 0) cc.push_back("-Wl,-rpath," + f.substr(2));
  }
  r = RunCommand(cc, {}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  // meson test points LD_LIBRARY_PATH at the build tree: the rpath must.
  r = RunCommand({program, root_}, Env{{"LD_LIBRARY_PATH", ""}});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("not running"), std::string::npos) << r.Describe();
}

}  // namespace
}  // namespace shmcache::test
