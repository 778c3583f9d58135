#include "format/row_codec.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shmcache {
namespace {

// An encoded row in 8-byte aligned private memory.
struct Encoded {
  std::vector<uint64_t> words;
  size_t size = 0;
  std::byte* data() { return reinterpret_cast<std::byte*>(words.data()); }
  template <typename T>
  void Poke(size_t off, T v) {
    std::memcpy(data() + off, &v, sizeof v);
  }
  template <typename T>
  T Peek(size_t off) {
    T v;
    std::memcpy(&v, data() + off, sizeof v);
    return v;
  }
};

Encoded EncodeRow(uint64_t key, std::span<const ColumnRef> cols) {
  Encoded e;
  Status s = RowCodec::EncodedSize(cols, &e.size);
  EXPECT_TRUE(s.ok()) << s.ToString();
  e.words.assign(e.size / 8 + 1, 0xA5A5A5A5A5A5A5A5ULL);  // garbage around it
  RowCodec::Encode(key, cols, e.data(), e.size);
  return e;
}

struct Sample {
  std::vector<float> image;
  std::vector<int64_t> label;
  std::vector<uint8_t> raw;
  std::vector<uint16_t> half;
  int64_t image_shape[3] = {2, 3, 5};
  int64_t label_shape[1] = {1};
  int64_t raw_shape[1] = {13};     // not a multiple of 8: padding
  int64_t half_shape[2] = {4, 0};  // an empty tensor
  std::vector<ColumnRef> cols;

  Sample() {
    for (int i = 0; i < 30; ++i) image.push_back(static_cast<float>(i) * 0.5f);
    label = {7};
    for (int i = 0; i < 13; ++i) raw.push_back(static_cast<uint8_t>(200 + i));
    cols = {
        {"image", DType::kFloat32, image_shape, image.data(), image.size() * 4},
        {"label", DType::kInt64, label_shape, label.data(), 8},
        {"raw", DType::kBytes, raw_shape, raw.data(), raw.size()},
        {"empty_half", DType::kFloat16, half_shape, nullptr, 0},
    };
  }
};

void ExpectColumn(const ColumnView& v, const ColumnRef& want) {
  EXPECT_EQ(v.name, want.name);
  EXPECT_EQ(v.dtype, want.dtype);
  ASSERT_EQ(v.shape.size(), want.shape.size());
  for (size_t i = 0; i < v.shape.size(); ++i) EXPECT_EQ(v.shape[i], want.shape[i]);
  ASSERT_EQ(v.nbytes, want.nbytes);
  if (want.nbytes) {
    EXPECT_EQ(std::memcmp(v.data, want.data, want.nbytes), 0);
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 8, 0u) << "column data aligned";
}

// `row` holds the columns of `s`.
void ExpectSample(const Row& row, const Sample& s) {
  ASSERT_EQ(row.num_columns(), s.cols.size());
  for (size_t i = 0; i < s.cols.size(); ++i) ExpectColumn(row.column(i), s.cols[i]);
}

TEST(RowCodecTest, RoundTripOfSeveralDtypesAndShapes) {
  Sample s;
  Encoded e = EncodeRow(42, s.cols);
  EXPECT_EQ(e.size % 8, 0u);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  EXPECT_EQ(RowCodec::KeyOf(v), 42u);
  ASSERT_EQ(v.num_columns(), s.cols.size());
  for (size_t i = 0; i < s.cols.size(); ++i) ExpectColumn(v.column(i), s.cols[i]);
  auto label = v.find("label");
  ASSERT_TRUE(label.has_value());
  EXPECT_EQ(*reinterpret_cast<const int64_t*>(label->data), 7);
  EXPECT_FALSE(v.find("missing").has_value());
  EXPECT_EQ(v.encoded().size(), e.size);
}

// A writer that gathers a row (pwritev: the head, then each column's data
// and its padding) writes exactly the bytes Encode writes.
TEST(RowCodecTest, TheRowInPiecesIsTheEncodedRow) {
  const std::vector<uint8_t> odd(13, 0xA5);
  const std::vector<float> f = {1.5f, -2.0f, 3.25f};
  const double scalar = 7.0;
  const int64_t odd_shape[1] = {13};
  const int64_t f_shape[2] = {1, 3};
  const ColumnRef cols[] = {
      {"bytes", DType::kUInt8, odd_shape, odd.data(), odd.size()},
      {"f", DType::kFloat32, f_shape, f.data(), f.size() * sizeof(float)},
      {"a-longer-name-than-eight", DType::kFloat64, {}, &scalar, sizeof scalar},
      {"", DType::kUInt8, std::span<const int64_t>(), nullptr, 0},
  };
  const int64_t empty_shape[1] = {0};
  ColumnRef all[4] = {cols[0], cols[1], cols[2], cols[3]};
  all[3].shape = empty_shape;
  size_t size = 0;
  ASSERT_TRUE(RowCodec::EncodedSize(all, &size).ok());
  std::vector<std::byte> whole(size, std::byte{0xFF}), pieces(size, std::byte{0xEE});
  RowCodec::Encode(42, all, whole.data(), size);
  const size_t head = RowCodec::HeadBytes(all);
  EXPECT_EQ(RowCodec::EncodeHead(42, all, pieces.data(), size), head);
  size_t at = head;
  for (const ColumnRef& c : all) {
    if (c.nbytes > 0) std::memcpy(pieces.data() + at, c.data, c.nbytes);
    std::memset(pieces.data() + at + c.nbytes, 0,
                RowCodec::PaddedBytes(c.nbytes) - c.nbytes);
    at += RowCodec::PaddedBytes(c.nbytes);
  }
  ASSERT_EQ(at, size);
  EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), size), 0);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(pieces.data(), size, &v).ok());
  EXPECT_EQ(v.column(0).nbytes, 13u);
}

TEST(RowCodecTest, EveryDtypeRoundTrips) {
  for (int t = 0; t < kNumDTypes; ++t) {
    DType dt = static_cast<DType>(t);
    SCOPED_TRACE(DTypeName(dt));
    size_t item = DTypeSize(dt);
    ASSERT_GT(item, 0u);
    int64_t shape[2] = {3, 2};
    std::vector<uint8_t> data(item * 6);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + t);
    ColumnRef c{DTypeName(dt), dt, shape, data.data(), data.size()};
    Encoded e = EncodeRow(static_cast<uint64_t>(t), std::span(&c, 1));
    RowView v;
    ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
    ExpectColumn(v.column(0), c);
    DType back;
    ASSERT_TRUE(DTypeFromName(DTypeName(dt), &back));
    EXPECT_EQ(back, dt);
  }
  EXPECT_EQ(DTypeSize(static_cast<DType>(kNumDTypes)), 0u);
  EXPECT_STREQ(DTypeName(static_cast<DType>(kNumDTypes)), "invalid");
  DType out;
  EXPECT_FALSE(DTypeFromName("complex256", &out));
}

TEST(RowCodecTest, ScalarAndLargeKey) {
  double x = 3.25;
  ColumnRef c{"x", DType::kFloat64, {}, &x, 8};  // 0-d tensor
  Encoded e = EncodeRow(~0ULL, std::span(&c, 1));
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  EXPECT_EQ(RowCodec::KeyOf(v), ~0ULL);
  EXPECT_TRUE(v.column(0).shape.empty());
  EXPECT_EQ(*reinterpret_cast<const double*>(v.column(0).data), 3.25);
}

TEST(RowCodecTest, CopyMakesAnIndependentRow) {
  Sample s;
  Encoded e = EncodeRow(1, s.cols);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  Row row;
  RowCodec::Copy(v, &row);
  std::memset(e.data(), 0, e.size);  // the source goes away
  ExpectSample(row, s);
}

// A Row moved from is empty (no columns, no view): it does not go on
// describing the buffer it handed over, which the Row moved into reuses or
// frees. The moved-to Row reads as the original did, and the moved-from one
// can be read into again.
TEST(RowCodecTest, AMovedFromRowIsEmpty) {
  Sample s;
  Encoded e = EncodeRow(1, s.cols);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  // Reading a Row moved from is what this test is about.
  // NOLINTBEGIN(bugprone-use-after-move,clang-analyzer-cplusplus.Move)
  Row a;
  RowCodec::Copy(v, &a);
  Row b(std::move(a));
  EXPECT_EQ(a.num_columns(), 0u);
  EXPECT_TRUE(a.view().empty());
  ExpectSample(b, s);
  Row c;
  c = std::move(b);
  EXPECT_EQ(b.num_columns(), 0u);
  EXPECT_TRUE(b.view().empty());
  ExpectSample(c, s);
  RowCodec::Copy(v, &a);
  ExpectSample(a, s);
  // NOLINTEND(bugprone-use-after-move,clang-analyzer-cplusplus.Move)
}

TEST(RowCodecTest, ProjectionSelectsAndReordersColumns) {
  Sample s;
  Encoded e = EncodeRow(9, s.cols);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  std::string_view names[] = {"raw", "image"};
  Row row;
  ASSERT_TRUE(RowCodec::Project(v, names, &row).ok());
  ASSERT_EQ(row.num_columns(), 2u);
  ExpectColumn(row.column(0), s.cols[2]);
  ExpectColumn(row.column(1), s.cols[0]);
  EXPECT_LT(row.view().encoded().size(), e.size);
  EXPECT_EQ(RowCodec::KeyOf(row.view()), 9u);
  // The projected row is itself a valid encoded row.
  RowView again;
  EXPECT_TRUE(
      RowCodec::Decode(row.view().encoded().data(), row.view().encoded().size(), &again)
          .ok());
}

TEST(RowCodecTest, ProjectionOfAnAbsentColumnNamesIt) {
  Sample s;
  Encoded e = EncodeRow(9, s.cols);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  std::string_view names[] = {"label", "mask"};
  Row row;
  Status st = RowCodec::Project(v, names, &row);
  EXPECT_TRUE(st.IsNotFound());
  EXPECT_NE(st.message().find("'mask'"), std::string::npos) << st.ToString();
}

// A missing column is ColumnNotFound (not a missing row), naming the row
// and the column; the output row is left as it was.
TEST(RowCodecTest, ProjectionOfAnAbsentColumnIsColumnNotFound) {
  Sample s;
  Encoded e = EncodeRow(9, s.cols);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  std::string_view names[] = {"label", "mask"};
  Row row;
  Status st = RowCodec::Project(v, names, &row);
  EXPECT_TRUE(st.IsColumnNotFound()) << st.ToString();
  EXPECT_NE(st.message().find("row 9 has no column 'mask'"), std::string::npos)
      << st.ToString();
  EXPECT_EQ(row.num_columns(), 0u);
}

TEST(RowCodecTest, ProjectionOfManyColumns) {
  std::vector<int32_t> vals(40);
  std::vector<std::string> names(40);
  std::vector<ColumnRef> cols;
  int64_t shape[1] = {1};
  for (int i = 0; i < 40; ++i) {
    vals[i] = i * 11;
    char name[8];  // not "c" + to_string(i): GCC 12 warns falsely (-Wrestrict)
    std::snprintf(name, sizeof name, "c%d", i);
    names[i] = name;
  }
  cols.reserve(40);
  for (int i = 0; i < 40; ++i) {
    cols.push_back({names[i], DType::kInt32, shape, &vals[i], 4});
  }
  Encoded e = EncodeRow(5, cols);
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e.data(), e.size, &v).ok());
  std::vector<std::string_view> want;
  for (int i = 39; i >= 10; --i) want.push_back(names[i]);  // > 16: heap path
  Row row;
  ASSERT_TRUE(RowCodec::Project(v, want, &row).ok());
  ASSERT_EQ(row.num_columns(), 30u);
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(row.column(k).name, want[k]);
    EXPECT_EQ(*reinterpret_cast<const int32_t*>(row.column(k).data),
              (39 - static_cast<int>(k)) * 11);
  }
}

TEST(RowCodecTest, EncodedSizeRefusesMalformedColumns) {
  uint8_t d[16] = {};
  int64_t shape4[1] = {4};
  int64_t neg[1] = {-1};
  size_t size;
  EXPECT_TRUE(RowCodec::EncodedSize({}, &size).IsInvalidArgument());
  ColumnRef wrong_bytes{"a", DType::kInt32, shape4, d, 15};
  Status s = RowCodec::EncodedSize(std::span(&wrong_bytes, 1), &size);
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.ToString();
  ColumnRef negative{"b", DType::kUInt8, neg, d, 0};
  EXPECT_TRUE(RowCodec::EncodedSize(std::span(&negative, 1), &size).IsInvalidArgument());
  ColumnRef bad_type{"c", static_cast<DType>(99), shape4, d, 4};
  EXPECT_TRUE(RowCodec::EncodedSize(std::span(&bad_type, 1), &size).IsInvalidArgument());
  std::string long_name(256, 'n');
  ColumnRef named{long_name, DType::kUInt8, shape4, d, 4};
  EXPECT_TRUE(RowCodec::EncodedSize(std::span(&named, 1), &size).IsInvalidArgument());
  std::vector<int64_t> dims(256, 1);
  ColumnRef deep{"d", DType::kUInt8, dims, d, 1};
  EXPECT_TRUE(RowCodec::EncodedSize(std::span(&deep, 1), &size).IsInvalidArgument());
  ColumnRef no_data{"e", DType::kUInt8, shape4, nullptr, 4};
  EXPECT_TRUE(RowCodec::EncodedSize(std::span(&no_data, 1), &size).IsInvalidArgument());
  int64_t huge[2] = {int64_t{1} << 40, int64_t{1} << 40};
  ColumnRef overflow{"f", DType::kFloat64, huge, d, 8};
  EXPECT_TRUE(RowCodec::EncodedSize(std::span(&overflow, 1), &size).IsInvalidArgument());
  std::vector<ColumnRef> too_many(kMaxColumns + 1,
                                  ColumnRef{"g", DType::kUInt8, shape4, d, 4});
  EXPECT_TRUE(RowCodec::EncodedSize(too_many, &size).IsInvalidArgument());
}

// ---- Every corruption path of Decode -----------------------------------

class DecodeCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two columns: "ab" int32[3] and "label" int64[1].
    a_ = {1, 2, 3};
    b_ = {99};
    cols_ = {{"ab", DType::kInt32, a_shape_, a_.data(), 12},
             {"label", DType::kInt64, b_shape_, b_.data(), 8}};
    e_ = EncodeRow(77, cols_);
    RowView v;
    ASSERT_TRUE(RowCodec::Decode(e_.data(), e_.size, &v).ok());
  }
  Status Decode() {
    RowView v;
    return RowCodec::Decode(e_.data(), e_.size, &v);
  }
  void ExpectCorruption(const char* what) {
    Status s = Decode();
    EXPECT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.ToString();
  }
  // Offsets of the first descriptor (after the 16-byte row header).
  static constexpr size_t kDesc0 = kRowHeaderBytes;
  std::vector<int32_t> a_;
  std::vector<int64_t> b_;
  int64_t a_shape_[1] = {3};
  int64_t b_shape_[1] = {1};
  std::vector<ColumnRef> cols_;
  Encoded e_;
};

TEST_F(DecodeCorruptionTest, Truncated) {
  RowView v;
  for (size_t n = 0; n < kRowHeaderBytes; ++n) {
    EXPECT_TRUE(RowCodec::Decode(e_.data(), n, &v).IsCorruption()) << n;
  }
  // A buffer shorter than the row's own size.
  for (size_t n = kRowHeaderBytes; n < e_.size; ++n) {
    EXPECT_TRUE(RowCodec::Decode(e_.data(), n, &v).IsCorruption()) << n;
  }
}

TEST_F(DecodeCorruptionTest, SizeFieldTooSmall) {
  e_.Poke<uint32_t>(0, 8);
  ExpectCorruption("size");
}

TEST_F(DecodeCorruptionTest, SizeFieldNotAMultipleOfEight) {
  e_.Poke<uint32_t>(0, static_cast<uint32_t>(e_.size - 4));
  ExpectCorruption("size");
}

TEST_F(DecodeCorruptionTest, SizeFieldBeyondTheBuffer) {
  e_.Poke<uint32_t>(0, static_cast<uint32_t>(e_.size + 8));
  ExpectCorruption("size");
  e_.Poke<uint32_t>(0, 0xFFFFFFF8u);
  ExpectCorruption("size");
}

TEST_F(DecodeCorruptionTest, OtherFormatVersion) {
  e_.Poke<uint8_t>(6, kRowVersion + 1);
  ExpectCorruption("version");
}

TEST_F(DecodeCorruptionTest, ZeroColumns) {
  e_.Poke<uint16_t>(4, 0);
  ExpectCorruption("column count");
}

TEST_F(DecodeCorruptionTest, TooManyColumns) {
  e_.Poke<uint16_t>(4, static_cast<uint16_t>(kMaxColumns + 1));
  ExpectCorruption("column count");
}

TEST_F(DecodeCorruptionTest, MoreColumnsThanDescriptorsFit) {
  // The data of the first columns is read as descriptors, then they run
  // past the row; which check refuses it first depends on those bytes.
  e_.Poke<uint16_t>(4, 50);
  ExpectCorruption("");
  e_.Poke<uint16_t>(4, 3);  // one descriptor past the real two
  e_.Poke<uint32_t>(0, static_cast<uint32_t>(kDesc0 + 24 + 24));  // row ends there
  RowView v;
  EXPECT_TRUE(RowCodec::Decode(e_.data(), kDesc0 + 48, &v).IsCorruption());
}

TEST_F(DecodeCorruptionTest, DescriptorWithTooManyDims) {
  e_.Poke<uint8_t>(kDesc0 + 1, 255);  // ndim: shape runs past the row
  ExpectCorruption("descriptor truncated");
}

TEST_F(DecodeCorruptionTest, DescriptorWithTooLongName) {
  e_.Poke<uint8_t>(kDesc0 + 2, 255);  // name_len
  ExpectCorruption("descriptor truncated");
}

TEST_F(DecodeCorruptionTest, UnknownDtype) {
  e_.Poke<uint8_t>(kDesc0, 200);
  ExpectCorruption("dtype or shape");
}

TEST_F(DecodeCorruptionTest, NegativeDimension) {
  e_.Poke<int64_t>(kDesc0 + 8, -3);
  ExpectCorruption("dtype or shape");
}

TEST_F(DecodeCorruptionTest, DimensionsThatOverflow) {
  // Second descriptor: int64 with one dimension; make it enormous.
  RowView v;
  ASSERT_TRUE(RowCodec::Decode(e_.data(), e_.size, &v).ok());
  size_t desc1 = kDesc0 + 8 + 8 + 8;  // fixed + 1 dim + "ab" padded
  ASSERT_EQ(e_.Peek<int64_t>(desc1 + 8), 1);
  e_.Poke<int64_t>(desc1 + 8, int64_t{1} << 62);
  ExpectCorruption("dtype or shape");
}

TEST_F(DecodeCorruptionTest, MisalignedDataOffset) {
  uint32_t off = e_.Peek<uint32_t>(kDesc0 + 4);
  e_.Poke<uint32_t>(kDesc0 + 4, off + 4);
  ExpectCorruption("data out of bounds");
}

TEST_F(DecodeCorruptionTest, DataOffsetPastTheRow) {
  e_.Poke<uint32_t>(kDesc0 + 4, static_cast<uint32_t>(e_.size + 8));
  ExpectCorruption("data out of bounds");
}

TEST_F(DecodeCorruptionTest, DataRunningPastTheRow) {
  // Offset inside the row, but the 12 bytes of data do not fit after it.
  e_.Poke<uint32_t>(kDesc0 + 4, static_cast<uint32_t>(e_.size - 8));
  ExpectCorruption("data out of bounds");
  // Or a dimension grown so that the data no longer fits.
  SetUp();
  e_.Poke<int64_t>(kDesc0 + 8, 1000);
  ExpectCorruption("data out of bounds");
}

// Whatever single byte is damaged, Decode either refuses the row or yields
// columns that lie inside it: never a read out of bounds.
TEST_F(DecodeCorruptionTest, AnySingleByteDamageStaysInBounds) {
  const std::vector<uint64_t> pristine = e_.words;
  const uint8_t values[] = {0x00, 0x01, 0x07, 0x80, 0xff};
  int refused = 0;
  for (size_t pos = 0; pos < e_.size; ++pos) {
    for (uint8_t val : values) {
      e_.words = pristine;
      e_.Poke<uint8_t>(pos, val);
      RowView v;
      Status s = RowCodec::Decode(e_.data(), e_.size, &v);
      if (!s.ok()) {
        EXPECT_TRUE(s.IsCorruption()) << pos << ": " << s.ToString();
        ++refused;
        continue;
      }
      const std::byte* lo = e_.data();
      const std::byte* hi = e_.data() + e_.size;
      for (size_t i = 0; i < v.num_columns(); ++i) {
        ColumnView c = v.column(i);
        EXPECT_GE(c.data, lo);
        EXPECT_LE(c.data + c.nbytes, hi) << pos;
        EXPECT_GE(reinterpret_cast<const std::byte*>(c.name.data()), lo);
        EXPECT_LE(reinterpret_cast<const std::byte*>(c.name.data() + c.name.size()), hi);
      }
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace shmcache
