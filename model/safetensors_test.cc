#include "model/safetensors.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dattn {
namespace model {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir != nullptr ? dir : "/tmp", name);
}

template <typename T>
absl::string_view Bytes(const std::vector<T>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A file from a header text and data bytes, as the format describes it.
std::string Make(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::string F32Bytes(std::vector<float> v) { return std::string(Bytes(v)); }

TEST(SafetensorsTest, HandWrittenFileFromTheSpec) {
  const std::string file = Make(
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I32","shape":[],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )",
      F32Bytes({1.0f, 2.0f}) + std::string("\x07\x00\x00\x00", 4));
  absl::StatusOr<SafetensorsFile> st = SafetensorsFile::FromBytes(file, "spec.safetensors");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->tensors().size(), 2u);
  EXPECT_EQ(st->tensors()[0].name, "a");  // In offset order.
  EXPECT_EQ(st->tensors()[1].name, "b");
  EXPECT_EQ(st->tensors()[1].shape.size(), 0u);  // A scalar.
  EXPECT_EQ(st->tensors()[1].numel, 1);
  EXPECT_EQ(st->metadata().at("format"), "pt");
  std::vector<float> a(2);
  ASSERT_TRUE(st->ReadAsFloat32("a", {2}, absl::MakeSpan(a)).ok());
  EXPECT_EQ(a, (std::vector<float>{1.0f, 2.0f}));
  int32_t b;
  std::memcpy(&b, st->Data(**st->Find("b")).data(), 4);
  EXPECT_EQ(b, 7);
  EXPECT_TRUE(absl::IsNotFound(st->Find("c").status()));
}

TEST(SafetensorsTest, RoundTripEveryDtype) {
  const std::vector<double> f64 = {1.0 / 3, -2.5, 1e300};
  const std::vector<float> f32 = {0.5f, -1.25f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<uint16_t> f16 = {0x3c00, 0xc100, 0x7bff, 0x0001};  // 1, -2.5, 65504, 2^-24
  const std::vector<uint16_t> bf16 = {FloatToBf16(1.0f), FloatToBf16(-0.5f), FloatToBf16(3.140625f),
                                      FloatToBf16(1e-30f)};
  const std::vector<int64_t> i64 = {-1, int64_t{1} << 40};
  const std::vector<int32_t> i32 = {-7, 1 << 30};
  const std::vector<uint16_t> u16 = {0, 65535, 300};
  const std::vector<uint8_t> u8 = {0, 255, 1};
  const std::vector<TensorToWrite> tensors = {
      {"f64", SafeDtype::kF64, {3}, Bytes(f64)},
      TensorToWrite::F32("f32", {2, 3}, f32),
      {"f16", SafeDtype::kF16, {4}, Bytes(f16)},
      {"bf16", SafeDtype::kBF16, {2, 2}, Bytes(bf16)},
      {"i64", SafeDtype::kI64, {2}, Bytes(i64)},
      {"i32", SafeDtype::kI32, {1, 2}, Bytes(i32)},
      {"u16", SafeDtype::kU16, {3}, Bytes(u16)},
      {"u8", SafeDtype::kU8, {3}, Bytes(u8)},
      {"empty", SafeDtype::kF32, {0, 3}, absl::string_view()},
  };
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "dattn"}};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u);  // Padded: the data is 8-byte aligned.
  EXPECT_EQ((*bytes)[8], '{');

  const std::string path = TempPath("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata, /*sync=*/true).ok());
  absl::StatusOr<SafetensorsFile> st = SafetensorsFile::Open(path);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(std::string(Bytes(std::vector<char>(bytes->begin(), bytes->end()))),
            *ReadSmallFile(path, 1 << 20));  // Streamed and in-memory writers agree.
  EXPECT_EQ(st->metadata(), metadata);
  ASSERT_EQ(st->tensors().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    absl::StatusOr<const SafeTensorInfo*> info = st->Find(t.name);
    ASSERT_TRUE(info.ok()) << t.name;
    EXPECT_EQ((*info)->dtype, t.dtype) << t.name;
    EXPECT_EQ((*info)->shape, t.shape) << t.name;
    EXPECT_EQ(st->Data(**info), t.bytes) << t.name;
  }
  std::vector<float> out(4);
  ASSERT_TRUE(st->ReadAsFloat32("f16", {4}, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24)}));
  ASSERT_TRUE(st->ReadAsFloat32("bf16", {2, 2}, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -0.5f);
  EXPECT_EQ(out[2], 3.140625f);
  EXPECT_NEAR(out[3], 1e-30f, 1e-32f);  // bf16 keeps fp32's range.
  std::vector<float> three(3);
  ASSERT_TRUE(st->ReadAsFloat32("f64", {3}, absl::MakeSpan(three)).ok());
  EXPECT_EQ(three[0], static_cast<float>(1.0 / 3));
  EXPECT_TRUE(std::isinf(three[2]));

  absl::Status s = st->ReadAsFloat32("f32", {3, 2}, absl::MakeSpan(out));
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_NE(s.message().find("has shape [2, 3], expected [3, 2]"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsFailedPrecondition(st->ReadAsFloat32("i32", {1, 2}, absl::MakeSpan(out))));
  EXPECT_TRUE(absl::IsInvalidArgument(st->ReadAsFloat32("f32", {2, 3}, absl::MakeSpan(out))));
}

TEST(SafetensorsTest, WriterRefusesBadTensors) {
  const std::vector<float> two = {1, 2};
  absl::Status s = SerializeSafetensors({TensorToWrite::F32("x", {3}, two)}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("\"x\""), std::string::npos) << s;
  EXPECT_TRUE(absl::IsInvalidArgument(
      SerializeSafetensors({TensorToWrite::F32("x", {2}, two), TensorToWrite::F32("x", {2}, two)})
          .status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(SerializeSafetensors({TensorToWrite::F32("", {2}, two)}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SerializeSafetensors({TensorToWrite::F32("__metadata__", {2}, two)}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SerializeSafetensors({TensorToWrite::F32("x", {-1, -2}, two)}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      SerializeSafetensors({TensorToWrite::F32("bad\xff", {2}, two)}).status()));
}

// Every way the header or data can be wrong is DATA_LOSS with the file name and the problem.
TEST(SafetensorsTest, MalformedFilesAreClearErrors) {
  const std::string data8 = F32Bytes({1.0f, 2.0f});
  const std::string good_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    std::string bytes;
    std::string words;
  };
  std::string huge(8, '\0');
  const uint64_t big = kMaxSafetensorsHeader + 1;
  std::memcpy(huge.data(), &big, 8);
  std::string past(8, '\0');
  const uint64_t forty = 40;
  std::memcpy(past.data(), &forty, 8);
  const std::vector<Case> cases = {
      {"abc", "too short"},
      {huge + "{}", "over the limit"},
      {past + "{}", "runs past the end"},
      {Make(" {" + good_entry + "}", data8), "does not start with '{'"},
      {Make("{" + good_entry, data8), "not valid JSON"},
      {Make("{" + good_entry + "," + good_entry + "}", data8), "duplicate key \"a\""},
      {Make(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data8),
       "duplicate key \"dtype\""},
      {Make("[1,2]", data8), "does not start with '{'"},
      {Make(R"({"a":5})", ""), "not an object"},
      {Make(R"({"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", data8),
       "unknown safetensors dtype \"F12\""},
      {Make(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", data8), "no dtype"},
      {Make(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8), "is not counts"},
      {Make(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data8), "is not counts"},
      {Make(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data8),
       "data_offsets must be"},
      {Make(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data8),
       "end before they begin"},
      {Make(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8), "needs 12 bytes"},
      {Make(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            data8 + "1234"),
       "(a gap)"},
      {Make(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            data8),
       "overlaps"},
      {Make("{" + good_entry + "}", data8.substr(0, 7)), "(truncated)"},
      {Make("{" + good_entry + "}", data8 + "x"), "(extra bytes at the end)"},
      {Make(R"({"__metadata__":{"k":1}})", ""), "is not a string"},
      {Make(R"({"__metadata__":[]})", ""), "__metadata__ is not an object"},
  };
  for (const Case& c : cases) {
    absl::Status s = SafetensorsFile::FromBytes(c.bytes, "bad.safetensors").status();
    EXPECT_TRUE(absl::IsDataLoss(s)) << c.words << ": " << s;
    EXPECT_NE(s.message().find("bad.safetensors"), std::string::npos) << s;
    EXPECT_NE(s.message().find(c.words), std::string::npos) << c.words << ": " << s;
  }
  // A header nested a million levels deep is refused, not a stack overflow.
  const std::string deep = R"({"a":)" + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  absl::Status s = SafetensorsFile::FromBytes(Make(deep, ""), "deep.safetensors").status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  // Found by fuzzing (fuzz/safetensors_fuzz, docs/FUZZING.md): a shape holding a list nested
  // 300,000 deep reached the error message's shape->dump(), which recursed until the stack
  // overflowed (SIGSEGV). fuzz/corpus/safetensors_fuzz/deep-shape is 4,000 deep.
  const std::string deep_shape = R"({"a":{"dtype":"F32","shape":[1,)" + std::string(300000, '[') +
                                 std::string(300000, ']') + R"(],"data_offsets":[0,4]}})";
  s = SafetensorsFile::FromBytes(Make(deep_shape, "1234"), "deep.safetensors").status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("header: nested more than 64 levels deep"), std::string::npos) << s;
  // Within the depth, the error names the entry, not the whole shape.
  s = SafetensorsFile::FromBytes(
          Make(R"({"a":{"dtype":"F32","shape":[1,[[2]]],"data_offsets":[0,4]}})", "1234"), "l")
          .status();
  EXPECT_NE(s.message().find("shape entry 1 (a list) is not a count"), std::string::npos) << s;
  // An empty file of tensors is valid.
  EXPECT_TRUE(SafetensorsFile::FromBytes(Make("{}", ""), "empty").ok());
}

TEST(SafetensorsTest, Bf16AndHalfConversions) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3f80);  // A tie rounds to even.
  EXPECT_EQ(FloatToBf16(1.01171875f), 0x3f82);  // A tie rounds to even, upwards.
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x8000), -0.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));      // Smallest normal.
  EXPECT_EQ(HalfToFloat(0x83ff), -std::ldexp(1023.0f, -24));  // Largest subnormal, negative.
}

}  // namespace
}  // namespace model
}  // namespace dattn
