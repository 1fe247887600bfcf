// Every error of docs/ENGINE.md "Errors" is INVALID_ARGUMENT and names the offending value;
// valid calls (including strided inputs) pass.
#include "engine/validate.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/attention.h"
#include "engine/attention_spec.h"
#include "engine/testing/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using testutil::HostTensor;
using testutil::Layout;

// An INVALID_ARGUMENT status whose message contains each of `values` as a whole token (not inside a
// longer number or word: "7" does not match "17" or "7.5").
::testing::AssertionResult InvalidNaming(const absl::Status& status,
                                         const std::vector<std::string>& values) {
  if (status.code() != absl::StatusCode::kInvalidArgument) {
    return ::testing::AssertionFailure() << "want INVALID_ARGUMENT, got " << status;
  }
  const std::string message(status.message());
  auto part_of_token = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.';
  };
  for (const std::string& value : values) {
    bool found = false;
    for (size_t at = message.find(value); at != std::string::npos && !found;
         at = message.find(value, at + 1)) {
      const bool left_ok = at == 0 || !part_of_token(message[at - 1]) ||
                           (message[at - 1] == '.' && at >= 2 && !std::isdigit(message[at - 2]));
      const size_t end = at + value.size();
      // A trailing '.' ends a sentence unless a digit follows it.
      const bool right_ok =
          end >= message.size() || !part_of_token(message[end]) ||
          (message[end] == '.' && (end + 1 >= message.size() || !std::isdigit(message[end + 1])));
      found = left_ok && right_ok;
    }
    if (!found) {
      return ::testing::AssertionFailure()
             << "message does not name '" << value << "': " << status.message();
    }
  }
  return ::testing::AssertionSuccess() << status.message();
}

AttentionSpec Spec(std::vector<int64_t> w, std::vector<int64_t> r,
                   AttentionMode mode = AttentionMode::kGrouped) {
  AttentionSpec spec;
  spec.segment_lengths = std::move(w);
  spec.dilation_rates = std::move(r);
  spec.mode = mode;
  return spec;
}

BackendCaps AnyDCaps() {
  return BackendCaps{"cpu", Device::kCpu, {DType::kFloat32, DType::kFloat64}, {}};
}

// --- ValidateSpec.

TEST(ValidateSpecTest, AcceptsValidSpecs) {
  EXPECT_EQ(ValidateSpec(Spec({2048, 4096}, {1, 2})), absl::OkStatus());
  EXPECT_EQ(ValidateSpec(Spec({5, 7}, {3, 9})),
            absl::OkStatus());  // r need not divide w, r > w ok.
  AttentionSpec mixture = Spec({4, 8}, {1, 2}, AttentionMode::kMixture);
  mixture.head_offsets = HeadOffsets::kBlocked;
  mixture.scale = 0.125;
  mixture.causal = true;
  EXPECT_EQ(ValidateSpec(mixture), absl::OkStatus());
}

TEST(ValidateSpecTest, EmptyLists) {
  const absl::Status s = ValidateSpec(Spec({}, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ContainsRegex("empty|at least"));
}

TEST(ValidateSpecTest, MismatchedListLengths) {
  EXPECT_TRUE(InvalidNaming(ValidateSpec(Spec({40, 80, 160}, {1, 4})), {"3", "2"}));
  EXPECT_TRUE(InvalidNaming(ValidateSpec(Spec({40}, {1, 4, 4, 4, 4})), {"1", "5"}));
  EXPECT_EQ(ValidateSpec(Spec({40}, {})).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateSpecTest, SegmentLengthBelowOne) {
  EXPECT_TRUE(InvalidNaming(ValidateSpec(Spec({40, -7}, {1, 4})), {"-7"}));
  EXPECT_TRUE(InvalidNaming(ValidateSpec(Spec({0, 40}, {1, 4})), {"0"}));
}

TEST(ValidateSpecTest, DilationRateBelowOne) {
  EXPECT_TRUE(InvalidNaming(ValidateSpec(Spec({40, 80}, {1, -5})), {"-5"}));
  EXPECT_TRUE(InvalidNaming(ValidateSpec(Spec({40, 80}, {0, 4})), {"0"}));
}

TEST(ValidateSpecTest, BadScale) {
  for (double scale : {0.0, -0.5, std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::infinity()}) {
    AttentionSpec spec = Spec({4}, {1});
    spec.scale = scale;
    EXPECT_EQ(ValidateSpec(spec).code(), absl::StatusCode::kInvalidArgument) << scale;
  }
  AttentionSpec spec = Spec({4}, {1});
  spec.scale = -0.5;
  EXPECT_TRUE(InvalidNaming(ValidateSpec(spec), {"-0.5"}));
}

TEST(ValidateSpecTest, BlockedOffsetsOnlyInMixtureMode) {
  AttentionSpec spec = Spec({4, 8}, {1, 2});
  spec.head_offsets = HeadOffsets::kBlocked;
  const absl::Status s = ValidateSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("blocked"));
}

// --- ValidateProblem.

TEST(ValidateProblemTest, AcceptsValidProblems) {
  EXPECT_EQ(ValidateProblem(Spec({4, 8}, {1, 2}), 2, 13, 3, 8, DType::kFloat32, AnyDCaps()),
            absl::OkStatus());
  // Mixture mode needs no H >= G.
  EXPECT_EQ(ValidateProblem(Spec({2, 4, 8}, {1, 2, 4}, AttentionMode::kMixture), 1, 8, 1, 8,
                            DType::kFloat64, AnyDCaps()),
            absl::OkStatus());
  // Segments longer than N are fine.
  EXPECT_EQ(ValidateProblem(Spec({4096}, {4}), 1, 100, 1, 8, DType::kFloat64, AnyDCaps()),
            absl::OkStatus());
}

TEST(ValidateProblemTest, RunsSpecChecks) {
  EXPECT_TRUE(InvalidNaming(
      ValidateProblem(Spec({40, -7}, {1, 4}), 1, 8, 2, 8, DType::kFloat32, AnyDCaps()), {"-7"}));
}

TEST(ValidateProblemTest, ZeroOrNegativeDimensions) {
  const AttentionSpec spec = Spec({4}, {1});
  EXPECT_TRUE(InvalidNaming(ValidateProblem(spec, 0, 8, 2, 8, DType::kFloat32, AnyDCaps()), {"0"}));
  EXPECT_TRUE(InvalidNaming(ValidateProblem(spec, 1, 0, 2, 8, DType::kFloat32, AnyDCaps()), {"0"}));
  EXPECT_TRUE(InvalidNaming(ValidateProblem(spec, 1, 8, 0, 8, DType::kFloat32, AnyDCaps()), {"0"}));
  EXPECT_TRUE(InvalidNaming(ValidateProblem(spec, 1, 8, 2, 0, DType::kFloat32, AnyDCaps()), {"0"}));
  EXPECT_TRUE(
      InvalidNaming(ValidateProblem(spec, -3, 8, 2, 8, DType::kFloat32, AnyDCaps()), {"-3"}));
}

TEST(ValidateProblemTest, FewerHeadsThanGroups) {
  const AttentionSpec spec = Spec({1, 2, 3, 4, 5, 6, 10, 11, 12}, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  EXPECT_TRUE(
      InvalidNaming(ValidateProblem(spec, 1, 16, 7, 8, DType::kFloat32, AnyDCaps()), {"7", "9"}));
  EXPECT_EQ(ValidateProblem(spec, 1, 16, 9, 8, DType::kFloat32, AnyDCaps()), absl::OkStatus());
}

TEST(ValidateProblemTest, ElementCountOverflow) {
  const AttentionSpec spec = Spec({4}, {1});
  const int64_t big = int64_t{1} << 20;
  // 1000003 * 2^60 overflows int64.
  EXPECT_TRUE(InvalidNaming(
      ValidateProblem(spec, 1000003, big, big, big, DType::kFloat32, AnyDCaps()), {"1000003"}));
  // B*H*N alone overflows (D = 1).
  EXPECT_EQ(ValidateProblem(spec, int64_t{1} << 40, int64_t{1} << 20, int64_t{1} << 10, 1,
                            DType::kFloat32, AnyDCaps())
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Just below the limit is not an overflow: 2^62 elements.
  EXPECT_EQ(ValidateProblem(spec, int64_t{1} << 20, int64_t{1} << 20, int64_t{1} << 12,
                            int64_t{1} << 10, DType::kFloat32, AnyDCaps()),
            absl::OkStatus());
}

TEST(ValidateProblemTest, UnsupportedHeadDimNamesTheSupportedOnes) {
  const BackendCaps caps{"cuda", Device::kCuda, {DType::kFloat16}, {64, 128}};
  const absl::Status s = ValidateProblem(Spec({4}, {1}), 1, 8, 2, 48, DType::kFloat16, caps);
  EXPECT_TRUE(InvalidNaming(s, {"48", "64", "128"}));
  EXPECT_EQ(ValidateProblem(Spec({4}, {1}), 1, 8, 2, 128, DType::kFloat16, caps), absl::OkStatus());
}

TEST(ValidateProblemTest, UnsupportedDType) {
  const BackendCaps caps{"restricted", Device::kCpu, {DType::kFloat32}, {}};
  const absl::Status s = ValidateProblem(Spec({4}, {1}), 1, 8, 2, 8, DType::kFloat64, caps);
  EXPECT_TRUE(InvalidNaming(s, {"fp64", "fp32"}));
}

// --- ValidateForward / ValidateBackward on real views.

constexpr int64_t kB = 2, kN = 8, kH = 4, kD = 8;

// Valid fp32 forward and backward tensors of shape (2, 8, 4, 8).
struct Tensors {
  HostTensor q{DType::kFloat32, {kB, kN, kH, kD}};
  HostTensor k{DType::kFloat32, {kB, kN, kH, kD}};
  HostTensor v{DType::kFloat32, {kB, kN, kH, kD}};
  HostTensor out{DType::kFloat32, {kB, kN, kH, kD}};
  HostTensor lse{DType::kFloat32, {kB, kH, kN}};
  HostTensor dout{DType::kFloat32, {kB, kN, kH, kD}};
  HostTensor dq{DType::kFloat32, {kB, kN, kH, kD}};
  HostTensor dk{DType::kFloat32, {kB, kN, kH, kD}};
  HostTensor dv{DType::kFloat32, {kB, kN, kH, kD}};

  ForwardArgs Forward() const { return {q.view(), k.view(), v.view(), out.view(), lse.view()}; }
  BackwardArgs Backward() const {
    return {q.view(),    k.view(),  v.view(),  out.view(), lse.view(),
            dout.view(), dq.view(), dk.view(), dv.view()};
  }
};

class ValidateCallTest : public ::testing::Test {
 protected:
  AttentionSpec spec_ = Spec({4, 8}, {1, 2});
  BackendCaps caps_ = AnyDCaps();
  Tensors t_;
};

TEST_F(ValidateCallTest, AcceptsValidCalls) {
  EXPECT_EQ(ValidateForward(spec_, t_.Forward(), caps_), absl::OkStatus());
  EXPECT_EQ(ValidateBackward(spec_, t_.Backward(), caps_), absl::OkStatus());
}

TEST_F(ValidateCallTest, AcceptsStridedInputs) {
  for (Layout layout : {Layout::kPadded, Layout::kInterleaved, Layout::kReversed}) {
    HostTensor q(DType::kFloat32, {kB, kN, kH, kD}, layout);
    HostTensor dout(DType::kFloat32, {kB, kN, kH, kD}, layout);
    ForwardArgs fwd = t_.Forward();
    fwd.q = q.view();
    EXPECT_EQ(ValidateForward(spec_, fwd, caps_), absl::OkStatus()) << LayoutName(layout);
    BackwardArgs bwd = t_.Backward();
    bwd.q = q.view();
    bwd.dout = dout.view();
    EXPECT_EQ(ValidateBackward(spec_, bwd, caps_), absl::OkStatus()) << LayoutName(layout);
  }
}

TEST_F(ValidateCallTest, RunsSpecAndProblemChecks) {
  EXPECT_TRUE(
      InvalidNaming(ValidateForward(Spec({40, 80, 160}, {1, 4}), t_.Forward(), caps_), {"3", "2"}));
  EXPECT_TRUE(InvalidNaming(
      ValidateForward(Spec({1, 2, 3, 4, 5}, {1, 1, 1, 1, 1}), t_.Forward(), caps_), {"4", "5"}));
  EXPECT_TRUE(InvalidNaming(
      ValidateBackward(Spec({1, 2, 3, 4, 5}, {1, 1, 1, 1, 1}), t_.Backward(), caps_), {"4", "5"}));
  const BackendCaps d64{"cuda", Device::kCpu, {DType::kFloat32}, {64}};
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, t_.Forward(), d64), {"8", "64"}));
  const BackendCaps fp64_only{"fp64", Device::kCpu, {DType::kFloat64}, {}};
  EXPECT_TRUE(InvalidNaming(ValidateBackward(spec_, t_.Backward(), fp64_only), {"fp32"}));
}

TEST_F(ValidateCallTest, WrongRank) {
  ForwardArgs args = t_.Forward();
  args.q.shape = {kB, kN, kH * kD};
  args.q.strides = {kN * kH * kD, kH * kD, 1};
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, args, caps_), {"3"}));
  args = t_.Forward();
  args.k.shape.push_back(1);
  args.k.strides.push_back(1);
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, args, caps_), {"5"}));
  BackwardArgs bwd = t_.Backward();
  bwd.dout.shape.pop_back();
  bwd.dout.strides.pop_back();
  EXPECT_TRUE(InvalidNaming(ValidateBackward(spec_, bwd, caps_), {"3"}));
}

TEST_F(ValidateCallTest, ShapeMismatchAmongQkv) {
  HostTensor k37(DType::kFloat32, {kB, 37, kH, kD});
  ForwardArgs args = t_.Forward();
  args.k = k37.view();
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, args, caps_), {"37"}));
  HostTensor v11(DType::kFloat32, {kB, kN, kH, 11});
  args = t_.Forward();
  args.v = v11.view();
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, args, caps_), {"11"}));
  HostTensor out13(DType::kFloat32, {kB, kN, 13, kD});
  args = t_.Forward();
  args.out = out13.view();
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, args, caps_), {"13"}));
}

TEST_F(ValidateCallTest, BackwardShapeMismatch) {
  HostTensor n37(DType::kFloat32, {kB, 37, kH, kD});
  for (int which = 0; which < 5; ++which) {
    BackwardArgs args = t_.Backward();
    TensorView* views[] = {&args.out, &args.dout, &args.dq, &args.dk, &args.dv};
    *views[which] = n37.view();
    EXPECT_TRUE(InvalidNaming(ValidateBackward(spec_, args, caps_), {"37"})) << which;
  }
}

TEST_F(ValidateCallTest, DTypeAndDeviceMismatch) {
  HostTensor k64(DType::kFloat64, {kB, kN, kH, kD});
  ForwardArgs args = t_.Forward();
  args.k = k64.view();
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, args, caps_), {"fp64"}));
  args = t_.Forward();
  args.v.device = Device::kCuda;
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
  BackwardArgs bwd = t_.Backward();
  bwd.dv = k64.view();
  EXPECT_TRUE(InvalidNaming(ValidateBackward(spec_, bwd, caps_), {"fp64"}));
}

TEST_F(ValidateCallTest, UnsupportedDTypeForBackend) {
  Tensors half;
  for (HostTensor* t : {&half.q, &half.k, &half.v, &half.out}) {
    *t = HostTensor(DType::kFloat16, {kB, kN, kH, kD});
  }
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, half.Forward(), caps_), {"fp16"}));
}

TEST_F(ValidateCallTest, NullData) {
  ForwardArgs args = t_.Forward();
  args.v.data = nullptr;
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
  args = t_.Forward();
  args.lse.data = nullptr;
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
  BackwardArgs bwd = t_.Backward();
  bwd.dk.data = nullptr;
  EXPECT_EQ(ValidateBackward(spec_, bwd, caps_).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ValidateCallTest, OutputsMustBeContiguous) {
  HostTensor padded(DType::kFloat32, {kB, kN, kH, kD}, Layout::kPadded);
  ForwardArgs args = t_.Forward();
  args.out = padded.view();
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
  for (int which = 0; which < 3; ++which) {
    BackwardArgs bwd = t_.Backward();
    TensorView* grads[] = {&bwd.dq, &bwd.dk, &bwd.dv};
    *grads[which] = padded.view();
    EXPECT_EQ(ValidateBackward(spec_, bwd, caps_).code(), absl::StatusCode::kInvalidArgument)
        << which;
  }
  HostTensor lse_padded(DType::kFloat32, {kB, kH, kN}, Layout::kPadded);
  args = t_.Forward();
  args.lse = lse_padded.view();
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ValidateCallTest, LseShapeAndDType) {
  HostTensor bnh(DType::kFloat32, {kB, kN, kH});  // (B, N, H) instead of (B, H, N).
  ForwardArgs args = t_.Forward();
  args.lse = bnh.view();
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
  HostTensor rank4(DType::kFloat32, {kB, kH, kN, 1});
  args.lse = rank4.view();
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
  HostTensor lse64(DType::kFloat64, {kB, kH, kN});
  args.lse = lse64.view();
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, args, caps_), {"fp64"}));
  BackwardArgs bwd = t_.Backward();
  bwd.lse = bnh.view();
  EXPECT_EQ(ValidateBackward(spec_, bwd, caps_).code(), absl::StatusCode::kInvalidArgument);

  // fp64 inputs need an fp64 lse.
  Tensors t64;
  for (HostTensor* t : {&t64.q, &t64.k, &t64.v, &t64.out}) {
    *t = HostTensor(DType::kFloat64, {kB, kN, kH, kD});
  }
  EXPECT_TRUE(InvalidNaming(ValidateForward(spec_, t64.Forward(), caps_), {"fp32"}));
  t64.lse = HostTensor(DType::kFloat64, {kB, kH, kN});
  EXPECT_EQ(ValidateForward(spec_, t64.Forward(), caps_), absl::OkStatus());
}

TEST_F(ValidateCallTest, ZeroSizedTensors) {
  for (int dim : {0, 1}) {  // B = 0, then N = 0.
    std::vector<int64_t> shape = {kB, kN, kH, kD};
    shape[dim] = 0;
    std::vector<int64_t> lse_shape = {shape[0], kH, shape[1]};
    HostTensor q(DType::kFloat32, shape), k(DType::kFloat32, shape), v(DType::kFloat32, shape),
        out(DType::kFloat32, shape), lse(DType::kFloat32, lse_shape);
    EXPECT_TRUE(InvalidNaming(
        ValidateForward(spec_, {q.view(), k.view(), v.view(), out.view(), lse.view()}, caps_),
        {"0"}))
        << dim;
  }
}

TEST_F(ValidateCallTest, OverflowingShapeIsRejectedWithoutTouchingMemory) {
  // Views of a huge shape over a tiny buffer: validation must reject them from the shape alone.
  const int64_t big = int64_t{1} << 20;
  ForwardArgs args = t_.Forward();
  for (TensorView* view : {&args.q, &args.k, &args.v, &args.out}) {
    view->shape = {1000003, big, big, big};
    view->strides = {1, 1, 1, 1};
  }
  args.lse.shape = {1000003, big, big};
  args.lse.strides = {1, 1, 1};
  EXPECT_EQ(ValidateForward(spec_, args, caps_).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LseDTypeTest, Fp64OnlyForFp64) {
  EXPECT_EQ(LseDType(DType::kFloat64), DType::kFloat64);
  EXPECT_EQ(LseDType(DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(LseDType(DType::kFloat16), DType::kFloat32);
  EXPECT_EQ(LseDType(DType::kBFloat16), DType::kFloat32);
}

}  // namespace
}  // namespace dattn
