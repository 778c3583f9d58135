// libshmcache.so exports its public API and nothing else: every defined
// symbol of its dynamic symbol table is a member of a class, or a function,
// that include/shmcache marks SHMCACHE_EXPORT (shmcache/export.h).
#include <cstdlib>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/test_server.h"

namespace shmcache::test {
namespace {

// Members of the exported classes and the exported free functions, as
// `nm -C` spells them (a name may carry an ABI tag: message[abi:cxx11]()).
const std::regex kPublicApi(
    R"(^shmcache::((Cache|Client|BatchReader|Status|RowView|Row)::~?\w+|)"
    R"(CodeName|DTypeName|DTypeFromName|Takes)(\[abi:\w+\])?\()");

// The defined dynamic symbols of `lib`, demangled; empty on failure.
std::vector<std::string> DynamicSymbols(const std::string& lib) {
  const char* nm = std::getenv("SHMCACHE_NM");
  EXPECT_NE(nm, nullptr) << "run through meson test";
  if (nm == nullptr) return {};
  CommandResult r = RunCommand({nm, "-D", "--defined-only", "-C", lib});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  std::vector<std::string> names;
  std::istringstream lines(r.out);
  std::string line;
  // "<address> <type> <name>"; the name may contain spaces.
  for (std::string addr, type; lines >> addr >> type && std::getline(lines, line);) {
    names.push_back(line.substr(line.find_first_not_of(' ')));
  }
  return names;
}

std::string Library() {
  const char* lib = std::getenv("SHMCACHE_LIBRARY");
  EXPECT_NE(lib, nullptr) << "run through meson test";
  return lib ? lib : "";
}

TEST(ExportedSymbolsTest, OnlyThePublicApiIsExported) {
  std::string lib = Library();
  if (lib.find(".so") == std::string::npos) {
    GTEST_SKIP() << lib << " is not a shared library (-Ddefault_library=static)";
  }
  std::vector<std::string> internal;
  for (const std::string& name : DynamicSymbols(lib)) {
    if (!std::regex_search(name, kPublicApi)) internal.push_back(name);
  }
  EXPECT_TRUE(internal.empty()) << lib << " exports " << internal.size()
                                << " symbols outside include/shmcache's API:\n"
                                << testing::PrintToString(internal);
}

// The other half: the export macro does export (a library that exported
// nothing would pass the test above).
TEST(ExportedSymbolsTest, EveryPublicClassAndFunctionIsExported) {
  std::string lib = Library();
  if (lib.find(".so") == std::string::npos) {
    GTEST_SKIP() << lib << " is not a shared library (-Ddefault_library=static)";
  }
  std::vector<std::string> names = DynamicSymbols(lib);
  for (const char* want :
       {"shmcache::Client::Connect(", "shmcache::Client::OpenCache(",
        "shmcache::Cache::Get(", "shmcache::Cache::PutBatch(",
        "shmcache::Cache::ViewBatch(", "shmcache::BatchReader::ReadInto(",
        "shmcache::RowView::find(", "shmcache::Status::ToString", "shmcache::CodeName(",
        "shmcache::DTypeName(", "shmcache::DTypeFromName(", "shmcache::Takes("}) {
    bool found = false;
    for (const std::string& n : names) found = found || n.rfind(want, 0) == 0;
    EXPECT_TRUE(found) << want << " is not exported by " << lib;
  }
}

}  // namespace
}  // namespace shmcache::test
