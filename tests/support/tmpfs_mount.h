// A small tmpfs mounted on a fresh directory under TestTmpRoot(): a disk
// that fills up (the full spill dir of spill_test.cc and
// spill_stage_test.cc). Mounting needs root and a mount(2) the host allows;
// where either is missing, mounted() is false and skip_reason() says why,
// for GTEST_SKIP. The destructor unmounts it and removes the directory,
// whatever the test's outcome (a failed assertion returns early).
// Declare it before what uses it (a TestServer spilling there), so that
// stops first. Not thread-safe; one thread owns it.
#pragma once

#include <string>

namespace shmcache::test {

class TmpfsMount {
 public:
  // `size`: tmpfs's size= option ("32m"), other options may follow
  // ("16m,mode=0700").
  explicit TmpfsMount(const std::string& size);
  ~TmpfsMount();
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  bool mounted() const { return mounted_; }
  // Why it is not mounted; empty when it is.
  const std::string& skip_reason() const { return skip_reason_; }
  // The mount point; empty when not mounted.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string skip_reason_;
  bool mounted_ = false;
};

}  // namespace shmcache::test
