// Every kernel of model_kernels.h and the GEMM wrapper (gemm.h) against a float64 reference on the
// host, computed from the same bf16-rounded inputs, on a GPU. Fresh random inputs per check
// (DATTN_TEST_SEED reproduces), outputs poisoned (0xFF bytes: NaN) before each call so that an
// unwritten element fails the comparison.
//
// Tolerances (relative Frobenius error, testutil::RelativeError): a bf16 result carries its own
// rounding, 2^-9 of each element (about 1.1e-3 rms): bound 4e-3. An fp32 result computed in fp32
// from exact inputs (statistics, the fp32 residual gradient, column sums, the loss, a GEMM with an
// fp32 result): bound 2e-5. Bit-level claims (recomputed norms, the working copy, determinism)
// are checked bit for bit.
//
// Without a GPU every test skips, saying why.
#include "model/cuda/model_kernels.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gpu_test_util.h"
#include "model/rotary.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

using testutil::BFloat16BitsToFloat;
using testutil::CheckSeed;
using testutil::FloatToBFloat16Bits;
using testutil::RelativelyNear;

constexpr double kBf16Tol = 4e-3;
constexpr double kF32Tol = 2e-5;

#define ASSERT_CUDA(expr)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

// Device memory of n elements of T, freed at scope end.
template <typename T>
class Dev {
 public:
  explicit Dev(int64_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_),
                   static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)) != cudaSuccess) {
      p_ = nullptr;
    }
  }
  Dev(const std::vector<T>& host) : Dev(static_cast<int64_t>(host.size())) { Put(host); }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  void Put(const std::vector<T>& host) {
    cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Get() const {
    std::vector<T> host(static_cast<size_t>(n_));
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), p_, host.size() * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  void Poison() { cudaMemset(p_, 0xFF, static_cast<size_t>(n_) * sizeof(T)); }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// Random bf16 values (as bits) and their exact values.
struct Bf16Values {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};
Bf16Values RandomBf16(int64_t n, uint64_t seed, double magnitude = 1.0, double offset = 0.0) {
  const std::vector<double> r = testutil::RandomValues(n, seed, magnitude);
  Bf16Values v;
  for (double x : r) {
    const uint16_t b = FloatToBFloat16Bits(static_cast<float>(x + offset));
    v.bits.push_back(b);
    v.values.push_back(BFloat16BitsToFloat(b));
  }
  return v;
}
std::vector<float> RandomF32(int64_t n, uint64_t seed, double magnitude = 1.0,
                             double offset = 0.0) {
  std::vector<float> out;
  for (double x : testutil::RandomValues(n, seed, magnitude)) {
    out.push_back(static_cast<float>(x + offset));
  }
  return out;
}
std::vector<double> FromBf16(const std::vector<uint16_t>& bits) {
  std::vector<double> v;
  for (uint16_t b : bits) v.push_back(BFloat16BitsToFloat(b));
  return v;
}
template <typename T>
std::vector<double> ToD(const std::vector<T>& x) {
  return std::vector<double>(x.begin(), x.end());
}

double Gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double GeluGrad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

class ModelKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0);
    SCOPED_TRACE(testutil::ReproduceHint());
  }
  int sms_ = 1;
};

TEST_F(ModelKernels, LayerNormForwardAndRecomputeFromStats) {
  for (int64_t n : {8, 64, 136, 768, 3072, 8192}) {
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " gelu=" << gelu);
      const int64_t rows = 37;
      const Bf16Values x = RandomBf16(rows * n, CheckSeed("x" + std::to_string(n)), 2.0, 0.3);
      const std::vector<float> gain = RandomF32(n, CheckSeed("g"), 1.0, 1.0);
      const std::vector<float> shift = RandomF32(n, CheckSeed("b"), 0.5);
      Dev<uint16_t> dx(x.bits), dy(rows * n), dy2(rows * n);
      Dev<float> dg(gain), db(shift), mean(rows), rstd(rows);
      dy.Poison();
      mean.Poison();
      rstd.Poison();
      ASSERT_CUDA(LayerNormForward(dx.get(), rows, n, dg.get(), db.get(), 1e-5f, gelu, false,
                                   dy.get(), mean.get(), rstd.get(), sms_, nullptr));
      std::vector<double> ref_y, ref_mean, ref_rstd;
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> v(static_cast<size_t>(n));
        double s = 0;
        for (int64_t i = 0; i < n; ++i) {
          v[i] = gelu ? Gelu(x.values[r * n + i]) : x.values[r * n + i];
          s += v[i];
        }
        const double mu = s / n;
        double q = 0;
        for (double e : v) q += (e - mu) * (e - mu);
        const double rs = 1.0 / std::sqrt(q / n + 1e-5);
        ref_mean.push_back(mu);
        ref_rstd.push_back(rs);
        for (int64_t i = 0; i < n; ++i) ref_y.push_back((v[i] - mu) * rs * gain[i] + shift[i]);
      }
      const std::vector<uint16_t> y = dy.Get();
      EXPECT_TRUE(RelativelyNear("y", FromBf16(y), ref_y, kBf16Tol));
      EXPECT_TRUE(RelativelyNear("mean", ToD(mean.Get()), ref_mean, kF32Tol));
      EXPECT_TRUE(RelativelyNear("rstd", ToD(rstd.Get()), ref_rstd, kF32Tol));
      // The backward pass's recomputation from the saved statistics gives the same bits.
      dy2.Poison();
      ASSERT_CUDA(LayerNormForward(dx.get(), rows, n, dg.get(), db.get(), 1e-5f, gelu, true,
                                   dy2.get(), mean.get(), rstd.get(), sms_, nullptr));
      EXPECT_EQ(dy2.Get(), y);
    }
  }
}

TEST_F(ModelKernels, LayerNormBackwardEveryOutputAndColumnSums) {
  const NormGradOut outs[] = {NormGradOut::kBf16, NormGradOut::kResidualSet,
                              NormGradOut::kResidualAdd};
  for (int64_t n : {64, 768, 3072, 8192}) {
    for (bool gelu : {false, true}) {
      for (NormGradOut out : outs) {
        for (bool bias : {false, true}) {
          SCOPED_TRACE(testing::Message() << "n=" << n << " gelu=" << gelu
                                          << " out=" << static_cast<int>(out) << " bias=" << bias);
          // More rows than groups x CTAs (4 x SMs): some CTAs add up several rows.
          const int64_t rows = n >= 3072 ? 600 : 1100;
          const Bf16Values x = RandomBf16(rows * n, CheckSeed("x"), 2.0, 0.2);
          const Bf16Values dyv = RandomBf16(rows * n, CheckSeed("dy"), 1.0);
          const std::vector<float> gain = RandomF32(n, CheckSeed("g"), 0.5, 1.0);
          // Statistics: those of the forward pass (computed here in fp64, stored in fp32).
          std::vector<float> mean(rows), rstd(rows);
          for (int64_t r = 0; r < rows; ++r) {
            double s = 0, q = 0;
            for (int64_t i = 0; i < n; ++i) {
              s += gelu ? Gelu(x.values[r * n + i]) : x.values[r * n + i];
            }
            const double mu = s / n;
            for (int64_t i = 0; i < n; ++i) {
              const double v = gelu ? Gelu(x.values[r * n + i]) : x.values[r * n + i];
              q += (v - mu) * (v - mu);
            }
            mean[r] = static_cast<float>(mu);
            rstd[r] = static_cast<float>(1.0 / std::sqrt(q / n + 1e-5));
          }
          const std::vector<float> residual0 = RandomF32(rows * n, CheckSeed("res"), 1.0);
          Dev<uint16_t> d_x(x.bits), d_dy(dyv.bits), d_out(rows * n);
          Dev<float> d_gain(gain), d_mean(mean), d_rstd(rstd), d_res(residual0);
          const RowLaunch l = RowLaunchFor(rows, n, sms_);
          Dev<float> partials(l.ctas * 3 * n);
          d_out.Poison();
          partials.Poison();
          if (out == NormGradOut::kResidualSet) d_res.Poison();
          LayerNormBackwardArgs a;
          a.dy = d_dy.get();
          a.x = d_x.get();
          a.mean = d_mean.get();
          a.rstd = d_rstd.get();
          a.gain = d_gain.get();
          a.rows = rows;
          a.n = n;
          a.gelu = gelu;
          a.out = out;
          a.out_bf16 = d_out.get();
          a.residual = d_res.get();
          a.partials = partials.get();
          a.bias_sums = bias;
          ASSERT_CUDA(LayerNormBackward(a, sms_, nullptr));
          // Column sums into gradients that already hold values (they are added to).
          const std::vector<float> g0 = RandomF32(3 * n, CheckSeed("g0"), 1.0);
          Dev<float> grads(g0);
          std::vector<ColumnSumJob> jobs;
          for (int k = 0; k < (bias ? 3 : 2); ++k) {
            ColumnSumJob j;
            j.src = partials.get() + k * n;
            j.dst = grads.get() + k * n;
            j.n = n;
            j.stride = 3 * n;
            j.ctas = l.ctas;
            jobs.push_back(j);
          }
          Dev<ColumnSumJob> d_jobs(jobs);
          ASSERT_CUDA(ColumnSums(d_jobs.get(), static_cast<int>(jobs.size()), n, nullptr));
          // Reference.
          std::vector<double> ref_out, ref_res, ref_g(g0.begin(), g0.end());
          for (int64_t r = 0; r < rows; ++r) {
            double sa = 0, sb = 0;
            std::vector<double> xh(static_cast<size_t>(n)), g(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) {
              const double xv = x.values[r * n + i];
              xh[i] = ((gelu ? Gelu(xv) : xv) - mean[r]) * static_cast<double>(rstd[r]);
              g[i] = dyv.values[r * n + i] * gain[i];
              sa += g[i];
              sb += g[i] * xh[i];
            }
            sa /= n;
            sb /= n;
            for (int64_t i = 0; i < n; ++i) {
              const double xv = x.values[r * n + i];
              double d = rstd[r] * (g[i] - sa - xh[i] * sb);
              if (gelu) d *= GeluGrad(xv);
              double written = d;
              if (out == NormGradOut::kResidualAdd) written += residual0[r * n + i];
              ref_out.push_back(written);
              ref_g[i] += dyv.values[r * n + i] * xh[i];
              ref_g[n + i] += dyv.values[r * n + i];
              if (bias) ref_g[2 * n + i] += written;
            }
          }
          EXPECT_TRUE(RelativelyNear("out bf16", FromBf16(d_out.Get()), ref_out, kBf16Tol));
          if (out != NormGradOut::kBf16) {
            EXPECT_TRUE(RelativelyNear("residual", ToD(d_res.Get()), ref_out, kF32Tol));
          }
          std::vector<double> got = ToD(grads.Get());
          if (!bias) {
            got.resize(2 * n);
            ref_g.resize(2 * n);
          }
          EXPECT_TRUE(RelativelyNear("gain/shift/bias sums", got, ref_g, kF32Tol));
        }
      }
    }
  }
}

TEST_F(ModelKernels, LayerNormBackwardInPlaceAndDeterministic) {
  const int64_t rows = 999, n = 3072;
  const Bf16Values x = RandomBf16(rows * n, CheckSeed("x"), 2.0);
  const Bf16Values dyv = RandomBf16(rows * n, CheckSeed("dy"), 1.0);
  std::vector<float> gain(n, 1.25f), mean(rows, 0.1f), rstd(rows, 0.9f);
  Dev<uint16_t> d_x(x.bits), a_dy(dyv.bits), b_dy(dyv.bits), out(rows * n);
  Dev<float> d_gain(gain), d_mean(mean), d_rstd(rstd);
  const RowLaunch l = RowLaunchFor(rows, n, sms_);
  Dev<float> p1(l.ctas * 3 * n), p2(l.ctas * 3 * n);
  LayerNormBackwardArgs a;
  a.dy = a_dy.get();
  a.x = d_x.get();
  a.mean = d_mean.get();
  a.rstd = d_rstd.get();
  a.gain = d_gain.get();
  a.rows = rows;
  a.n = n;
  a.gelu = true;
  a.out_bf16 = out.get();
  a.partials = p1.get();
  a.bias_sums = true;
  ASSERT_CUDA(LayerNormBackward(a, sms_, nullptr));
  a.dy = b_dy.get();
  a.out_bf16 = b_dy.get();  // in place, as the model runs it
  a.partials = p2.get();
  ASSERT_CUDA(LayerNormBackward(a, sms_, nullptr));
  EXPECT_EQ(out.Get(), b_dy.Get());
  EXPECT_EQ(p1.Get(), p2.Get());
}

TEST_F(ModelKernels, RotaryForwardAndTransposeAgainstThePlan) {
  for (bool xpos : {false, true}) {
    SCOPED_TRACE(testing::Message() << "xpos=" << xpos);
    LongNetConfig c;
    c.d_model = 128;
    c.num_heads = 4;  // head_dim 32
    c.segment_lengths = {16, 48};
    c.dilation_rates = {1, 2};
    c.rope_theta = 100;
    c.xpos = xpos;
    c.xpos_scale_base = 64;
    const int64_t batch = 2, seq = 70, offset = 33, total = 200, d = 128, dh = 32;
    absl::StatusOr<RotaryPlan> plan = RotaryPlan::Make(c, total);
    ASSERT_TRUE(plan.ok());
    RotaryConsts rc;
    rc.pairs = dh / 2;
    rc.block = plan->block();
    rc.xpos = xpos;
    for (int j = 0; j < rc.pairs; ++j) {
      rc.inv_freq[j] = plan->inv_freq()[j];
      rc.log2_zeta_over_base[j] = plan->log_zeta()[j] / plan->scale_base() / std::log(2.0);
    }
    Dev<RotaryConsts> d_rc(1);
    ASSERT_CUDA(cudaMemcpy(d_rc.get(), &rc, sizeof(rc), cudaMemcpyHostToDevice));
    const int64_t rows = batch * seq;
    const Bf16Values qkv = RandomBf16(rows * 3 * d, CheckSeed("qkv"), 1.0);
    Dev<uint16_t> d_qkv(qkv.bits);
    ASSERT_CUDA(
        RotaryForward(d_qkv.get(), rows, 3 * d, seq, offset, d, dh, d_rc.get(), sms_, nullptr));
    const std::vector<uint16_t> got = d_qkv.Get();
    std::vector<double> ref(qkv.values), cs(dh / 2), sn(dh / 2), qs(dh / 2), ks(dh / 2);
    for (int64_t r = 0; r < rows; ++r) {
      plan->Factors(offset + r % seq, cs.data(), sn.data(), qs.data(), ks.data());
      for (int which = 0; which < 2; ++which) {
        for (int64_t h = 0; h < d / dh; ++h) {
          for (int64_t j = 0; j < dh / 2; ++j) {
            const int64_t at = r * 3 * d + which * d + h * dh + 2 * j;
            const double s = which == 0 ? qs[j] : ks[j];
            const double x0 = qkv.values[at], x1 = qkv.values[at + 1];
            ref[at] = s * (x0 * cs[j] - x1 * sn[j]);
            ref[at + 1] = s * (x1 * cs[j] + x0 * sn[j]);
          }
        }
      }
    }
    EXPECT_TRUE(RelativelyNear("rotated qkv", FromBf16(got), ref, kBf16Tol));
    // v untouched, bit for bit.
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 2 * d; i < 3 * d; ++i)
        ASSERT_EQ(got[r * 3 * d + i], qkv.bits[r * 3 * d + i]);
    }
    // The transpose, out of place, with the column sums of the three parts.
    const Bf16Values dq = RandomBf16(rows * d, CheckSeed("dq")),
                     dk = RandomBf16(rows * d, CheckSeed("dk")),
                     dv = RandomBf16(rows * d, CheckSeed("dv"));
    Dev<uint16_t> d_dq(dq.bits), d_dk(dk.bits), d_dv(dv.bits), d_out(rows * 3 * d);
    const RowLaunch l = RowLaunchFor(rows, d, sms_);
    Dev<float> partials(l.ctas * 3 * d);
    d_out.Poison();
    partials.Poison();
    ASSERT_CUDA(RotaryBackward(d_dq.get(), d_dk.get(), d_dv.get(), rows, seq, offset, d, dh,
                               d_rc.get(), d_out.get(), partials.get(), sms_, nullptr));
    std::vector<double> ref_out(static_cast<size_t>(rows * 3 * d)), ref_sum(3 * d, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      plan->Factors(offset + r % seq, cs.data(), sn.data(), qs.data(), ks.data());
      for (int which = 0; which < 3; ++which) {
        const std::vector<double>& src = which == 0   ? dq.values
                                         : which == 1 ? dk.values
                                                      : dv.values;
        for (int64_t h = 0; h < d / dh; ++h) {
          for (int64_t j = 0; j < dh / 2; ++j) {
            const int64_t in = r * d + h * dh + 2 * j, out = r * 3 * d + which * d + h * dh + 2 * j;
            const double y0 = src[in], y1 = src[in + 1];
            double o0 = y0, o1 = y1;
            if (which < 2) {
              const double s = which == 0 ? qs[j] : ks[j];
              o0 = s * (y0 * cs[j] + y1 * sn[j]);
              o1 = s * (y1 * cs[j] - y0 * sn[j]);
            }
            ref_out[out] = o0;
            ref_out[out + 1] = o1;
            ref_sum[which * d + h * dh + 2 * j] += o0;
            ref_sum[which * d + h * dh + 2 * j + 1] += o1;
          }
        }
      }
    }
    EXPECT_TRUE(RelativelyNear("dqkv", FromBf16(d_out.Get()), ref_out, kBf16Tol));
    Dev<float> sums(std::vector<float>(3 * d, 0.0f));
    ColumnSumJob j;
    j.src = partials.get();
    j.dst = sums.get();
    j.n = 3 * d;  // the three groups are one row of 3d per CTA
    j.stride = 3 * d;
    j.ctas = l.ctas;
    Dev<ColumnSumJob> d_job(std::vector<ColumnSumJob>{j});
    ASSERT_CUDA(ColumnSums(d_job.get(), 1, 3 * d, nullptr));
    EXPECT_TRUE(RelativelyNear("bias sums", ToD(sums.Get()), ref_sum, 1e-4));
  }
}

TEST_F(ModelKernels, CrossEntropyForwardAndBackward) {
  for (int64_t v : {256, 1000, 7}) {
    SCOPED_TRACE(testing::Message() << "v=" << v);
    const int64_t m = 3001;
    const std::vector<float> logits = RandomF32(m * v, CheckSeed("l"), 6.0);
    testutil::Random rng(CheckSeed("t"));
    std::vector<int32_t> targets(m);
    for (int64_t t = 0; t < m; ++t) {
      targets[t] = rng.Uniform() < 0.1 ? -1 : static_cast<int32_t>(rng.Next() % v);
    }
    Dev<float> d_logits(logits), lse(m);
    Dev<int32_t> d_targets(targets);
    Dev<double> partials(CrossEntropyPartials(m)), loss(1);
    Dev<uint16_t> dlogits(m * v);
    lse.Poison();
    dlogits.Poison();
    ASSERT_CUDA(CrossEntropyForward(d_logits.get(), d_targets.get(), m, v, lse.get(),
                                    partials.get(), loss.get(), nullptr));
    const float scale = 0.37f;
    ASSERT_CUDA(CrossEntropyBackward(d_logits.get(), lse.get(), d_targets.get(), m, v, scale,
                                     dlogits.get(), nullptr));
    std::vector<double> ref_lse, ref_d;
    double ref_loss = 0;
    for (int64_t t = 0; t < m; ++t) {
      double mx = -1e300, s = 0;
      for (int64_t i = 0; i < v; ++i) mx = std::max(mx, static_cast<double>(logits[t * v + i]));
      for (int64_t i = 0; i < v; ++i) s += std::exp(logits[t * v + i] - mx);
      const double l = mx + std::log(s);
      ref_lse.push_back(l);
      if (targets[t] >= 0) ref_loss += l - logits[t * v + targets[t]];
      for (int64_t i = 0; i < v; ++i) {
        ref_d.push_back(targets[t] < 0 ? 0.0
                                       : scale * (std::exp(logits[t * v + i] - l) -
                                                  (i == targets[t] ? 1.0 : 0.0)));
      }
    }
    EXPECT_TRUE(RelativelyNear("lse", ToD(lse.Get()), ref_lse, kF32Tol));
    EXPECT_TRUE(RelativelyNear("loss", loss.Get(), {ref_loss}, kF32Tol));
    EXPECT_TRUE(RelativelyNear("dlogits", FromBf16(dlogits.Get()), ref_d, kBf16Tol));
  }
}

TEST_F(ModelKernels, EmbeddingForwardAndBackward) {
  const int64_t vocab = 50, d = 72, m = 5000;
  testutil::Random rng(CheckSeed("tokens"));
  std::vector<int32_t> tokens(m);
  for (int64_t t = 0; t < m; ++t) {
    // Skewed: id 3 takes about half the positions (several items of 256), some ids none.
    tokens[t] = rng.Uniform() < 0.5 ? 3 : static_cast<int32_t>(rng.Next() % (vocab - 10));
  }
  const Bf16Values table = RandomBf16(vocab * d, CheckSeed("table"));
  Dev<int32_t> d_tokens(tokens);
  Dev<uint16_t> d_table(table.bits), out(m * d);
  out.Poison();
  ASSERT_CUDA(EmbeddingForward(d_tokens.get(), m, d_table.get(), d, out.get(), nullptr));
  const std::vector<uint16_t> got = out.Get();
  for (int64_t t = 0; t < m; ++t) {
    ASSERT_EQ(0, std::memcmp(&got[t * d], &table.bits[tokens[t] * d], d * 2)) << t;
  }
  // Backward: the model's host sort, then the two kernels.
  std::vector<int64_t> count(vocab + 1, 0);
  for (int32_t id : tokens) ++count[id + 1];
  for (int64_t i = 0; i < vocab; ++i) count[i + 1] += count[i];
  std::vector<int64_t> order(m), next(count.begin(), count.end() - 1);
  for (int64_t t = 0; t < m; ++t) order[next[tokens[t]]++] = t;
  std::vector<EmbeddingItem> items;
  std::vector<int64_t> token_items(vocab + 1);
  for (int64_t id = 0; id < vocab; ++id) {
    token_items[id] = static_cast<int64_t>(items.size());
    for (int64_t at = count[id]; at < count[id + 1]; at += kEmbeddingItemRows) {
      items.push_back({at, static_cast<int32_t>(std::min(kEmbeddingItemRows, count[id + 1] - at)),
                       static_cast<int32_t>(id)});
    }
  }
  token_items[vocab] = static_cast<int64_t>(items.size());
  const std::vector<float> dx = RandomF32(m * d, CheckSeed("dx"));
  const std::vector<float> dtable0 = RandomF32(vocab * d, CheckSeed("dtable"));
  Dev<int64_t> d_order(order), d_token_items(token_items);
  Dev<EmbeddingItem> d_items(items);
  Dev<float> d_dx(dx), partial(static_cast<int64_t>(items.size()) * d), dtable(dtable0);
  ASSERT_CUDA(EmbeddingBackward(d_order.get(), d_items.get(), static_cast<int64_t>(items.size()),
                                d_token_items.get(), vocab, d_dx.get(), d, partial.get(),
                                dtable.get(), nullptr));
  std::vector<double> ref(dtable0.begin(), dtable0.end());
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t i = 0; i < d; ++i) ref[tokens[t] * d + i] += dx[t * d + i];
  }
  EXPECT_TRUE(RelativelyNear("dtable", ToD(dtable.Get()), ref, kF32Tol));
}

TEST_F(ModelKernels, CastPackIsRoundToNearestEvenIntoTheSegments) {
  const std::vector<float> master = RandomF32(1000, CheckSeed("master"), 3.0);
  const std::vector<PackSegment> segments = {{0, 0, 64}, {512, 128, 16}, {200, 256, 256}};
  Dev<float> d_master(master);
  Dev<PackSegment> d_segments(segments);
  Dev<uint16_t> packed(512);
  packed.Poison();
  ASSERT_CUDA(CastPackParams(d_master.get(), d_segments.get(), 3, 512, packed.get(), nullptr));
  const std::vector<uint16_t> got = packed.Get();
  for (const PackSegment& s : segments) {
    for (int64_t i = 0; i < s.n; ++i) {
      ASSERT_EQ(got[s.dst + i], FloatToBFloat16Bits(master[s.src + i])) << s.dst + i;
    }
  }
  EXPECT_EQ(got[64], 0xFFFF);  // a gap stays untouched
}

TEST_F(ModelKernels, SumOfSquaresInFp64) {
  const std::vector<float> x = RandomF32(1234567, CheckSeed("x"), 2.0);
  Dev<float> d_x(x);
  Dev<double> partials(SumOfSquaresPartials()), out(1);
  ASSERT_CUDA(SumOfSquares(d_x.get(), 1234567, partials.get(), out.get(), nullptr));
  double ref = 0;
  for (float v : x) ref += static_cast<double>(v) * v;
  EXPECT_TRUE(RelativelyNear("sum of squares", out.Get(), {ref}, 1e-12));
}

// The GEMM wrapper: each op against fp64, with bias, residual and accumulation.
TEST_F(ModelKernels, GemmEveryOpAgainstFp64) {
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreate(&stream));
  absl::StatusOr<std::unique_ptr<Gemm>> gemm = Gemm::Create(stream, 32 << 20);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int64_t rows = 300, cols = 136, k = 200;
  for (GemmOp op : {GemmOp::kNT, GemmOp::kNN, GemmOp::kTN}) {
    for (int variant = 0; variant < 3; ++variant) {  // 0 plain bf16, 1 bias+residual, 2 fp32 +=
      if (variant == 1 && op != GemmOp::kNT) continue;
      SCOPED_TRACE(testing::Message() << "op=" << static_cast<int>(op) << " variant=" << variant);
      // Row-major operands as stored: A [rows, k] (kTN: [k, rows]), B [cols, k] (kNT) or [k, cols].
      const int64_t a_r = op == GemmOp::kTN ? k : rows, a_c = op == GemmOp::kTN ? rows : k;
      const int64_t b_r = op == GemmOp::kNT ? cols : k, b_c = op == GemmOp::kNT ? k : cols;
      const Bf16Values a = RandomBf16(a_r * a_c, CheckSeed("a"));
      const Bf16Values b = RandomBf16(b_r * b_c, CheckSeed("b"));
      const Bf16Values bias = RandomBf16(cols, CheckSeed("bias"));
      const Bf16Values res = RandomBf16(rows * cols, CheckSeed("res"));
      const std::vector<float> acc0 = RandomF32(rows * cols, CheckSeed("acc"));
      Dev<uint16_t> d_a(a.bits), d_b(b.bits), d_bias(bias.bits), d_res(res.bits), c16(rows * cols);
      Dev<float> c32(acc0);
      c16.Poison();
      GemmArgs g;
      g.op = op;
      g.rows = rows, g.cols = cols, g.k = k;
      g.a = d_a.get(), g.lda = a_c;
      g.b = d_b.get(), g.ldb = b_c;
      g.ldc = cols;
      if (variant == 2) {
        g.c = c32.get();
        g.c_fp32 = true;
        g.beta = 1.0f;
        g.alpha = 0.5f;
      } else {
        g.c = c16.get();
      }
      if (variant == 1) {
        g.bias = d_bias.get();
        g.residual = d_res.get();
        g.beta = 1.0f;
      }
      absl::Status s = (*gemm)->Run(g);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<double> ref(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          double sum = 0;
          for (int64_t i = 0; i < k; ++i) {
            const double av = op == GemmOp::kTN ? a.values[i * rows + r] : a.values[r * k + i];
            const double bv = op == GemmOp::kNT ? b.values[c * k + i] : b.values[i * cols + c];
            sum += av * bv;
          }
          if (variant == 1) sum += bias.values[c] + res.values[r * cols + c];
          if (variant == 2) sum = acc0[r * cols + c] + 0.5 * sum;
          ref[r * cols + c] = sum;
        }
      }
      if (variant == 2) {
        EXPECT_TRUE(RelativelyNear("C fp32", ToD(c32.Get()), ref, kF32Tol));
      } else {
        EXPECT_TRUE(RelativelyNear("C bf16", FromBf16(c16.Get()), ref, kBf16Tol));
      }
    }
  }
  gemm->reset();
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace cuda
}  // namespace model
}  // namespace dattn
