#include "api/engine_convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn::api {
namespace {

using ::testing::HasSubstr;

TEST(EngineConvertTest, SpecDefaultsAndFields) {
  v1::AttentionSpec api;
  api.add_segment_lengths(16);
  api.add_segment_lengths(32);
  api.add_dilation_rates(1);
  api.add_dilation_rates(2);
  absl::StatusOr<AttentionSpec> spec = ToEngineSpec(api);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->segment_lengths, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(spec->dilation_rates, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(spec->mode, AttentionMode::kGrouped);
  EXPECT_EQ(spec->head_offsets, HeadOffsets::kModulo);
  EXPECT_FALSE(spec->scale.has_value());
  EXPECT_FALSE(spec->causal);

  api.set_mode(v1::ATTENTION_MODE_MIXTURE);
  api.set_head_offsets(v1::HEAD_OFFSETS_BLOCKED);
  api.set_scale(0.25);
  api.set_causal(true);
  spec = ToEngineSpec(api);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->mode, AttentionMode::kMixture);
  EXPECT_EQ(spec->head_offsets, HeadOffsets::kBlocked);
  EXPECT_EQ(spec->scale, 0.25);
  EXPECT_TRUE(spec->causal);
}

TEST(EngineConvertTest, UnknownEnumValuesNameTheFieldAndValue) {
  v1::AttentionSpec api;
  api.set_mode(static_cast<v1::AttentionMode>(7));
  absl::StatusOr<AttentionSpec> spec = ToEngineSpec(api, "spec.attention.attention");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("spec.attention.attention.mode: unknown value 7"));
  api.set_mode(v1::ATTENTION_MODE_GROUPED);
  api.set_head_offsets(static_cast<v1::HeadOffsets>(9));
  spec = ToEngineSpec(api);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("attention.head_offsets"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("9"));

  EXPECT_THAT(std::string(ToEngineDType(static_cast<v1::DType>(42), "x.dtype").status().message()),
              HasSubstr("x.dtype: unknown value 42"));
  EXPECT_THAT(std::string(ToEngineDType(v1::DTYPE_UNSPECIFIED).status().message()),
              HasSubstr("dtype: required"));
}

TEST(EngineConvertTest, PatternCountIsBounded) {
  v1::AttentionSpec api;
  for (int i = 0; i < kMaxPatterns; ++i) {
    api.add_segment_lengths(64);
    api.add_dilation_rates(1);
  }
  ASSERT_TRUE(ToEngineSpec(api, "spec.attention.attention").ok());
  api.add_segment_lengths(64);
  absl::StatusOr<AttentionSpec> spec = ToEngineSpec(api, "spec.attention.attention");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("spec.attention.attention.segment_lengths: at most 64 patterns"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("got 65"));
  api.mutable_segment_lengths()->RemoveLast();
  for (int i = 0; i < 3000; ++i) api.add_dilation_rates(1);
  spec = ToEngineSpec(api, "a");
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("a.dilation_rates:"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("got 3064"));
}

TEST(EngineConvertTest, DTypesRoundTrip) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    absl::StatusOr<DType> back = ToEngineDType(ToApiDType(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
}

}  // namespace
}  // namespace dattn::api
