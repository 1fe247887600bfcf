// CudaAdamW on a GPU: against a float64 reference of the update (relative error <= 1e-6 over a
// few steps: only fp32 roundings), bit for bit against an fp32 host loop written in the documented
// order (the kernel rounds every operation once and fuses none), ranges (a split update equals one
// update; elements outside the range are untouched), shards owning their own moments equal the
// whole, the per-entry decay mask, the fp64 sum of squares, and the errors. Without a GPU every
// test skips, saying why.
#include "model/cuda/cuda_adamw.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/cuda/gpu_test_util.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

using testutil::CheckSeed;
using testutil::RelativelyNear;

LongNetConfig Small() {
  LongNetConfig c;
  c.vocab_size = 40;
  c.d_model = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.ffn_dim = 136;
  c.segment_lengths = {16, 32};
  c.dilation_rates = {1, 2};
  return c;
}

class CudaAdamWTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    absl::StatusOr<ParamLayout> layout = BuildParamLayout(Small());
    ASSERT_TRUE(layout.ok());
    layout_ = *layout;
    n_ = layout_.total();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&g_), n_ * 4), cudaSuccess);
  }
  void TearDown() override {
    if (p_ != nullptr) cudaFree(p_);
    if (g_ != nullptr) cudaFree(g_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::vector<float> Random(const std::string& label, double magnitude, double offset = 0) {
    std::vector<float> v;
    for (double x : testutil::RandomValues(n_, CheckSeed(label), magnitude)) {
      v.push_back(static_cast<float>(x + offset));
    }
    return v;
  }
  void Put(float* dst, const std::vector<float>& src) {
    ASSERT_EQ(cudaMemcpy(dst, src.data(), n_ * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> Get(const float* src) {
    std::vector<float> v(static_cast<size_t>(n_));
    cudaDeviceSynchronize();
    EXPECT_EQ(cudaMemcpy(v.data(), src, n_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

  ParamLayout layout_;
  int64_t n_ = 0;
  cudaStream_t stream_ = nullptr;
  float* p_ = nullptr;
  float* g_ = nullptr;
};

TEST_F(CudaAdamWTest, MatchesFp64ReferenceAndFp32LoopBitForBit) {
  AdamWOptions o;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.epsilon = 1e-8;
  o.weight_decay = 0.1;
  absl::StatusOr<std::unique_ptr<CudaAdamW>> opt = CudaAdamW::Create(layout_, o, stream_);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = Random("p", 0.5), m = Random("m", 0.01), v = Random("v", 1e-4, 2e-4);
  for (float& x : v) x = std::fabs(x);
  Put(p_, p);
  ASSERT_TRUE((*opt)->CopyMomentsFromHost(m.data(), v.data()).ok());
  std::vector<double> p64(p.begin(), p.end()), m64(m.begin(), m.end()), v64(v.begin(), v.end());
  std::vector<float> p32 = p, m32 = m, v32 = v;
  const double lrs[] = {3e-4, 1e-3, 2e-4};
  const double scales[] = {1.0, 0.5, 0.8};
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = Random("g" + std::to_string(step), 0.1);
    Put(g_, g);
    (*opt)->set_step(step);
    ASSERT_TRUE((*opt)->Step(lrs[step], scales[step], p_, g_).ok());
    EXPECT_EQ((*opt)->step(), step + 1);
    const double t = step + 1, lr = lrs[step];
    // fp64 reference.
    for (int64_t i = 0; i < n_; ++i) {
      const double gi = static_cast<double>(g[i]) * scales[step];
      double w = p64[i];
      if ((*opt)->Decays(i)) w *= 1.0 - lr * o.weight_decay;
      m64[i] = o.beta1 * m64[i] + (1 - o.beta1) * gi;
      v64[i] = o.beta2 * v64[i] + (1 - o.beta2) * gi * gi;
      const double denom = std::sqrt(v64[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.epsilon;
      p64[i] = w - lr / (1 - std::pow(o.beta1, t)) * (m64[i] / denom);
    }
    // The fp32 loop of model/optimizer.h's order (this file has no FMA: plain x86-64 SSE).
    const float decay_keep = static_cast<float>(1.0 - lr * o.weight_decay);
    const float step_size = static_cast<float>(lr / (1.0 - std::pow(o.beta1, t)));
    const float bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, t)));
    const float b1 = static_cast<float>(o.beta1), omb1 = static_cast<float>(1.0 - o.beta1);
    const float b2 = static_cast<float>(o.beta2), omb2 = static_cast<float>(1.0 - o.beta2);
    const float eps = static_cast<float>(o.epsilon), gs = static_cast<float>(scales[step]);
    for (int64_t i = 0; i < n_; ++i) {
      const float gi = g[i] * gs;
      float w = p32[i];
      if ((*opt)->Decays(i)) w = w * decay_keep;
      const float mi = b1 * m32[i] + omb1 * gi;
      const float vi = b2 * v32[i] + omb2 * (gi * gi);
      m32[i] = mi;
      v32[i] = vi;
      const float denom = std::sqrt(vi) / bc2 + eps;
      p32[i] = w - step_size * (mi / denom);
    }
  }
  const std::vector<float> got = Get(p_);
  std::vector<float> gm(static_cast<size_t>(n_)), gv(static_cast<size_t>(n_));
  ASSERT_TRUE((*opt)->CopyMomentsToHost(gm.data(), gv.data()).ok());
  EXPECT_TRUE(RelativelyNear("p vs fp64", std::vector<double>(got.begin(), got.end()), p64, 1e-6));
  EXPECT_TRUE(RelativelyNear("m vs fp64", std::vector<double>(gm.begin(), gm.end()), m64, 1e-6));
  EXPECT_TRUE(RelativelyNear("v vs fp64", std::vector<double>(gv.begin(), gv.end()), v64, 1e-6));
  int64_t differ = 0;
  for (int64_t i = 0; i < n_; ++i) {
    differ += (got[i] != p32[i] || gm[i] != m32[i] || gv[i] != v32[i]) ? 1 : 0;
  }
  EXPECT_EQ(differ, 0) << "elements differing from the fp32 loop";
}

TEST_F(CudaAdamWTest, DecayMaskIsPerEntry) {
  absl::StatusOr<std::unique_ptr<CudaAdamW>> def = CudaAdamW::Create(layout_, {}, stream_);
  ASSERT_TRUE(def.ok());
  for (const ParamEntry& e : layout_.entries()) {
    EXPECT_EQ((*def)->Decays(e.offset), WantsWeightDecay(e)) << e.name;
    EXPECT_EQ((*def)->Decays(e.offset + e.numel - 1), WantsWeightDecay(e)) << e.name;
  }
  absl::StatusOr<std::unique_ptr<CudaAdamW>> custom = CudaAdamW::Create(
      layout_, {}, stream_,
      [](const ParamEntry& e) { return e.name.find("fc1") != std::string::npos; });
  ASSERT_TRUE(custom.ok());
  for (const ParamEntry& e : layout_.entries()) {
    EXPECT_EQ((*custom)->Decays(e.offset), e.name.find("fc1") != std::string::npos) << e.name;
  }
  // Only decaying elements move when the gradient is zero and the moments are zero.
  AdamWOptions o;
  o.weight_decay = 0.5;
  absl::StatusOr<std::unique_ptr<CudaAdamW>> opt = CudaAdamW::Create(layout_, o, stream_);
  ASSERT_TRUE(opt.ok());
  const std::vector<float> p = Random("p", 1.0);
  Put(p_, p);
  ASSERT_EQ(cudaMemset(g_, 0, n_ * 4), cudaSuccess);
  ASSERT_TRUE((*opt)->Step(0.1, 1.0, p_, g_).ok());
  const std::vector<float> got = Get(p_);
  for (int64_t i = 0; i < n_; ++i) {
    const float want = (*opt)->Decays(i) ? p[i] * static_cast<float>(1.0 - 0.1 * 0.5) : p[i];
    ASSERT_EQ(got[i], want) << i;
  }
}

TEST_F(CudaAdamWTest, RangesSplitAndUntouched) {
  absl::StatusOr<std::unique_ptr<CudaAdamW>> a = CudaAdamW::Create(layout_, {}, stream_);
  absl::StatusOr<std::unique_ptr<CudaAdamW>> b = CudaAdamW::Create(layout_, {}, stream_);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<float> p = Random("p", 1.0), g = Random("g", 0.1);
  float* p2 = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p2), n_ * 4), cudaSuccess);
  Put(p_, p);
  Put(p2, p);
  Put(g_, g);
  ASSERT_TRUE((*a)->Update(1, 1e-3, 1.0, 0, n_, p_, g_).ok());
  const int64_t cut1 = n_ / 3 + 1, cut2 = 2 * n_ / 3 + 5;
  ASSERT_TRUE((*b)->Update(1, 1e-3, 1.0, cut1, cut2, p2, g_).ok());
  const std::vector<float> partial = Get(p2);
  for (int64_t i = 0; i < n_; ++i) {
    if (i < cut1 || i >= cut2) {
      ASSERT_EQ(partial[i], p[i]) << i;
    }
  }
  ASSERT_TRUE((*b)->Update(1, 1e-3, 1.0, 0, cut1, p2, g_).ok());
  ASSERT_TRUE((*b)->Update(1, 1e-3, 1.0, cut2, n_, p2, g_).ok());
  EXPECT_EQ(Get(p_), Get(p2));
  cudaFree(p2);
}

// Two shards (ZeRO-1 ranks), each owning only its own moments, equal one optimizer over the whole
// layout bit for bit, over three steps; each refuses ranges outside itself.
TEST_F(CudaAdamWTest, ShardsEqualTheWhole) {
  const int64_t cut = n_ / 2 + 3;
  absl::StatusOr<std::unique_ptr<CudaAdamW>> whole = CudaAdamW::Create(layout_, {}, stream_);
  absl::StatusOr<std::unique_ptr<CudaAdamW>> lo =
      CudaAdamW::CreateShard(layout_, {}, stream_, nullptr, 0, cut);
  absl::StatusOr<std::unique_ptr<CudaAdamW>> hi =
      CudaAdamW::CreateShard(layout_, {}, stream_, nullptr, cut, n_);
  ASSERT_TRUE(whole.ok() && lo.ok() && hi.ok());
  EXPECT_EQ((*hi)->begin(), cut);
  EXPECT_EQ((*hi)->end(), n_);
  EXPECT_EQ((*hi)->total(), n_);
  EXPECT_LT((*lo)->device_bytes(), (*whole)->device_bytes());
  float* p2 = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p2), n_ * 4), cudaSuccess);
  const std::vector<float> p = Random("p", 1.0);
  Put(p_, p);
  Put(p2, p);
  for (int step = 1; step <= 3; ++step) {
    Put(g_, Random("g" + std::to_string(step), 0.1));
    ASSERT_TRUE((*whole)->Step(1e-3, 0.5, p_, g_).ok());
    ASSERT_TRUE((*lo)->Step(1e-3, 0.5, p2, g_).ok());
    ASSERT_TRUE((*hi)->Step(1e-3, 0.5, p2, g_).ok());
  }
  EXPECT_EQ(Get(p_), Get(p2));
  std::vector<float> m(static_cast<size_t>(n_)), v(m.size());
  ASSERT_TRUE((*whole)->CopyMomentsToHost(m.data(), v.data()).ok());
  std::vector<float> m_hi(static_cast<size_t>(n_ - cut)), v_hi(m_hi.size());
  ASSERT_TRUE((*hi)->CopyMomentsToHost(m_hi.data(), v_hi.data()).ok());
  for (int64_t i = cut; i < n_; ++i) {
    ASSERT_EQ(m[i], m_hi[i - cut]) << i;
    ASSERT_EQ(v[i], v_hi[i - cut]) << i;
  }
  EXPECT_EQ((*lo)->Update(1, 1e-3, 1.0, cut - 1, cut + 1, p2, g_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*hi)->Update(1, 1e-3, 1.0, 0, 1, p2, g_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaAdamW::CreateShard(layout_, {}, stream_, nullptr, 5, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaAdamW::CreateShard(layout_, {}, stream_, nullptr, 0, n_ + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  cudaFree(p2);
}

TEST_F(CudaAdamWTest, SumOfSquaresAndErrors) {
  absl::StatusOr<std::unique_ptr<CudaAdamW>> opt = CudaAdamW::Create(layout_, {}, stream_);
  ASSERT_TRUE(opt.ok());
  const std::vector<float> g = Random("g", 3.0);
  Put(g_, g);
  double ref = 0;
  for (int64_t i = 10; i < n_ - 7; ++i) ref += static_cast<double>(g[i]) * g[i];
  absl::StatusOr<double> s = (*opt)->SumOfSquares(g_, 10, n_ - 7);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(*s, ref, 1e-12 * ref);
  EXPECT_EQ((*opt)->Update(0, 1e-3, 1.0, 0, n_, p_, g_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->Update(1, -1.0, 1.0, 0, n_, p_, g_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->Update(1, 1e-3, 0.0, 0, n_, p_, g_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->Update(1, 1e-3, 1.0, 5, n_ + 1, p_, g_).code(),
            absl::StatusCode::kInvalidArgument);
  AdamWOptions bad;
  bad.beta1 = 1.0;
  EXPECT_EQ(CudaAdamW::Create(layout_, bad, stream_).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.epsilon = 0;
  EXPECT_EQ(CudaAdamW::Create(layout_, bad, stream_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cuda
}  // namespace model
}  // namespace dattn
