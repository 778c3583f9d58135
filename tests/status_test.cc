#include "shmcache/status.h"

#include <cerrno>
#include <cstring>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(Status::OK(), Status());
}

TEST(StatusTest, EachFactorySetsItsCodeAndOnlyItsPredicate) {
  struct Case {
    Status s;
    Status::Code code;
  };
  const Case cases[] = {
      {Status::NotFound("m"), Status::Code::kNotFound},
      {Status::InvalidArgument("m"), Status::Code::kInvalidArgument},
      {Status::AlreadyExists("m"), Status::Code::kAlreadyExists},
      {Status::Full("m"), Status::Code::kFull},
      {Status::Unavailable("m"), Status::Code::kUnavailable},
      {Status::Corruption("m"), Status::Code::kCorruption},
      {Status::PermissionDenied("m"), Status::Code::kPermissionDenied},
      {Status::IOError("m"), Status::Code::kIOError},
      {Status::NotSupported("m"), Status::Code::kNotSupported},
      {Status::FingerprintMismatch("m"), Status::Code::kFingerprintMismatch},
      {Status::TooLarge("m"), Status::Code::kTooLarge},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(CodeName(c.code));
    EXPECT_FALSE(c.s.ok());
    EXPECT_EQ(c.s.code(), c.code);
    EXPECT_EQ(c.s.message(), "m");
    EXPECT_EQ(c.s.IsNotFound(), c.code == Status::Code::kNotFound);
    EXPECT_EQ(c.s.IsInvalidArgument(), c.code == Status::Code::kInvalidArgument);
    EXPECT_EQ(c.s.IsAlreadyExists(), c.code == Status::Code::kAlreadyExists);
    EXPECT_EQ(c.s.IsFull(), c.code == Status::Code::kFull);
    EXPECT_EQ(c.s.IsUnavailable(), c.code == Status::Code::kUnavailable);
    EXPECT_EQ(c.s.IsCorruption(), c.code == Status::Code::kCorruption);
    EXPECT_EQ(c.s.IsPermissionDenied(), c.code == Status::Code::kPermissionDenied);
    EXPECT_EQ(c.s.IsIOError(), c.code == Status::Code::kIOError);
    EXPECT_EQ(c.s.IsNotSupported(), c.code == Status::Code::kNotSupported);
    EXPECT_EQ(c.s.IsFingerprintMismatch(), c.code == Status::Code::kFingerprintMismatch);
    EXPECT_EQ(c.s.IsTooLarge(), c.code == Status::Code::kTooLarge);
    EXPECT_FALSE(c.s.IsColumnNotFound());
  }
}

// A present row without a named column is a NotFound (callers that take
// NotFound for a miss still do) that IsColumnNotFound() tells apart; copies
// and moves keep the difference.
TEST(StatusTest, ColumnNotFoundIsANotFoundToldApartFromAMissingRow) {
  Status c = Status::ColumnNotFound("row 3 has no column 'x'");
  EXPECT_EQ(c.code(), Status::Code::kNotFound);
  EXPECT_TRUE(c.IsNotFound());
  EXPECT_TRUE(c.IsColumnNotFound());
  EXPECT_EQ(c.ToString(), "Not found: row 3 has no column 'x'");
  EXPECT_FALSE(Status::NotFound("row 3 is not cached").IsColumnNotFound());
  EXPECT_FALSE(c == Status::NotFound(c.message()));
  EXPECT_EQ(c, Status::ColumnNotFound(c.message()));
  Status copy = c;
  EXPECT_TRUE(copy.IsColumnNotFound());
  Status assigned = Status::NotFound("m");
  assigned = c;
  EXPECT_TRUE(assigned.IsColumnNotFound());
  Status moved = std::move(copy);
  EXPECT_TRUE(moved.IsColumnNotFound());
  assigned = Status::NotFound("m");
  EXPECT_FALSE(assigned.IsColumnNotFound());
}

TEST(StatusTest, ToStringNamesCodeAndMessage) {
  EXPECT_EQ(Status::NotFound("row 7 is not cached").ToString(),
            "Not found: row 7 is not cached");
  EXPECT_EQ(Status::Full("budget").ToString(), "Cache full: budget");
  EXPECT_EQ(Status::FingerprintMismatch("x").ToString(), "Fingerprint mismatch: x");
}

TEST(StatusTest, EveryCodeHasAName) {
  for (int c = 0; c <= static_cast<int>(Status::Code::kTooLarge); ++c) {
    EXPECT_STRNE(CodeName(static_cast<Status::Code>(c)), "Unknown") << c;
  }
  EXPECT_STREQ(CodeName(static_cast<Status::Code>(200)), "Unknown");
}

TEST(StatusTest, FromErrnoMapsPermissionErrors) {
  Status s = Status::FromErrno("open /x", EACCES);
  EXPECT_TRUE(s.IsPermissionDenied());
  EXPECT_EQ(s.message(), std::string("open /x: ") + std::strerror(EACCES));
  EXPECT_TRUE(Status::FromErrno("kill", EPERM).IsPermissionDenied());
  Status io = Status::FromErrno("write", ENOSPC);
  EXPECT_TRUE(io.IsIOError());
  EXPECT_NE(io.message().find(std::strerror(ENOSPC)), std::string::npos);
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(Status::NotFound("a"), Status::NotFound("a"));
  EXPECT_FALSE(Status::NotFound("a") == Status::NotFound("b"));
  EXPECT_FALSE(Status::NotFound("a") == Status::Full("a"));
}

TEST(StatusTest, CopiesAndMovesKeepTheMessage) {
  Status a = Status::Corruption("bad magic");
  Status b = a;
  Status c = std::move(a);
  EXPECT_EQ(b, c);
  EXPECT_EQ(c.message(), "bad magic");
}

}  // namespace
}  // namespace shmcache
