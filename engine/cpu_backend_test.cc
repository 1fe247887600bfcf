// The CPU backend against the float64 oracle (docs/ENGINE.md, "Oracle and tolerances"): every
// listed case, both modes (and mixture with head_offsets=blocked), fp32 and fp64, causal and not,
// forward and backward; plus strided inputs, thread-count independence, NaN propagation, and
// "validation failure writes nothing".
#include "engine/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "engine/attention.h"
#include "engine/attention_spec.h"
#include "engine/testing/oracle.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

using testutil::HostTensor;
using testutil::Layout;
using testutil::LseNear;
using testutil::RandomValues;
using testutil::RelativelyNear;

// docs/ENGINE.md: fp64 1e-12, fp32 (CPU) 1e-5, relative Frobenius error.

// attention.h: lse is fp64 for fp64 inputs, fp32 otherwise.
DType LseTypeFor(DType dtype) {
  return dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

enum class Mode { kGrouped, kMixture, kMixtureBlocked };

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kGrouped:
      return "Grouped";
    case Mode::kMixture:
      return "Mixture";
    case Mode::kMixtureBlocked:
      return "MixtureBlocked";
  }
  return "?";
}

struct Case {
  std::string name;
  oracle::Shape shape;
  std::vector<int64_t> w, r;
  std::optional<double> scale;
};

AttentionSpec MakeSpec(const Case& c, Mode mode, bool causal) {
  AttentionSpec spec;
  spec.segment_lengths = c.w;
  spec.dilation_rates = c.r;
  spec.scale = c.scale;
  spec.causal = causal;
  spec.mode = mode == Mode::kGrouped ? AttentionMode::kGrouped : AttentionMode::kMixture;
  spec.head_offsets = mode == Mode::kMixtureBlocked ? HeadOffsets::kBlocked : HeadOffsets::kModulo;
  return spec;
}

// The cases docs/ENGINE.md requires of every backend, and a few that reach the CPU backend's edges
// (D = 1 and 64 for vector tails; segments with more selected rows than one tile).
const std::vector<Case>& Cases() {
  static const std::vector<Case>* const cases = new std::vector<Case>{
      // H % G == 0; N = 2x the largest segment.
      {"HDivG_N2x", {1, 16, 4, 8}, {4, 8}, {1, 2}, std::nullopt},
      // H % G != 0 (5 heads in 3 groups); N = 1x the largest segment.
      {"HModG_N1x", {1, 8, 5, 8}, {2, 4, 8}, {1, 2, 4}, std::nullopt},
      // N = 3x the largest segment; H % G != 0.
      {"N3x", {1, 24, 3, 8}, {4, 8}, {1, 2}, std::nullopt},
      // N a multiple of neither segment: partial last segments.
      {"NNotMultiple", {1, 13, 4, 8}, {4, 8}, {2, 4}, std::nullopt},
      // The last segment is one position long: offsets >= 1 select nothing there.
      {"EmptyLastSelection", {1, 9, 4, 8}, {4, 8}, {2, 4}, std::nullopt},
      // Rates that divide no segment.
      {"RateNotDividing", {1, 21, 4, 5}, {5, 7}, {2, 3}, std::nullopt},
      // A segment longer than N.
      {"SegmentLongerThanN", {1, 12, 4, 8}, {4, 32}, {1, 2}, std::nullopt},
      // G = 1, r = 1: plain blockwise attention.
      {"Blockwise", {1, 18, 2, 8}, {6}, {1}, std::nullopt},
      // B > 1, with an explicit scale.
      {"Batch3", {3, 16, 4, 8}, {4, 8}, {1, 2}, 0.2},
      {"HeadDim1", {2, 12, 3, 1}, {4, 12}, {2, 3}, std::nullopt},
      {"HeadDim64", {1, 32, 2, 64}, {8, 16}, {1, 2}, std::nullopt},
      // Segments of 1200 selected rows (several query and key tiles of the CPU backend, a partial
      // last tile) next to 128-row ones; N = 1280 is no multiple of 1200.
      {"LongSegments", {1, 1280, 2, 8}, {256, 1200}, {2, 1}, std::nullopt},
  };
  return *cases;
}

const Case& FindCase(const std::string& name) {
  for (const Case& c : Cases()) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no case " << name;
  return Cases().front();
}

// Random inputs rounded to `dtype`, and the values the backend actually sees (for the oracle).
struct Inputs {
  HostTensor q, k, v, dout;
  std::vector<double> qd, kd, vd, doutd;
};

Inputs MakeInputs(const oracle::Shape& shape, DType dtype, uint64_t seed,
                  Layout layout = Layout::kContiguous) {
  const int64_t n = shape.NumElements();
  Inputs in{HostTensor::FromValues(dtype, shape.Dims(), RandomValues(n, seed, 1.5), layout),
            HostTensor::FromValues(dtype, shape.Dims(), RandomValues(n, seed + 1, 1.5), layout),
            HostTensor::FromValues(dtype, shape.Dims(), RandomValues(n, seed + 2, 1.0), layout),
            HostTensor::FromValues(dtype, shape.Dims(), RandomValues(n, seed + 3, 1.0), layout),
            {},
            {},
            {},
            {}};
  in.qd = in.q.ToDoubles();
  in.kd = in.k.ToDoubles();
  in.vd = in.v.ToDoubles();
  in.doutd = in.dout.ToDoubles();
  return in;
}

// Poisoned outputs of a forward or backward call.
struct Outputs {
  HostTensor out, lse, dq, dk, dv;
  Outputs(const oracle::Shape& shape, DType dtype)
      : out(dtype, shape.Dims()),
        lse(LseTypeFor(dtype), shape.LseDims()),
        dq(dtype, shape.Dims()),
        dk(dtype, shape.Dims()),
        dv(dtype, shape.Dims()) {}
};

ForwardArgs FwdArgs(const Inputs& in, const Outputs& o) {
  return ForwardArgs{in.q.view(), in.k.view(), in.v.view(), o.out.view(), o.lse.view()};
}

BackwardArgs BwdArgs(const Inputs& in, const Outputs& o) {
  return BackwardArgs{in.q.view(),    in.k.view(), in.v.view(), o.out.view(), o.lse.view(),
                      in.dout.view(), o.dq.view(), o.dk.view(), o.dv.view()};
}

// --- Every case against the oracle.

struct Param {
  Case c;
  Mode mode;
  DType dtype;
  bool causal;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.c.name << " " << ModeName(p.mode) << " " << DTypeName(p.dtype)
      << (p.causal ? " causal" : "");
}

class CpuBackendOracleTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const Param& p = GetParam();
    spec_ = MakeSpec(p.c, p.mode, p.causal);
    backend_ = NewCpuBackend();
  }
  AttentionSpec spec_;
  std::unique_ptr<AttentionBackend> backend_;
};

TEST_P(CpuBackendOracleTest, ForwardMatchesOracle) {
  const Param& p = GetParam();
  const uint64_t seed = testutil::CheckSeed("forward");
  SCOPED_TRACE(testutil::ReproduceHint() + "; check seed " + std::to_string(seed));
  const Inputs in = MakeInputs(p.c.shape, p.dtype, seed);
  auto ref = oracle::Forward(spec_, p.c.shape, in.qd, in.kd, in.vd);
  ASSERT_TRUE(ref.ok()) << ref.status();

  Outputs o(p.c.shape, p.dtype);
  ASSERT_EQ(backend_->Forward(spec_, FwdArgs(in, o)), absl::OkStatus());
  const double tol = testutil::SpecTolerance(p.dtype);
  EXPECT_TRUE(RelativelyNear("out", o.out.ToDoubles(), ref->out, tol));
  EXPECT_TRUE(LseNear("lse", o.lse.ToDoubles(), ref->lse, tol));
}

TEST_P(CpuBackendOracleTest, BackwardMatchesOracle) {
  const Param& p = GetParam();
  const uint64_t seed = testutil::CheckSeed("backward");
  SCOPED_TRACE(testutil::ReproduceHint() + "; check seed " + std::to_string(seed));
  const Inputs in = MakeInputs(p.c.shape, p.dtype, seed);
  auto ref = oracle::Backward(spec_, p.c.shape, in.qd, in.kd, in.vd, in.doutd);
  ASSERT_TRUE(ref.ok()) << ref.status();

  Outputs o(p.c.shape, p.dtype);
  ASSERT_EQ(backend_->Forward(spec_, FwdArgs(in, o)), absl::OkStatus());
  ASSERT_EQ(backend_->Backward(spec_, BwdArgs(in, o)), absl::OkStatus());
  const double tol = testutil::SpecTolerance(p.dtype);
  EXPECT_TRUE(RelativelyNear("dq", o.dq.ToDoubles(), ref->dq, tol));
  EXPECT_TRUE(RelativelyNear("dk", o.dk.ToDoubles(), ref->dk, tol));
  EXPECT_TRUE(RelativelyNear("dv", o.dv.ToDoubles(), ref->dv, tol));
}

std::vector<Param> AllParams() {
  std::vector<Param> params;
  for (const Case& c : Cases()) {
    for (Mode mode : {Mode::kGrouped, Mode::kMixture, Mode::kMixtureBlocked}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
        for (bool causal : {false, true}) params.push_back({c, mode, dtype, causal});
      }
    }
  }
  return params;
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return p.c.name + "_" + ModeName(p.mode) + "_" + DTypeName(p.dtype) +
         (p.causal ? "_Causal" : "_Full");
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuBackendOracleTest, ::testing::ValuesIn(AllParams()), ParamName);

// --- Strided (non-contiguous) input views give the same result as contiguous ones.

struct StridedParam {
  Mode mode;
  DType dtype;
  Layout layout;
};

void PrintTo(const StridedParam& p, std::ostream* os) {
  *os << ModeName(p.mode) << " " << DTypeName(p.dtype) << " " << testutil::LayoutName(p.layout);
}

class CpuBackendStridedTest : public ::testing::TestWithParam<StridedParam> {};

TEST_P(CpuBackendStridedTest, MatchesContiguousAndOracle) {
  const StridedParam& p = GetParam();
  const Case& c = FindCase("NNotMultiple");
  const AttentionSpec spec = MakeSpec(c, p.mode, /*causal=*/true);
  const uint64_t seed = testutil::CheckSeed("strided");
  SCOPED_TRACE(testutil::ReproduceHint() + "; check seed " + std::to_string(seed));
  const Inputs strided = MakeInputs(c.shape, p.dtype, seed, p.layout);
  const Inputs contiguous = MakeInputs(c.shape, p.dtype, seed);
  ASSERT_FALSE(strided.q.view().IsContiguous());
  ASSERT_EQ(strided.qd, contiguous.qd);
  auto ref_fwd = oracle::Forward(spec, c.shape, contiguous.qd, contiguous.kd, contiguous.vd);
  auto ref_bwd = oracle::Backward(spec, c.shape, contiguous.qd, contiguous.kd, contiguous.vd,
                                  contiguous.doutd);
  ASSERT_TRUE(ref_fwd.ok() && ref_bwd.ok());

  auto backend = NewCpuBackend();
  Outputs a(c.shape, p.dtype), b(c.shape, p.dtype);
  ASSERT_EQ(backend->Forward(spec, FwdArgs(strided, a)), absl::OkStatus());
  ASSERT_EQ(backend->Forward(spec, FwdArgs(contiguous, b)), absl::OkStatus());
  // Backward with strided q, k, v, dout, and out (an input of the backward pass) strided too.
  HostTensor strided_out =
      HostTensor::FromValues(p.dtype, c.shape.Dims(), a.out.ToDoubles(), p.layout);
  BackwardArgs args = BwdArgs(strided, a);
  args.out = strided_out.view();
  ASSERT_EQ(backend->Backward(spec, args), absl::OkStatus());
  ASSERT_EQ(backend->Backward(spec, BwdArgs(contiguous, b)), absl::OkStatus());

  const double tol = testutil::SpecTolerance(p.dtype);
  EXPECT_TRUE(RelativelyNear("out vs contiguous", a.out.ToDoubles(), b.out.ToDoubles(), tol));
  EXPECT_TRUE(LseNear("lse vs contiguous", a.lse.ToDoubles(), b.lse.ToDoubles(), tol));
  EXPECT_TRUE(RelativelyNear("dq vs contiguous", a.dq.ToDoubles(), b.dq.ToDoubles(), tol));
  EXPECT_TRUE(RelativelyNear("dk vs contiguous", a.dk.ToDoubles(), b.dk.ToDoubles(), tol));
  EXPECT_TRUE(RelativelyNear("dv vs contiguous", a.dv.ToDoubles(), b.dv.ToDoubles(), tol));
  EXPECT_TRUE(RelativelyNear("out", a.out.ToDoubles(), ref_fwd->out, tol));
  EXPECT_TRUE(LseNear("lse", a.lse.ToDoubles(), ref_fwd->lse, tol));
  EXPECT_TRUE(RelativelyNear("dq", a.dq.ToDoubles(), ref_bwd->dq, tol));
  EXPECT_TRUE(RelativelyNear("dk", a.dk.ToDoubles(), ref_bwd->dk, tol));
  EXPECT_TRUE(RelativelyNear("dv", a.dv.ToDoubles(), ref_bwd->dv, tol));
}

std::vector<StridedParam> StridedParams() {
  std::vector<StridedParam> params;
  for (Mode mode : {Mode::kGrouped, Mode::kMixture}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      for (Layout layout : {Layout::kPadded, Layout::kInterleaved, Layout::kReversed}) {
        params.push_back({mode, dtype, layout});
      }
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpuBackendStridedTest, ::testing::ValuesIn(StridedParams()),
                         [](const ::testing::TestParamInfo<StridedParam>& info) {
                           return std::string(ModeName(info.param.mode)) + "_" +
                                  DTypeName(info.param.dtype) + "_" +
                                  testutil::LayoutName(info.param.layout);
                         });

// --- Thread count does not change results: every output bit-identical between 1 and 3 threads.

TEST(CpuBackendThreadsTest, MultiThreadedRunEqualsSingleThreaded) {
  auto one = NewCpuBackend(CpuBackendOptions{1});
  auto three = NewCpuBackend(CpuBackendOptions{3});
  for (const char* name : {"Batch3", "LongSegments"}) {
    const Case& c = FindCase(name);
    for (Mode mode : {Mode::kGrouped, Mode::kMixture}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
        for (bool causal : {false, true}) {
          const AttentionSpec spec = MakeSpec(c, mode, causal);
          const uint64_t seed = testutil::CheckSeed(spec.DebugString() + c.name + DTypeName(dtype));
          SCOPED_TRACE(c.name + " " + spec.DebugString() + " " + DTypeName(dtype) + "; " +
                       testutil::ReproduceHint());
          const Inputs in = MakeInputs(c.shape, dtype, seed);
          Outputs a(c.shape, dtype), b(c.shape, dtype);
          ASSERT_EQ(one->Forward(spec, FwdArgs(in, a)), absl::OkStatus());
          ASSERT_EQ(three->Forward(spec, FwdArgs(in, b)), absl::OkStatus());
          ASSERT_EQ(one->Backward(spec, BwdArgs(in, a)), absl::OkStatus());
          ASSERT_EQ(three->Backward(spec, BwdArgs(in, b)), absl::OkStatus());
          EXPECT_TRUE(testutil::BytesEqual("out", a.out.Bytes(), b.out.Bytes()));
          EXPECT_TRUE(testutil::BytesEqual("lse", a.lse.Bytes(), b.lse.Bytes()));
          EXPECT_TRUE(testutil::BytesEqual("dq", a.dq.Bytes(), b.dq.Bytes()));
          EXPECT_TRUE(testutil::BytesEqual("dk", a.dk.Bytes(), b.dk.Bytes()));
          EXPECT_TRUE(testutil::BytesEqual("dv", a.dv.Bytes(), b.dv.Bytes()));
        }
      }
    }
  }
}

// --- NaN in an input propagates like ordinary attention and is not an error.

void PrintTo(Mode mode, std::ostream* os) { *os << ModeName(mode); }

class CpuBackendNanTest : public ::testing::TestWithParam<std::tuple<Mode, DType, bool>> {};

TEST_P(CpuBackendNanTest, NanInQueryPropagatesToItsRowOnly) {
  const auto [mode, dtype, causal] = GetParam();
  const Case& c = FindCase("Batch3");
  const oracle::Shape& s = c.shape;
  const AttentionSpec spec = MakeSpec(c, mode, causal);
  const uint64_t seed = testutil::CheckSeed("nan");
  SCOPED_TRACE(testutil::ReproduceHint());
  Inputs in = MakeInputs(s, dtype, seed);
  // Row (b=0, p=0, h=0) is selected by pattern 0 (offset 0) in both modes.
  testutil::WriteElement(in.q.view(), s.Index(0, 0, 0, 0), std::nan(""));
  in.qd = in.q.ToDoubles();
  auto ref = oracle::Forward(spec, s, in.qd, in.kd, in.vd);
  auto ref_grads = oracle::Backward(spec, s, in.qd, in.kd, in.vd, in.doutd);
  ASSERT_TRUE(ref.ok() && ref_grads.ok());

  auto backend = NewCpuBackend();
  Outputs o(s, dtype);
  ASSERT_EQ(backend->Forward(spec, FwdArgs(in, o)), absl::OkStatus());
  const std::vector<double> out = o.out.ToDoubles(), lse = o.lse.ToDoubles();
  for (int64_t d = 0; d < s.head_dim; ++d) {
    EXPECT_TRUE(std::isnan(out[s.Index(0, 0, 0, d)]))
        << "out[0, 0, 0, " << d << "] = " << out[s.Index(0, 0, 0, d)];
  }
  EXPECT_TRUE(std::isnan(lse[s.LseIndex(0, 0, 0)]))
      << "lse[0, 0, 0] = " << lse[s.LseIndex(0, 0, 0)];
  // Exactly the oracle's NaN elements are NaN (no leak into other rows); the rest match it.
  int64_t nan_mismatches = 0;
  std::vector<double> got_finite, want_finite;
  for (size_t e = 0; e < out.size(); ++e) {
    if (std::isnan(out[e]) != std::isnan(ref->out[e])) ++nan_mismatches;
    if (!std::isnan(ref->out[e])) {
      got_finite.push_back(out[e]);
      want_finite.push_back(ref->out[e]);
    }
  }
  EXPECT_EQ(nan_mismatches, 0);
  EXPECT_TRUE(RelativelyNear("out (non-NaN rows)", got_finite, want_finite,
                             testutil::SpecTolerance(dtype)));

  ASSERT_EQ(backend->Backward(spec, BwdArgs(in, o)), absl::OkStatus());
  const std::vector<double> dq = o.dq.ToDoubles();
  bool row_has_nan = false;
  for (int64_t d = 0; d < s.head_dim; ++d) row_has_nan |= std::isnan(dq[s.Index(0, 0, 0, d)]);
  EXPECT_TRUE(row_has_nan) << "dq[0, 0, 0, 0] = " << dq[s.Index(0, 0, 0, 0)];
  // Batches 1 and 2 do not see batch 0's NaN.
  const int64_t batch_elems = s.seq_len * s.num_heads * s.head_dim;
  auto later = [&](const std::vector<double>& x) {
    return std::vector<double>(x.begin() + batch_elems, x.end());
  };
  EXPECT_TRUE(
      RelativelyNear("dq (b>0)", later(dq), later(ref_grads->dq), testutil::SpecTolerance(dtype)));
  EXPECT_TRUE(RelativelyNear("dk (b>0)", later(o.dk.ToDoubles()), later(ref_grads->dk),
                             testutil::SpecTolerance(dtype)));
  EXPECT_TRUE(RelativelyNear("dv (b>0)", later(o.dv.ToDoubles()), later(ref_grads->dv),
                             testutil::SpecTolerance(dtype)));
}

INSTANTIATE_TEST_SUITE_P(All, CpuBackendNanTest,
                         ::testing::Combine(::testing::Values(Mode::kGrouped, Mode::kMixture),
                                            ::testing::Values(DType::kFloat32, DType::kFloat64),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Mode, DType, bool>>& info) {
                           return std::string(ModeName(std::get<0>(info.param))) + "_" +
                                  DTypeName(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_Causal" : "_Full");
                         });

// --- Capabilities and validation through the backend.

TEST(CpuBackendTest, Caps) {
  auto backend = NewCpuBackend();
  const BackendCaps& caps = backend->caps();
  EXPECT_EQ(caps.name, "cpu");
  EXPECT_EQ(caps.device, Device::kCpu);
  EXPECT_NE(std::find(caps.dtypes.begin(), caps.dtypes.end(), DType::kFloat32), caps.dtypes.end());
  EXPECT_NE(std::find(caps.dtypes.begin(), caps.dtypes.end(), DType::kFloat64), caps.dtypes.end());
  // The cases above use D = 1, 5, 8, 16 and 64.
  for (int64_t d : {1, 5, 8, 16, 64}) {
    EXPECT_TRUE(caps.head_dims.empty() ||
                std::find(caps.head_dims.begin(), caps.head_dims.end(), d) != caps.head_dims.end())
        << d;
  }
}

// Every tensor of a backward call (a forward call uses q, k, v, out, lse).
struct Views {
  TensorView q, k, v, out, lse, dout, dq, dk, dv;
};

// One invalid call: a spec and a way to spoil otherwise valid views.
struct BadCall {
  std::string name;
  AttentionSpec spec;
  std::function<void(Views*)> spoil;
};

std::vector<BadCall> BadCalls(const AttentionSpec& good) {
  auto with = [&](std::function<void(AttentionSpec*)> edit) {
    AttentionSpec s = good;
    edit(&s);
    return s;
  };
  auto none = [](Views*) {};
  auto all_bnhd = [](Views* v) {
    return std::vector<TensorView*>{&v->q, &v->k, &v->v, &v->out, &v->dout, &v->dq, &v->dk, &v->dv};
  };
  return {
      {"empty lists", with([](AttentionSpec* s) {
         s->segment_lengths.clear();
         s->dilation_rates.clear();
       }),
       none},
      {"unequal lists", with([](AttentionSpec* s) { s->dilation_rates.push_back(1); }), none},
      {"w < 1", with([](AttentionSpec* s) { s->segment_lengths[0] = 0; }), none},
      {"r < 1", with([](AttentionSpec* s) { s->dilation_rates[1] = 0; }), none},
      {"H < G", with([](AttentionSpec* s) {
         s->segment_lengths = {2, 4, 8, 8, 8};
         s->dilation_rates = {1, 1, 1, 1, 1};
       }),
       none},
      {"blocked in grouped mode",
       with([](AttentionSpec* s) { s->head_offsets = HeadOffsets::kBlocked; }), none},
      {"q rank 3", good,
       [](Views* v) {
         v->q.shape.pop_back();
         v->q.strides.pop_back();
       }},
      {"k shape differs", good, [](Views* v) { v->k.shape[1] -= 1; }},
      {"k dtype differs", good, [](Views* v) { v->k.dtype = DType::kFloat64; }},
      {"k on cuda", good, [](Views* v) { v->k.device = Device::kCuda; }},
      {"q null", good, [](Views* v) { v->q.data = nullptr; }},
      {"lse (B, N, H)", good,
       [](Views* v) {
         std::swap(v->lse.shape[1], v->lse.shape[2]);
         v->lse.strides = {v->lse.shape[1] * v->lse.shape[2], v->lse.shape[2], 1};
       }},
      {"lse fp64 for fp32 inputs", good, [](Views* v) { v->lse.dtype = DType::kFloat64; }},
      {"fp16 on cpu", good,
       [all_bnhd](Views* v) {
         for (TensorView* t : all_bnhd(v)) t->dtype = DType::kFloat16;
       }},
      {"N = 0", good,
       [all_bnhd](Views* v) {
         for (TensorView* t : all_bnhd(v)) t->shape[1] = 0;
         v->lse.shape[2] = 0;
       }},
      {"B = 0", good,
       [all_bnhd](Views* v) {
         for (TensorView* t : all_bnhd(v)) t->shape[0] = 0;
         v->lse.shape[0] = 0;
       }},
  };
}

TEST(CpuBackendTest, InvalidCallsReturnInvalidArgumentAndWriteNothing) {
  const Case& c = FindCase("HDivG_N2x");
  const AttentionSpec good = MakeSpec(c, Mode::kGrouped, false);
  auto backend = NewCpuBackend();
  const Inputs in = MakeInputs(c.shape, DType::kFloat32, testutil::CheckSeed("invalid"));
  for (const BadCall& bad : BadCalls(good)) {
    SCOPED_TRACE(bad.name);
    Outputs o(c.shape, DType::kFloat32);
    Views views{in.q.view(),    in.k.view(), in.v.view(), o.out.view(), o.lse.view(),
                in.dout.view(), o.dq.view(), o.dk.view(), o.dv.view()};
    // The unspoilt call is valid, so the failure below is the spoiling's.
    ASSERT_EQ(backend->Forward(good, {views.q, views.k, views.v, views.out, views.lse}),
              absl::OkStatus());
    for (HostTensor* t : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv}) t->Fill(1e30);
    const std::vector<unsigned char> out_before = o.out.Bytes(), lse_before = o.lse.Bytes(),
                                     dq_before = o.dq.Bytes(), dk_before = o.dk.Bytes(),
                                     dv_before = o.dv.Bytes();
    bad.spoil(&views);
    const absl::Status f =
        backend->Forward(bad.spec, {views.q, views.k, views.v, views.out, views.lse});
    EXPECT_EQ(f.code(), absl::StatusCode::kInvalidArgument) << f;
    const absl::Status b =
        backend->Backward(bad.spec, {views.q, views.k, views.v, views.out, views.lse, views.dout,
                                     views.dq, views.dk, views.dv});
    EXPECT_EQ(b.code(), absl::StatusCode::kInvalidArgument) << b;

    EXPECT_TRUE(testutil::BytesEqual("out", out_before, o.out.Bytes()));
    EXPECT_TRUE(testutil::BytesEqual("lse", lse_before, o.lse.Bytes()));
    EXPECT_TRUE(testutil::BytesEqual("dq", dq_before, o.dq.Bytes()));
    EXPECT_TRUE(testutil::BytesEqual("dk", dk_before, o.dk.Bytes()));
    EXPECT_TRUE(testutil::BytesEqual("dv", dv_before, o.dv.Bytes()));
  }
}

TEST(CpuBackendTest, ForwardRejectsNonContiguousOutputAndWritesNothing) {
  const Case& c = FindCase("HDivG_N2x");
  const AttentionSpec spec = MakeSpec(c, Mode::kGrouped, false);
  auto backend = NewCpuBackend();
  const Inputs in = MakeInputs(c.shape, DType::kFloat32, testutil::CheckSeed("out strided"));
  Outputs o(c.shape, DType::kFloat32);
  HostTensor out_padded(DType::kFloat32, c.shape.Dims(), Layout::kPadded);
  const std::vector<unsigned char> out_before = out_padded.Bytes(), lse_before = o.lse.Bytes();
  ForwardArgs args = FwdArgs(in, o);
  args.out = out_padded.view();
  EXPECT_EQ(backend->Forward(spec, args).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(testutil::BytesEqual("out", out_before, out_padded.Bytes()));
  EXPECT_TRUE(testutil::BytesEqual("lse", lse_before, o.lse.Bytes()));
}

TEST(CpuBackendTest, BackwardRejectsNonContiguousGradientsAndWritesNothing) {
  const Case& c = FindCase("HDivG_N2x");
  const AttentionSpec spec = MakeSpec(c, Mode::kMixture, true);
  auto backend = NewCpuBackend();
  const Inputs in = MakeInputs(c.shape, DType::kFloat64, testutil::CheckSeed("dq strided"));
  Outputs o(c.shape, DType::kFloat64);
  ASSERT_EQ(backend->Forward(spec, FwdArgs(in, o)), absl::OkStatus());
  HostTensor dq_padded(DType::kFloat64, c.shape.Dims(), Layout::kPadded);
  const std::vector<unsigned char> dq_before = dq_padded.Bytes(), dk_before = o.dk.Bytes(),
                                   dv_before = o.dv.Bytes();
  BackwardArgs args = BwdArgs(in, o);
  args.dq = dq_padded.view();
  EXPECT_EQ(backend->Backward(spec, args).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(testutil::BytesEqual("dq", dq_before, dq_padded.Bytes()));
  EXPECT_TRUE(testutil::BytesEqual("dk", dk_before, o.dk.Bytes()));
  EXPECT_TRUE(testutil::BytesEqual("dv", dv_before, o.dv.Bytes()));
}

}  // namespace
}  // namespace dattn
