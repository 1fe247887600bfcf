// The layer math of the LongNet language model on one device, for one compute type T: the seam
// between "layer math" (this interface, one implementation per device) and "model wiring"
// (longnet.h, written once against this interface and SequenceAttention).
//
// Implementations: NewCpuLayerOps<float|double> (cpu_layer_ops.h: OpenBLAS GEMMs, fp32 and fp64).
// A CUDA implementation (cuBLASLt GEMMs, fused kernels) implements the same methods on device
// pointers; the model code does not change.
//
// Conventions for every method:
//   - Pointers of type T* / const T* are device memory of this ops' device (from Allocate, or the
//     model's parameter and gradient buffers). Token ids and targets (int32) are host arrays; a
//     device implementation copies them itself.
//   - Matrices are row-major; m is a number of rows (tokens: batch x positions) and may exceed
//     2^31; widths (in, out, n, d, v) fit in int (the config guarantees it).
//   - A linear layer's weight is [out, in] and computes y = x W^T + b (torch.nn.Linear).
//   - "Accumulate" outputs are added to; others are overwritten in full. Gradients of parameters
//     are always accumulated (the model zeroes them when asked to).
//   - Arguments are not validated here: the model validates tokens, targets and shapes once, at its
//     API. Errors returned are the device's (a failed allocation: RESOURCE_EXHAUSTED naming the
//     bytes; a CUDA error naming the call).
//   - Each method states its FLOPs (multiply-add = 2) and the bytes it moves in the best case
//     (each operand read or written once), in elements times sizeof(T) = s.
// Thread-safety: one call at a time per instance.
#ifndef DATTN_MODEL_LAYER_OPS_H_
#define DATTN_MODEL_LAYER_OPS_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"
#include "model/ignore_target.h"
#include "model/rotary.h"

namespace dattn {
namespace model {

// Owned device memory of n elements, freed by its destructor through the deleter of the ops that
// allocated it (which must outlive the array). Move-only.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(T* data, int64_t size, std::function<void(T*)> deleter)
      : data_(data), size_(size), deleter_(std::move(deleter)) {}
  DeviceArray(DeviceArray&& other) noexcept { *this = std::move(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      deleter_ = std::move(other.deleter_);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { Reset(); }

  T* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void Reset() {
    if (data_ != nullptr && deleter_) deleter_(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  int64_t size_ = 0;
  std::function<void(T*)> deleter_;
};

enum class Accumulate { kOverwrite, kAdd };

template <typename T>
class LayerOps {
 public:
  virtual ~LayerOps() = default;

  virtual Device device() const = 0;
  // kFloat32 or kFloat64: T.
  virtual DType dtype() const = 0;

  // --- Memory.
  // n >= 1 elements, uninitialised. RESOURCE_EXHAUSTED naming the bytes if it cannot.
  virtual absl::StatusOr<DeviceArray<T>> Allocate(int64_t n) = 0;
  // x[0..n) := value (rounded to T; NaN allowed: the model's poisoning). Bytes: n s.
  virtual absl::Status Fill(T* x, int64_t n, double value) = 0;
  // Copies between this device and the host. Bytes: 2 n s.
  virtual absl::Status CopyToHost(const T* x, int64_t n, T* host) = 0;
  virtual absl::Status CopyFromHost(const T* host, int64_t n, T* x) = 0;

  // --- Token embedding. table [v, d].
  // out[t, :] := table[tokens[t], :], t < m. FLOPs 0; bytes 2 m d s.
  virtual absl::Status EmbeddingForward(const int32_t* tokens, int64_t m, const T* table, int64_t d,
                                        T* out) = 0;
  // dtable[tokens[t], :] += dout[t, :] (rows added in order of t). FLOPs m d; bytes 3 m d s.
  virtual absl::Status EmbeddingBackward(const int32_t* tokens, int64_t m, const T* dout, int64_t d,
                                         T* dtable) = 0;

  // --- Linear layer: x [m, in], w [out, in], b [out] (null: no bias), y [m, out].
  // y := x w^T + b. FLOPs 2 m in out; bytes (m in + in out + m out) s.
  virtual absl::Status LinearForward(const T* x, int64_t m, int64_t in, const T* w, const T* b,
                                     int64_t out, T* y) = 0;
  // dx (:= or +=) dy w. FLOPs 2 m in out; bytes (m out + in out + m in (x2 when adding)) s.
  virtual absl::Status LinearBackwardInput(const T* dy, int64_t m, int64_t out, const T* w,
                                           int64_t in, T* dx, Accumulate mode) = 0;
  // dw += dy^T x; db += column sums of dy (db null: no bias). FLOPs 2 m in out + m out;
  // bytes (m out + m in + 2 in out) s.
  virtual absl::Status LinearBackwardParams(const T* dy, const T* x, int64_t m, int64_t in,
                                            int64_t out, T* dw, T* db) = 0;

  // --- LayerNorm over rows of n: y = (x - mean) * rstd * gain + shift, rstd = 1/sqrt(var + eps),
  // var the biased variance. mean, rstd [m] are saved for the backward pass.
  // FLOPs about 8 m n; bytes (2 m n + 2 n + 2 m) s.
  virtual absl::Status LayerNormForward(const T* x, int64_t m, int64_t n, const T* gain,
                                        const T* shift, double eps, T* y, T* mean, T* rstd) = 0;
  // dx (:= or +=) the input gradient; dgain += sum_t dy x_hat, dshift += sum_t dy.
  // FLOPs about 12 m n; bytes (3 m n (4 when adding) + 3 n + 2 m) s.
  virtual absl::Status LayerNormBackward(const T* dy, const T* x, const T* mean, const T* rstd,
                                         const T* gain, int64_t m, int64_t n, T* dx,
                                         Accumulate mode, T* dgain, T* dshift) = 0;

  // --- GELU, erf form: y = x/2 (1 + erf(x / sqrt 2)) (torch's F.gelu default; not the tanh
  // approximation). About 20 FLOPs per element (erf); bytes 2 n s.
  virtual absl::Status GeluForward(const T* x, int64_t n, T* y) = 0;
  // dx := dy (Phi(x) + x phi(x)). About 30 FLOPs per element; bytes 3 n s.
  virtual absl::Status GeluBackward(const T* x, const T* dy, int64_t n, T* dx) = 0;

  // --- y := a + b (y may be a or b). FLOPs n; bytes 3 n s.
  virtual absl::Status Add(const T* a, const T* b, int64_t n, T* y) = 0;

  // --- Rotary positions with XPOS (rotary.h), in place on q and k [batch, seq_len, heads, D]
  // (contiguous) whose row t of a sequence sits at absolute position position_offset + t.
  // FLOPs 12 (batch seq_len heads D/2) + 4 sincos/exp per (position, pair); bytes 4 x elements s.
  virtual absl::Status RotaryForward(const RotaryPlan& plan, int64_t batch, int64_t seq_len,
                                     int64_t heads, int64_t position_offset, T* q, T* k) = 0;
  // The transpose: dq, dk (gradients of the rotated q, k) := gradients of q, k, in place. Same
  // FLOPs and bytes.
  virtual absl::Status RotaryBackward(const RotaryPlan& plan, int64_t batch, int64_t seq_len,
                                      int64_t heads, int64_t position_offset, T* dq, T* dk) = 0;

  // --- Softmax cross-entropy over rows of v logits. Rows whose target is kIgnoreTarget take no
  // part. row_lse[t] := log sum exp logits[t, :] (every row); *loss_sum := sum over counted rows of
  // row_lse - logits[t, target]; *count := counted rows. Sums in fp64, in row order.
  // FLOPs about 3 m v (+ m v exp); bytes (m v + 2 m) s.
  virtual absl::Status CrossEntropyForward(const T* logits, const int32_t* targets, int64_t m,
                                           int64_t v, T* row_lse, double* loss_sum,
                                           int64_t* count) = 0;
  // dlogits := scale (softmax(logits) - onehot(target)) on counted rows, 0 on the others.
  // FLOPs about 3 m v (+ m v exp); bytes (2 m v + m) s.
  virtual absl::Status CrossEntropyBackward(const T* logits, const T* row_lse,
                                            const int32_t* targets, int64_t m, int64_t v,
                                            double scale, T* dlogits) = 0;
};

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_LAYER_OPS_H_
