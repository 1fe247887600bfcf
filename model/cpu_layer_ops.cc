#include "model/cpu_layer_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {
namespace {

// Rows per BLAS call: m may pass INT_MAX; BLAS takes int.
constexpr int64_t kMaxGemmRows = int64_t{1} << 30;

// C := alpha op(A) op(B) + beta C, row-major, on the BLAS of T.
void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
}
void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
}

template <typename T>
class CpuLayerOps final : public LayerOps<T> {
 public:
  explicit CpuLayerOps(const CpuLayerOpsOptions& options)
      : num_threads_(options.num_threads > 0
                         ? options.num_threads
                         : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {}

  Device device() const override { return Device::kCpu; }
  DType dtype() const override {
    return std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64;
  }

  absl::StatusOr<DeviceArray<T>> Allocate(int64_t n) override {
    if (n < 1 || n > INT64_MAX / static_cast<int64_t>(sizeof(T)) - 64) {
      return absl::InvalidArgumentError(absl::StrCat("Allocate: ", n, " elements"));
    }
    const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0 || p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("CPU model memory: could not allocate ", bytes, " bytes"));
    }
    return DeviceArray<T>(static_cast<T*>(p), n, [](T* q) { std::free(q); });
  }

  absl::Status Fill(T* x, int64_t n, double value) override {
    std::fill(x, x + n, static_cast<T>(value));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const T* x, int64_t n, T* host) override {
    std::memcpy(host, x, static_cast<size_t>(n) * sizeof(T));
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(const T* host, int64_t n, T* x) override {
    std::memcpy(x, host, static_cast<size_t>(n) * sizeof(T));
    return absl::OkStatus();
  }

  absl::Status EmbeddingForward(const int32_t* tokens, int64_t m, const T* table, int64_t d,
                                T* out) override {
    for (int64_t t = 0; t < m; ++t) {
      std::memcpy(out + t * d, table + static_cast<int64_t>(tokens[t]) * d,
                  static_cast<size_t>(d) * sizeof(T));
    }
    return absl::OkStatus();
  }

  absl::Status EmbeddingBackward(const int32_t* tokens, int64_t m, const T* dout, int64_t d,
                                 T* dtable) override {
    for (int64_t t = 0; t < m; ++t) {
      T* row = dtable + static_cast<int64_t>(tokens[t]) * d;
      const T* g = dout + t * d;
      for (int64_t i = 0; i < d; ++i) row[i] += g[i];
    }
    return absl::OkStatus();
  }

  absl::Status LinearForward(const T* x, int64_t m, int64_t in, const T* w, const T* b, int64_t out,
                             T* y) override {
    UseBlasThreads();
    for (int64_t r0 = 0; r0 < m; r0 += kMaxGemmRows) {
      const int64_t rows = std::min(kMaxGemmRows, m - r0);
      T* yc = y + r0 * out;
      if (b != nullptr) {
        for (int64_t t = 0; t < rows; ++t) std::memcpy(yc + t * out, b, out * sizeof(T));
      }
      Gemm(CblasNoTrans, CblasTrans, rows, out, in, T{1}, x + r0 * in, in, w, in,
           b != nullptr ? T{1} : T{0}, yc, out);
    }
    return absl::OkStatus();
  }

  absl::Status LinearBackwardInput(const T* dy, int64_t m, int64_t out, const T* w, int64_t in,
                                   T* dx, Accumulate mode) override {
    UseBlasThreads();
    for (int64_t r0 = 0; r0 < m; r0 += kMaxGemmRows) {
      const int64_t rows = std::min(kMaxGemmRows, m - r0);
      Gemm(CblasNoTrans, CblasNoTrans, rows, in, out, T{1}, dy + r0 * out, out, w, in,
           mode == Accumulate::kAdd ? T{1} : T{0}, dx + r0 * in, in);
    }
    return absl::OkStatus();
  }

  absl::Status LinearBackwardParams(const T* dy, const T* x, int64_t m, int64_t in, int64_t out,
                                    T* dw, T* db) override {
    UseBlasThreads();
    for (int64_t r0 = 0; r0 < m; r0 += kMaxGemmRows) {
      const int64_t rows = std::min(kMaxGemmRows, m - r0);
      Gemm(CblasTrans, CblasNoTrans, out, in, rows, T{1}, dy + r0 * out, out, x + r0 * in, in, T{1},
           dw, in);
    }
    if (db != nullptr) {
      std::vector<double> sum(static_cast<size_t>(out), 0.0);
      for (int64_t t = 0; t < m; ++t) {
        const T* g = dy + t * out;
        for (int64_t i = 0; i < out; ++i) sum[i] += static_cast<double>(g[i]);
      }
      for (int64_t i = 0; i < out; ++i) db[i] = static_cast<T>(static_cast<double>(db[i]) + sum[i]);
    }
    return absl::OkStatus();
  }

  absl::Status LayerNormForward(const T* x, int64_t m, int64_t n, const T* gain, const T* shift,
                                double eps, T* y, T* mean, T* rstd) override {
    const double inv_n = 1.0 / static_cast<double>(n);
    for (int64_t t = 0; t < m; ++t) {
      const T* xr = x + t * n;
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += xr[i];
      const double mu = s * inv_n;
      double v = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double c = xr[i] - mu;
        v += c * c;
      }
      // The rounded statistics are what the backward pass reads: use them here too.
      mean[t] = static_cast<T>(mu);
      rstd[t] = static_cast<T>(1.0 / std::sqrt(v * inv_n + eps));
      const double mu_t = mean[t], rs_t = rstd[t];
      T* yr = y + t * n;
      for (int64_t i = 0; i < n; ++i) {
        yr[i] = static_cast<T>((xr[i] - mu_t) * rs_t * static_cast<double>(gain[i]) +
                               static_cast<double>(shift[i]));
      }
    }
    return absl::OkStatus();
  }

  absl::Status LayerNormBackward(const T* dy, const T* x, const T* mean, const T* rstd,
                                 const T* gain, int64_t m, int64_t n, T* dx, Accumulate mode,
                                 T* dgain, T* dshift) override {
    const double inv_n = 1.0 / static_cast<double>(n);
    std::vector<double> dg(static_cast<size_t>(n), 0.0), ds(static_cast<size_t>(n), 0.0);
    for (int64_t t = 0; t < m; ++t) {
      const T* xr = x + t * n;
      const T* gr = dy + t * n;
      const double mu = mean[t], rs = rstd[t];
      double a = 0, b = 0;  // mean(g), mean(g x_hat), g = dy * gain.
      for (int64_t i = 0; i < n; ++i) {
        const double xh = (xr[i] - mu) * rs;
        const double g = static_cast<double>(gr[i]) * static_cast<double>(gain[i]);
        a += g;
        b += g * xh;
        dg[i] += static_cast<double>(gr[i]) * xh;
        ds[i] += static_cast<double>(gr[i]);
      }
      a *= inv_n;
      b *= inv_n;
      T* dxr = dx + t * n;
      for (int64_t i = 0; i < n; ++i) {
        const double xh = (xr[i] - mu) * rs;
        const double g = static_cast<double>(gr[i]) * static_cast<double>(gain[i]);
        const double d = rs * (g - a - xh * b);
        dxr[i] = static_cast<T>(mode == Accumulate::kAdd ? static_cast<double>(dxr[i]) + d : d);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      dgain[i] = static_cast<T>(static_cast<double>(dgain[i]) + dg[i]);
      dshift[i] = static_cast<T>(static_cast<double>(dshift[i]) + ds[i]);
    }
    return absl::OkStatus();
  }

  absl::Status GeluForward(const T* x, int64_t n, T* y) override {
    const T k = static_cast<T>(0.70710678118654752440084436210485);  // 1/sqrt(2)
    for (int64_t i = 0; i < n; ++i) y[i] = T{0.5} * x[i] * (T{1} + std::erf(x[i] * k));
    return absl::OkStatus();
  }

  absl::Status GeluBackward(const T* x, const T* dy, int64_t n, T* dx) override {
    const T k = static_cast<T>(0.70710678118654752440084436210485);  // 1/sqrt(2)
    const T c = static_cast<T>(0.39894228040143267793994605993438);  // 1/sqrt(2 pi)
    for (int64_t i = 0; i < n; ++i) {
      const T cdf = T{0.5} * (T{1} + std::erf(x[i] * k));
      const T pdf = c * std::exp(T{-0.5} * x[i] * x[i]);
      dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
    return absl::OkStatus();
  }

  absl::Status Add(const T* a, const T* b, int64_t n, T* y) override {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
    return absl::OkStatus();
  }

  absl::Status RotaryForward(const RotaryPlan& plan, int64_t batch, int64_t seq_len, int64_t heads,
                             int64_t position_offset, T* q, T* k) override {
    Rotate(plan, batch, seq_len, heads, position_offset, q, k, /*transpose=*/false);
    return absl::OkStatus();
  }
  absl::Status RotaryBackward(const RotaryPlan& plan, int64_t batch, int64_t seq_len, int64_t heads,
                              int64_t position_offset, T* dq, T* dk) override {
    Rotate(plan, batch, seq_len, heads, position_offset, dq, dk, /*transpose=*/true);
    return absl::OkStatus();
  }

  absl::Status CrossEntropyForward(const T* logits, const int32_t* targets, int64_t m, int64_t v,
                                   T* row_lse, double* loss_sum, int64_t* count) override {
    double sum = 0;
    int64_t counted = 0;
    for (int64_t t = 0; t < m; ++t) {
      const T* l = logits + t * v;
      double mx = l[0];
      for (int64_t i = 1; i < v; ++i) mx = std::max(mx, static_cast<double>(l[i]));
      double s = 0;
      for (int64_t i = 0; i < v; ++i) s += std::exp(static_cast<double>(l[i]) - mx);
      const double lse = mx + std::log(s);
      row_lse[t] = static_cast<T>(lse);
      if (targets[t] != kIgnoreTarget) {
        sum += lse - static_cast<double>(l[targets[t]]);
        ++counted;
      }
    }
    *loss_sum = sum;
    *count = counted;
    return absl::OkStatus();
  }

  absl::Status CrossEntropyBackward(const T* logits, const T* row_lse, const int32_t* targets,
                                    int64_t m, int64_t v, double scale, T* dlogits) override {
    const T s = static_cast<T>(scale);
    for (int64_t t = 0; t < m; ++t) {
      T* d = dlogits + t * v;
      if (targets[t] == kIgnoreTarget) {
        std::fill(d, d + v, T{0});
        continue;
      }
      const T* l = logits + t * v;
      const T lse = row_lse[t];
      for (int64_t i = 0; i < v; ++i) d[i] = s * std::exp(l[i] - lse);
      d[targets[t]] -= s;
    }
    return absl::OkStatus();
  }

 private:
  void UseBlasThreads() {
    if (openblas_get_num_threads() != num_threads_) openblas_set_num_threads(num_threads_);
  }

  // Forward: x' = s R(angle) x per pair; transpose: dx = s R(-angle) dy (R is orthogonal, s a
  // scalar per pair). q takes q_scale, k takes k_scale.
  void Rotate(const RotaryPlan& plan, int64_t batch, int64_t seq_len, int64_t heads,
              int64_t position_offset, T* q, T* k, bool transpose) {
    const int64_t d = plan.head_dim();
    const int64_t pairs = d / 2;
    std::vector<double> cos(pairs), sin(pairs), qs(pairs), ks(pairs);
    const double sign = transpose ? -1.0 : 1.0;
    for (int64_t t = 0; t < seq_len; ++t) {
      plan.Factors(position_offset + t, cos.data(), sin.data(), qs.data(), ks.data());
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t row = (b * seq_len + t) * heads * d;
        for (int which = 0; which < 2; ++which) {
          T* x = (which == 0 ? q : k) + row;
          const double* scale = which == 0 ? qs.data() : ks.data();
          for (int64_t h = 0; h < heads; ++h) {
            T* xh = x + h * d;
            for (int64_t j = 0; j < pairs; ++j) {
              const double x0 = xh[2 * j], x1 = xh[2 * j + 1];
              const double c = cos[j], s = sign * sin[j];
              xh[2 * j] = static_cast<T>(scale[j] * (x0 * c - x1 * s));
              xh[2 * j + 1] = static_cast<T>(scale[j] * (x1 * c + x0 * s));
            }
          }
        }
      }
    }
  }

  const int num_threads_;
};

}  // namespace

template <typename T>
std::unique_ptr<LayerOps<T>> NewCpuLayerOps(const CpuLayerOpsOptions& options) {
  return std::make_unique<CpuLayerOps<T>>(options);
}

template std::unique_ptr<LayerOps<float>> NewCpuLayerOps<float>(const CpuLayerOpsOptions&);
template std::unique_ptr<LayerOps<double>> NewCpuLayerOps<double>(const CpuLayerOpsOptions&);

}  // namespace model
}  // namespace dattn
