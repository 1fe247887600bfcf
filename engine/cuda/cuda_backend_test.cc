// The CUDA backend against the float64 oracle (docs/ENGINE.md), on a GPU.
//
// Every case of docs/ENGINE.md's list, both modes, forward and backward, fp32 / fp16 / bf16, fresh
// random inputs per check (DATTN_TEST_SEED reproduces), outputs poisoned with NaN before each call.
// Also: strided inputs (cuDNN reads them in place, or the fallback kernel does), the head dims
// cuDNN takes, errors, one context per thread, no device synchronisation inside a call, and the
// memory planner against the workspace pool's high-water mark.
//
// Without a GPU every test skips with the reason (cudaGetDeviceCount's answer).
#include "engine/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/attention_spec.h"
#include "engine/cuda/cuda_memory_plan.h"
#include "engine/testing/oracle.h"
#include "engine/testing/test_util.h"
#include "gtest/gtest.h"

namespace dattn {
namespace {

using testutil::HostTensor;
using testutil::Layout;

#define ASSERT_CUDA(expr) \
  ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(expr)

// Device memory holding a copy of a host tensor's whole storage (gaps included), or fresh memory.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A tensor on the device: its buffer and a view with the host tensor's strides.
struct DeviceTensor {
  std::unique_ptr<DeviceBuffer> buffer;
  TensorView view;
};

DeviceTensor Upload(const HostTensor& host) {
  const std::vector<unsigned char> bytes = host.Bytes();
  DeviceTensor t;
  t.buffer = std::make_unique<DeviceBuffer>(bytes.size());
  if (t.buffer->get() != nullptr) {
    cudaMemcpy(t.buffer->get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice);
  }
  t.view = host.view();
  t.view.data = t.buffer->get();
  t.view.device = Device::kCuda;
  t.view.device_index = 0;
  return t;
}

// A contiguous device tensor whose every byte is 0xFF: NaN in fp16, bf16 and fp32.
DeviceTensor Poisoned(DType dtype, std::vector<int64_t> shape) {
  DeviceTensor t;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  t.buffer = std::make_unique<DeviceBuffer>(static_cast<size_t>(n) * DTypeSize(dtype) + 16);
  if (t.buffer->get() != nullptr) cudaMemset(t.buffer->get(), 0xFF, t.buffer->bytes());
  cudaDeviceSynchronize();
  t.view = TensorView::Contiguous(t.buffer->get(), dtype, std::move(shape), Device::kCuda, 0);
  return t;
}

std::vector<double> Download(const DeviceTensor& t) {
  HostTensor host(t.view.dtype, t.view.shape);
  int64_t n = 1;
  for (int64_t d : t.view.shape) n *= d;
  cudaMemcpy(host.view().data, t.view.data, static_cast<size_t>(n) * DTypeSize(t.view.dtype),
             cudaMemcpyDeviceToHost);
  return host.ToDoubles();
}

AttentionSpec MakeSpec(std::vector<int64_t> w, std::vector<int64_t> r, AttentionMode mode,
                       bool causal, HeadOffsets offsets = HeadOffsets::kModulo) {
  AttentionSpec spec;
  spec.segment_lengths = std::move(w);
  spec.dilation_rates = std::move(r);
  spec.mode = mode;
  spec.causal = causal;
  spec.head_offsets = offsets;
  return spec;
}

// One backend shared by the tests of a suite: creating a backend (cuDNN handle) and building plans
// is slow. Base: the gtest fixture base; Options::Make() the backend's options.
template <typename Base, typename Options>
class SharedBackendTest : public Base {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> made = NewCudaBackend(Options::Make());
    if (made.ok()) {
      backend_ = made->release();
    } else {
      skip_reason_ = std::string(made.status().message());
    }
  }
  static void TearDownTestSuite() {
    delete backend_;
    backend_ = nullptr;
  }
  void SetUp() override {
    if (backend_ == nullptr) GTEST_SKIP() << skip_reason_;
  }

  static CudaAttentionBackend* backend_;
  static std::string skip_reason_;
};

template <typename Base, typename Options>
CudaAttentionBackend* SharedBackendTest<Base, Options>::backend_ = nullptr;
template <typename Base, typename Options>
std::string SharedBackendTest<Base, Options>::skip_reason_;

struct DefaultOptions {
  static CudaBackendOptions Make() { return {}; }
};
using CudaBackendTest = SharedBackendTest<::testing::Test, DefaultOptions>;

struct Inputs {
  HostTensor q, k, v, dout;
};

Inputs MakeInputs(const oracle::Shape& shape, DType dtype, Layout layout) {
  const std::vector<int64_t> dims = shape.Dims();
  const int64_t n = shape.NumElements();
  return Inputs{HostTensor::FromValues(dtype, dims,
                                       testutil::RandomValues(n, testutil::CheckSeed("q")), layout),
                HostTensor::FromValues(dtype, dims,
                                       testutil::RandomValues(n, testutil::CheckSeed("k")), layout),
                HostTensor::FromValues(dtype, dims,
                                       testutil::RandomValues(n, testutil::CheckSeed("v")), layout),
                HostTensor::FromValues(
                    dtype, dims, testutil::RandomValues(n, testutil::CheckSeed("dout")), layout)};
}

// Forward (and backward) of `backend` on fresh inputs against the oracle.
void CheckAgainstOracle(CudaAttentionBackend* backend, const AttentionSpec& spec,
                        const oracle::Shape& shape, DType dtype, bool backward,
                        Layout layout = Layout::kContiguous) {
  SCOPED_TRACE(testutil::ReproduceHint());
  SCOPED_TRACE(spec.DebugString() + " B=" + std::to_string(shape.batch) +
               " N=" + std::to_string(shape.seq_len) + " H=" + std::to_string(shape.num_heads) +
               " D=" + std::to_string(shape.head_dim) + " " + DTypeName(dtype) + " " +
               testutil::LayoutName(layout));
  const Inputs in = MakeInputs(shape, dtype, layout);
  DeviceTensor q = Upload(in.q), k = Upload(in.k), v = Upload(in.v), dout = Upload(in.dout);
  DeviceTensor out = Poisoned(dtype, shape.Dims());
  DeviceTensor lse = Poisoned(DType::kFloat32, shape.LseDims());
  ForwardArgs fa{q.view, k.view, v.view, out.view, lse.view};
  absl::Status status = backend->Forward(spec, fa);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(backend->Synchronize().ok());

  const std::vector<double> qd = in.q.ToDoubles(), kd = in.k.ToDoubles(), vd = in.v.ToDoubles();
  absl::StatusOr<oracle::ForwardResult> ref = oracle::Forward(spec, shape, qd, kd, vd);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_TRUE(
      testutil::RelativelyNear("out", Download(out), ref->out, testutil::SpecTolerance(dtype)));
  EXPECT_TRUE(testutil::LseNear("lse", Download(lse), ref->lse, testutil::GpuLseTolerance(dtype)));
  if (!backward) return;

  DeviceTensor dq = Poisoned(dtype, shape.Dims()), dk = Poisoned(dtype, shape.Dims()),
               dv = Poisoned(dtype, shape.Dims());
  BackwardArgs ba{q.view, k.view, v.view, out.view, lse.view, dout.view, dq.view, dk.view, dv.view};
  status = backend->Backward(spec, ba);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(backend->Synchronize().ok());
  absl::StatusOr<oracle::Gradients> grads =
      oracle::Backward(spec, shape, qd, kd, vd, in.dout.ToDoubles());
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_TRUE(
      testutil::RelativelyNear("dq", Download(dq), grads->dq, testutil::SpecTolerance(dtype)));
  EXPECT_TRUE(
      testutil::RelativelyNear("dk", Download(dk), grads->dk, testutil::SpecTolerance(dtype)));
  EXPECT_TRUE(
      testutil::RelativelyNear("dv", Download(dv), grads->dv, testutil::SpecTolerance(dtype)));
}

// docs/ENGINE.md "Cases every backend must pass", at sizes the oracle handles quickly.
struct SpecCase {
  const char* name;
  std::vector<int64_t> w, r;
  oracle::Shape shape;  // B, N, H, D
};

const std::vector<SpecCase>& SpecCases() {
  static const std::vector<SpecCase>* cases = new std::vector<SpecCase>{
      {"heads_divisible_n1x", {32, 64, 128}, {1, 2, 4}, {1, 128, 6, 64}},
      {"heads_not_divisible_n2x", {32, 64, 128}, {1, 2, 4}, {1, 256, 5, 64}},
      {"n3x_batch2", {32, 64, 128}, {1, 2, 4}, {2, 384, 3, 64}},
      {"n_not_multiple", {32, 64, 128}, {1, 2, 4}, {2, 200, 4, 64}},
      {"rate_divides_no_segment", {30, 50}, {4, 3}, {1, 150, 4, 64}},
      {"segment_longer_than_n", {16, 512}, {1, 2}, {2, 100, 2, 64}},
      {"blockwise_g1_r1", {64}, {1}, {2, 192, 2, 64}},
  };
  return *cases;
}

using MatrixParam = std::tuple<DType, AttentionMode, int /*case*/, bool /*causal*/>;

class CudaOracleMatrixTest : public CudaBackendTest,
                             public ::testing::WithParamInterface<MatrixParam> {};

TEST_P(CudaOracleMatrixTest, ForwardAndBackwardMatchOracle) {
  const auto [dtype, mode, index, causal] = GetParam();
  const SpecCase& c = SpecCases()[index];
  CheckAgainstOracle(backend_, MakeSpec(c.w, c.r, mode, causal), c.shape, dtype,
                     /*backward=*/true);
}

std::string MatrixName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [dtype, mode, index, causal] = info.param;
  return std::string(DTypeName(dtype)) + "_" + AttentionModeName(mode) + "_" +
         SpecCases()[index].name + (causal ? "_causal" : "");
}

INSTANTIATE_TEST_SUITE_P(
    EngineSpecCases, CudaOracleMatrixTest,
    ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16, DType::kFloat32),
                       ::testing::Values(AttentionMode::kGrouped, AttentionMode::kMixture),
                       ::testing::Range(0, 7), ::testing::Bool()),
    MatrixName);

// Our own Hopper kernels (ForwardKernel::kOwnHopper, BackwardKernel::kOwnHopper) on every case of
// docs/ENGINE.md, plus blocks of several 128-row tiles (full and partial, causal across tiles),
// D = 128, and a D they do not take (96: those calls run on cuDNN, with the 1/G as a pass per
// call).
const std::vector<SpecCase>& OwnHopperCases() {
  static const std::vector<SpecCase>* cases = [] {
    auto* v = new std::vector<SpecCase>(SpecCases());
    v->push_back({"several_tiles_d128", {512, 1024}, {1, 3}, {1, 2048, 4, 128}});
    v->push_back({"partial_tiles_batch2", {384, 200}, {1, 1}, {2, 700, 2, 64}});
    v->push_back({"unsupported_d96", {32, 64}, {1, 2}, {1, 128, 4, 96}});
    // Patterns 1 and 2 select nothing in the one-row partial segment (offsets 1 and 2): their
    // zeros come from the fill pass instead of the kernel.
    v->push_back({"empty_partial_selection", {64, 128, 128}, {1, 2, 4}, {1, 257, 3, 64}});
    return v;
  }();
  return *cases;
}

struct OwnHopperOptions {
  static CudaBackendOptions Make() {
    CudaBackendOptions options;
    options.forward_kernel = CudaBackendOptions::ForwardKernel::kOwnHopper;
    options.backward_kernel = CudaBackendOptions::BackwardKernel::kOwnHopper;
    return options;
  }
};
using OwnHopperKernelTest =
    SharedBackendTest<::testing::TestWithParam<MatrixParam>, OwnHopperOptions>;

TEST_P(OwnHopperKernelTest, ForwardAndBackwardMatchOracle) {
  const auto [dtype, mode, index, causal] = GetParam();
  const SpecCase& c = OwnHopperCases()[index];
  const CudaBackendStats before = backend_->stats();
  CheckAgainstOracle(backend_, MakeSpec(c.w, c.r, mode, causal), c.shape, dtype,
                     /*backward=*/true);
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const bool takes = major == 9 && (c.shape.head_dim == 64 || c.shape.head_dim == 128);
  const CudaBackendStats after = backend_->stats();
  EXPECT_EQ(after.own_hopper_calls > before.own_hopper_calls, takes);
  EXPECT_EQ(after.own_hopper_backward_calls > before.own_hopper_backward_calls, takes);
}

std::string OwnHopperName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [dtype, mode, index, causal] = info.param;
  return std::string(DTypeName(dtype)) + "_" + AttentionModeName(mode) + "_" +
         OwnHopperCases()[index].name + (causal ? "_causal" : "");
}

INSTANTIATE_TEST_SUITE_P(
    EngineSpecCases, OwnHopperKernelTest,
    ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                       ::testing::Values(AttentionMode::kGrouped, AttentionMode::kMixture),
                       ::testing::Range(0, static_cast<int>(OwnHopperCases().size())),
                       ::testing::Bool()),
    OwnHopperName);

// The default (ForwardKernel::kAuto) runs grouped forwards on our own Hopper kernel (on a compute
// capability 9.0 device) and mixture ones on cuDNN.
TEST_F(CudaBackendTest, DefaultPicksOurForwardKernelInBothModes) {
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    for (bool causal : {false, true}) {
      const CudaBackendStats before = backend_->stats();
      CheckAgainstOracle(backend_, MakeSpec({64, 128}, {1, 2}, mode, causal), {1, 256, 4, 64},
                         DType::kBFloat16, /*backward=*/false);
      const CudaBackendStats after = backend_->stats();
      const bool own = major == 9 && minor == 0;
      EXPECT_EQ(after.own_hopper_calls > before.own_hopper_calls, own)
          << AttentionModeName(mode) << (causal ? " causal" : "");
      EXPECT_EQ(after.cudnn_calls > before.cudnn_calls, !own)
          << AttentionModeName(mode) << (causal ? " causal" : "");
    }
  }
}

// Mixture mode on our Hopper forward: every pattern after the first is merged into out and lse in
// the kernel's epilogue, so the forward needs 4 bytes of scratch per row of a call (its lse), not
// a tile of D elements per row, and the calls are not cut to fit tiles. Rows the first pattern does
// not reach (rate 2 leaves every other row of a segment to the later patterns, with offsets
// spread over the heads) start at lse = -inf and must take the later patterns' values alone,
// whatever the poisoned output held there.
TEST_F(CudaBackendTest, MixtureMergesInOurKernelsEpilogue) {
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  if (major != 9 || minor != 0) GTEST_SKIP() << "our Hopper kernels run on compute capability 9.0";
  const oracle::Shape shape{2, 1024, 4, 128};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (bool causal : {false, true}) {
      const CudaBackendStats before = backend_->stats();
      CheckAgainstOracle(backend_,
                         MakeSpec({256, 512, 1024}, {2, 4, 8}, AttentionMode::kMixture, causal),
                         shape, dtype, /*backward=*/true);
      const CudaBackendStats after = backend_->stats();
      EXPECT_GT(after.own_hopper_calls, before.own_hopper_calls);
      EXPECT_GT(after.own_hopper_backward_calls, before.own_hopper_backward_calls);
      EXPECT_EQ(after.cudnn_calls, before.cudnn_calls) << "no call fell back";
      EXPECT_EQ(after.kernel_calls, before.kernel_calls) << "no call fell back";
    }
  }
  // The forward's scratch: the lse of one call at most (4 bytes per row and head), no tile; the
  // planner says so too.
  const AttentionSpec spec = MakeSpec({256, 512, 1024}, {2, 4, 8}, AttentionMode::kMixture, false);
  CheckAgainstOracle(backend_, spec, shape, DType::kBFloat16, /*backward=*/false);
  const int64_t rows = shape.batch * shape.seq_len * shape.num_heads;
  const int64_t smallest_tile = rows / 8 * shape.head_dim * 2;  // the r = 8 pattern's rows
  EXPECT_LE(backend_->stats().last_workspace_bytes, rows * 4);
  EXPECT_LT(backend_->stats().last_workspace_bytes, smallest_tile);
  absl::StatusOr<cuda::CudaMemoryPlan> plan = cuda::PlanCudaMemory(
      spec, shape.batch, shape.seq_len, shape.num_heads, shape.head_dim, DType::kBFloat16, false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workspace_bytes, backend_->stats().last_workspace_bytes);
}

// Calls on two streams (overlap_calls, the default) against one stream: our kernels are
// deterministic, so any race between the streams (a shared item counter or scratch slot, a missing
// join, a mixture pattern added before the previous one is complete) shows as a difference in a
// single bit of out, lse, dq, dk or dv. Four patterns (in mixture mode with head offsets: 15 calls
// in 4 rounds of merges), grouped mode with the zero rows written by the kernels, causal or not.
TEST_F(CudaBackendTest, OverlappedCallsMatchOneStreamBitForBit) {
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  if (major != 9 || minor != 0) GTEST_SKIP() << "our Hopper kernels run on compute capability 9.0";
  CudaBackendOptions one_stream;
  one_stream.overlap_calls = false;
  absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> serial = NewCudaBackend(one_stream);
  ASSERT_TRUE(serial.ok()) << serial.status();
  for (int64_t d : {64, 128}) {
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      for (bool causal : {false, true}) {
        SCOPED_TRACE("D=" + std::to_string(d) + " " + AttentionModeName(mode) +
                     (causal ? " causal" : ""));
        const oracle::Shape shape{2, 4096, 8, d};
        const AttentionSpec spec = MakeSpec({512, 1024, 2048, 4096}, {1, 2, 4, 8}, mode, causal);
        const Inputs in = MakeInputs(shape, DType::kBFloat16, Layout::kContiguous);
        DeviceTensor q = Upload(in.q), k = Upload(in.k), v = Upload(in.v), dout = Upload(in.dout);
        std::vector<std::vector<double>> results[2];
        for (int run = 0; run < 2; ++run) {
          CudaAttentionBackend* backend = run == 0 ? backend_ : serial->get();
          const CudaBackendStats before = backend->stats();
          DeviceTensor out = Poisoned(DType::kBFloat16, shape.Dims());
          DeviceTensor lse = Poisoned(DType::kFloat32, shape.LseDims());
          DeviceTensor dq = Poisoned(DType::kBFloat16, shape.Dims()),
                       dk = Poisoned(DType::kBFloat16, shape.Dims()),
                       dv = Poisoned(DType::kBFloat16, shape.Dims());
          ASSERT_TRUE(backend->Forward(spec, {q.view, k.view, v.view, out.view, lse.view}).ok());
          ASSERT_TRUE(backend
                          ->Backward(spec, {q.view, k.view, v.view, out.view, lse.view, dout.view,
                                            dq.view, dk.view, dv.view})
                          .ok());
          ASSERT_TRUE(backend->Synchronize().ok());
          const CudaBackendStats after = backend->stats();
          EXPECT_EQ(after.second_stream_calls > before.second_stream_calls, run == 0);
          EXPECT_EQ(after.cudnn_calls, before.cudnn_calls) << "every call on our kernels";
          for (const DeviceTensor* t : {&out, &lse, &dq, &dk, &dv})
            results[run].push_back(Download(*t));
        }
        const char* names[] = {"out", "lse", "dq", "dk", "dv"};
        for (int i = 0; i < 5; ++i) {
          const std::vector<double>& a = results[0][i];
          const std::vector<double>& b = results[1][i];
          ASSERT_EQ(a.size(), b.size());
          int64_t differ = 0;
          for (size_t j = 0; j < a.size(); ++j) {
            // NaN (poison left behind) differs from everything, itself included.
            if (!(a[j] == b[j])) ++differ;
          }
          EXPECT_EQ(differ, 0) << names[i] << ": " << differ << " of " << a.size() << " differ";
        }
      }
    }
  }
}

// cuDNN's backward (BackwardKernel::kCudnn, and its forward) on every case of docs/ENGINE.md: the
// path of devices other than compute capability 9.0, of D other than 64 and 128, and of views
// our kernels cannot read.
struct CudnnOptions {
  static CudaBackendOptions Make() {
    CudaBackendOptions options;
    options.forward_kernel = CudaBackendOptions::ForwardKernel::kCudnn;
    options.backward_kernel = CudaBackendOptions::BackwardKernel::kCudnn;
    return options;
  }
};
using CudnnBackwardTest = SharedBackendTest<::testing::TestWithParam<MatrixParam>, CudnnOptions>;

TEST_P(CudnnBackwardTest, ForwardAndBackwardMatchOracle) {
  const auto [dtype, mode, index, causal] = GetParam();
  const SpecCase& c = SpecCases()[index];
  const CudaBackendStats before = backend_->stats();
  CheckAgainstOracle(backend_, MakeSpec(c.w, c.r, mode, causal), c.shape, dtype,
                     /*backward=*/true);
  const CudaBackendStats after = backend_->stats();
  EXPECT_EQ(after.own_hopper_calls, before.own_hopper_calls);
  EXPECT_EQ(after.own_hopper_backward_calls, before.own_hopper_backward_calls);
  EXPECT_GT(after.cudnn_calls, before.cudnn_calls);
}

INSTANTIATE_TEST_SUITE_P(EngineSpecCases, CudnnBackwardTest,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16),
                                            ::testing::Values(AttentionMode::kGrouped,
                                                              AttentionMode::kMixture),
                                            ::testing::Range(0, 7), ::testing::Bool()),
                         MatrixName);

// The default (BackwardKernel::kAuto) runs the backward of both modes on our own Hopper kernels
// (on a compute capability 9.0 device, D = 64 or 128), and on cuDNN otherwise.
TEST_F(CudaBackendTest, DefaultPicksTheBackwardKernel) {
  int major = 0, minor = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    for (int64_t dim : {64, 96}) {
      const CudaBackendStats before = backend_->stats();
      CheckAgainstOracle(backend_, MakeSpec({64, 128}, {1, 2}, mode, false), {1, 256, 4, dim},
                         DType::kBFloat16, /*backward=*/true);
      const CudaBackendStats after = backend_->stats();
      const bool own = major == 9 && minor == 0 && dim == 64;
      EXPECT_EQ(after.own_hopper_backward_calls > before.own_hopper_backward_calls, own)
          << AttentionModeName(mode) << " D=" << dim;
    }
  }
}

// Calls cut to a small workspace limit (several chunks per pattern, forward and backward) give
// the oracle's results, on our Hopper backward (kAuto) and on cuDNN's.
TEST(CudaBackendChunkingTest, SmallWorkspaceLimitMatchesOracle) {
  for (auto kernel :
       {CudaBackendOptions::BackwardKernel::kAuto, CudaBackendOptions::BackwardKernel::kCudnn}) {
    CudaBackendOptions options;
    options.workspace_limit_bytes = 16 << 10;
    options.backward_kernel = kernel;
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> made = NewCudaBackend(options);
    if (!made.ok()) GTEST_SKIP() << made.status().message();
    CudaAttentionBackend* backend = made->get();
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      const AttentionSpec spec = MakeSpec({32, 64}, {1, 2}, mode, false);
      const oracle::Shape shape{2, 384, 4, 64};
      auto calls = [](const CudaBackendStats& s) {
        return s.own_hopper_calls + s.own_hopper_backward_calls + s.cudnn_calls + s.kernel_calls;
      };
      const int64_t before = calls(backend->stats());
      CheckAgainstOracle(backend, spec, shape, DType::kBFloat16, /*backward=*/false);
      const int64_t forward = calls(backend->stats()) - before;
      CheckAgainstOracle(backend, spec, shape, DType::kBFloat16, /*backward=*/true);
      const int64_t backward = calls(backend->stats()) - before - 2 * forward;
      // Unchunked, the backward would be 2 (grouped) or 3 (mixture) calls.
      EXPECT_GT(backward, 3) << AttentionModeName(mode);
    }
  }
}

TEST_F(CudaBackendTest, MixtureBlockedOffsets) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    CheckAgainstOracle(
        backend_, MakeSpec({32, 64}, {2, 4}, AttentionMode::kMixture, true, HeadOffsets::kBlocked),
        {2, 192, 6, 64}, dtype, true);
  }
}

// The own-kernel path for the 16-bit types (what runs where cuDNN cannot).
TEST_F(CudaBackendTest, KernelPathMatchesOracle) {
  CudaBackendOptions options;
  options.use_cudnn = false;
  absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> kernel_only = NewCudaBackend(options);
  ASSERT_TRUE(kernel_only.ok()) << kernel_only.status();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
      CheckAgainstOracle(kernel_only->get(), MakeSpec({32, 64, 128}, {1, 2, 4}, mode, true),
                         {2, 200, 5, 64}, dtype, true);
    }
  }
  EXPECT_EQ((*kernel_only)->stats().cudnn_calls, 0);
  EXPECT_GT((*kernel_only)->stats().kernel_calls, 0);
}

// Every way of applying grouped mode's 1/G on the cuDNN path (a pass, or inside cuDNN's graph)
// gives the same result.
TEST_F(CudaBackendTest, GroupScaleVariantsMatchOracle) {
  using GroupScale = CudaBackendOptions::GroupScale;
  for (GroupScale mode : {GroupScale::kPass, GroupScale::kProbabilities}) {
    CudaBackendOptions options;
    options.group_scale = mode;
    options.forward_kernel = CudaBackendOptions::ForwardKernel::kCudnn;  // our kernel needs neither
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> backend = NewCudaBackend(options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      CheckAgainstOracle(backend->get(),
                         MakeSpec({32, 64, 128}, {1, 2, 4}, AttentionMode::kGrouped, true),
                         {2, 256, 5, 64}, dtype, true);
    }
    EXPECT_EQ((*backend)->stats().cudnn_fallbacks, 0) << (*backend)->last_fallback_reason();
    EXPECT_EQ((*backend)->stats().p_scale_passes > 0, mode == GroupScale::kPass);
  }
}

// Strided inputs the fused kernel cannot read (an odd padding per dimension): the backend falls
// back to its own kernel for those calls and is still right.
TEST_F(CudaBackendTest, PaddedInputsFallBackCorrectly) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    CheckAgainstOracle(backend_, MakeSpec({32, 64}, {1, 2}, AttentionMode::kGrouped, false),
                       {2, 128, 4, 64}, dtype, true, Layout::kPadded);
    CheckAgainstOracle(backend_, MakeSpec({32, 64}, {1, 2}, AttentionMode::kMixture, true),
                       {1, 128, 3, 64}, dtype, true, Layout::kInterleaved);
  }
}

// q, k and v as slices of one packed (B, N, 3, H, D) projection: 16-byte aligned strides cuDNN
// reads in place (no fallback).
TEST_F(CudaBackendTest, PackedQkvSlicesRunOnCudnn) {
  const oracle::Shape shape{2, 256, 4, 64};
  const DType dtype = DType::kBFloat16;
  const AttentionSpec spec = MakeSpec({64, 128}, {1, 2}, AttentionMode::kGrouped, true);
  HostTensor packed(dtype, {shape.batch, shape.seq_len, 3, shape.num_heads, shape.head_dim});
  const int64_t hd = shape.num_heads * shape.head_dim;
  std::vector<TensorView> host_views, device_views;
  std::vector<std::vector<double>> values;
  for (int i = 0; i < 3; ++i) {
    TensorView view;
    view.dtype = dtype;
    view.shape = shape.Dims();
    view.strides = {shape.seq_len * 3 * hd, 3 * hd, shape.head_dim, 1};
    view.data = static_cast<char*>(packed.view().data) + i * hd * DTypeSize(dtype);
    values.push_back(testutil::RandomValues(shape.NumElements(),
                                            testutil::CheckSeed("qkv" + std::to_string(i))));
    testutil::FromDoubles(values.back(), view);
    values.back() = testutil::ToDoubles(view);  // rounded to bf16
    host_views.push_back(view);
  }
  DeviceTensor device = Upload(packed);
  for (int i = 0; i < 3; ++i) {
    TensorView view = host_views[i];
    view.data = static_cast<char*>(device.buffer->get()) + i * hd * DTypeSize(dtype);
    view.device = Device::kCuda;
    device_views.push_back(view);
  }
  DeviceTensor out = Poisoned(dtype, shape.Dims());
  DeviceTensor lse = Poisoned(DType::kFloat32, shape.LseDims());
  const int64_t fallbacks = backend_->stats().cudnn_fallbacks;
  ASSERT_TRUE(
      backend_
          ->Forward(spec, {device_views[0], device_views[1], device_views[2], out.view, lse.view})
          .ok());
  ASSERT_TRUE(backend_->Synchronize().ok());
  EXPECT_EQ(backend_->stats().cudnn_fallbacks, fallbacks) << backend_->last_fallback_reason();
  absl::StatusOr<oracle::ForwardResult> ref =
      oracle::Forward(spec, shape, values[0], values[1], values[2]);
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(
      testutil::RelativelyNear("out", Download(out), ref->out, testutil::SpecTolerance(dtype)));
  EXPECT_TRUE(testutil::LseNear("lse", Download(lse), ref->lse, testutil::GpuLseTolerance(dtype)));
}

// Every D the backend accepts, forward and backward; prints which path ran (cuDNN or the fallback).
TEST_F(CudaBackendTest, EveryAcceptedHeadDim) {
  for (int64_t d : {8, 16, 32, 40, 64, 96, 128, 160, 192, 256}) {
    const CudaBackendStats before = backend_->stats();
    CheckAgainstOracle(backend_, MakeSpec({32, 64}, {1, 2}, AttentionMode::kGrouped, true),
                       {1, 128, 2, d}, DType::kBFloat16, true);
    const CudaBackendStats after = backend_->stats();
    std::printf("[ head dim ] D=%3lld: %lld cuDNN calls, %lld fallback calls%s%s\n",
                static_cast<long long>(d),
                static_cast<long long>(after.cudnn_calls - before.cudnn_calls),
                static_cast<long long>(after.cudnn_fallbacks - before.cudnn_fallbacks),
                after.cudnn_fallbacks > before.cudnn_fallbacks ? ": " : "",
                after.cudnn_fallbacks > before.cudnn_fallbacks
                    ? backend_->last_fallback_reason().substr(0, 300).c_str()
                    : "");
  }
}

TEST_F(CudaBackendTest, RejectsWhatItCannotRun) {
  const AttentionSpec spec = MakeSpec({32}, {1}, AttentionMode::kGrouped, false);
  const oracle::Shape shape{1, 64, 2, 12};  // D = 12: not a multiple of 8
  DeviceTensor q = Poisoned(DType::kBFloat16, shape.Dims());
  DeviceTensor out = Poisoned(DType::kBFloat16, shape.Dims());
  DeviceTensor lse = Poisoned(DType::kFloat32, shape.LseDims());
  absl::Status s = backend_->Forward(spec, {q.view, q.view, q.view, out.view, lse.view});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("D = 12"), std::string::npos) << s;
  EXPECT_NE(s.message().find("256"), std::string::npos) << "names the supported D: " << s;

  const oracle::Shape ok_shape{1, 64, 2, 64};
  DeviceTensor q64 = Poisoned(DType::kFloat64, ok_shape.Dims());
  DeviceTensor out64 = Poisoned(DType::kFloat64, ok_shape.Dims());
  DeviceTensor lse64 = Poisoned(DType::kFloat64, ok_shape.LseDims());
  s = backend_->Forward(spec, {q64.view, q64.view, q64.view, out64.view, lse64.view});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fp64"), std::string::npos) << s;

  HostTensor host(DType::kBFloat16, ok_shape.Dims());
  DeviceTensor qd = Poisoned(DType::kBFloat16, ok_shape.Dims());
  DeviceTensor outd = Poisoned(DType::kBFloat16, ok_shape.Dims());
  DeviceTensor lsed = Poisoned(DType::kFloat32, ok_shape.LseDims());
  s = backend_->Forward(spec, {host.view(), qd.view, qd.view, outd.view, lsed.view});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "host memory is refused";
}

// Two threads, one backend each, at the same time: each result is right.
TEST_F(CudaBackendTest, OneContextPerThread) {
  auto run = [](AttentionMode mode) {
    absl::StatusOr<std::unique_ptr<CudaAttentionBackend>> mine = NewCudaBackend();
    ASSERT_TRUE(mine.ok()) << mine.status();
    for (int i = 0; i < 3; ++i) {
      CheckAgainstOracle(mine->get(), MakeSpec({32, 64}, {1, 2}, mode, i % 2 == 1), {1, 256, 4, 64},
                         DType::kBFloat16, true);
    }
  };
  std::thread a(run, AttentionMode::kGrouped);
  std::thread b(run, AttentionMode::kMixture);
  a.join();
  b.join();
}

void CUDART_CB SleepOnStream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// A call enqueues and returns: with the stream held up by a host callback, Forward comes back while
// its work is still pending.
TEST_F(CudaBackendTest, CallsDoNotSynchronize) {
  const oracle::Shape shape{1, 512, 4, 64};
  const AttentionSpec spec = MakeSpec({64, 128}, {1, 2}, AttentionMode::kGrouped, false);
  const Inputs in = MakeInputs(shape, DType::kBFloat16, Layout::kContiguous);
  DeviceTensor q = Upload(in.q), k = Upload(in.k), v = Upload(in.v);
  DeviceTensor out = Poisoned(DType::kBFloat16, shape.Dims());
  DeviceTensor lse = Poisoned(DType::kFloat32, shape.LseDims());
  const ForwardArgs args{q.view, k.view, v.view, out.view, lse.view};
  ASSERT_TRUE(backend_->Forward(spec, args).ok());  // builds the plans
  ASSERT_TRUE(backend_->Synchronize().ok());
  ASSERT_CUDA(cudaLaunchHostFunc(backend_->stream(), SleepOnStream, nullptr));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(backend_->Forward(spec, args).ok());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(cudaStreamQuery(backend_->stream()), cudaErrorNotReady);
  EXPECT_LT(ms, 150.0) << "Forward waited for the stream";
  ASSERT_TRUE(backend_->Synchronize().ok());
}

// The planner's workspace is what the backend takes from its pool (ModeledLibraryWorkspace covers
// what cuDNN's plans ask for).
TEST_F(CudaBackendTest, PlannerMatchesPoolHighWater) {
  for (AttentionMode mode : {AttentionMode::kGrouped, AttentionMode::kMixture}) {
    for (bool backward : {false, true}) {
      const oracle::Shape shape{1, 4096, 8, 64};
      const AttentionSpec spec = MakeSpec({256, 512, 1024}, {1, 2, 4}, mode, false);
      const Inputs in = MakeInputs(shape, DType::kBFloat16, Layout::kContiguous);
      DeviceTensor q = Upload(in.q), k = Upload(in.k), v = Upload(in.v), dout = Upload(in.dout);
      DeviceTensor out = Poisoned(DType::kBFloat16, shape.Dims());
      DeviceTensor lse = Poisoned(DType::kFloat32, shape.LseDims());
      DeviceTensor dq = Poisoned(DType::kBFloat16, shape.Dims());
      DeviceTensor dk = Poisoned(DType::kBFloat16, shape.Dims());
      DeviceTensor dv = Poisoned(DType::kBFloat16, shape.Dims());
      ASSERT_TRUE(backend_->Forward(spec, {q.view, k.view, v.view, out.view, lse.view}).ok());
      ASSERT_TRUE(backend_->Synchronize().ok());
      uint64_t zero = 0;
      ASSERT_CUDA(cudaMemPoolSetAttribute(backend_->pool(), cudaMemPoolAttrUsedMemHigh, &zero));
      if (backward) {
        // A training step: the plan's workspace is the larger of the forward's and the
        // backward's.
        ASSERT_TRUE(backend_->Forward(spec, {q.view, k.view, v.view, out.view, lse.view}).ok());
        ASSERT_TRUE(backend_
                        ->Backward(spec, {q.view, k.view, v.view, out.view, lse.view, dout.view,
                                          dq.view, dk.view, dv.view})
                        .ok());
      } else {
        ASSERT_TRUE(backend_->Forward(spec, {q.view, k.view, v.view, out.view, lse.view}).ok());
      }
      ASSERT_TRUE(backend_->Synchronize().ok());
      uint64_t used_high = 0;
      ASSERT_CUDA(
          cudaMemPoolGetAttribute(backend_->pool(), cudaMemPoolAttrUsedMemHigh, &used_high));
      absl::StatusOr<cuda::CudaMemoryPlan> plan =
          cuda::PlanCudaMemory(spec, shape.batch, shape.seq_len, shape.num_heads, shape.head_dim,
                               DType::kBFloat16, false);
      if (backward) {
        plan = cuda::PlanCudaMemory(spec, shape.batch, shape.seq_len, shape.num_heads,
                                    shape.head_dim, DType::kBFloat16, true);
      }
      ASSERT_TRUE(plan.ok());
      std::printf("[ planner  ] %s %s: planned workspace %lld B, pool used high %llu B\n",
                  AttentionModeName(mode), backward ? "backward" : "forward",
                  static_cast<long long>(plan->workspace_bytes),
                  static_cast<unsigned long long>(used_high));
      EXPECT_LE(static_cast<double>(used_high), 1.1 * plan->workspace_bytes + (2 << 20));
      EXPECT_GE(static_cast<double>(used_high), 0.9 * plan->workspace_bytes);
    }
  }
}

}  // namespace
}  // namespace dattn
