#include "engine/cuda/cudnn_sdpa.h"

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/cuda/cuda_status.h"

namespace dattn {
namespace cuda {
namespace {

// Deprecated in cuDNN 9 headers but still how a graph and a plan learn their handle; named by value
// so that -Werror does not trip over the deprecation attribute.
constexpr auto kOpGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);

using Desc = std::shared_ptr<void>;  // a cudnnBackendDescriptor_t with its destroyer

cudnnBackendDescriptor_t Raw(const Desc& d) {
  return static_cast<cudnnBackendDescriptor_t>(d.get());
}

absl::StatusOr<Desc> Make(cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = nullptr;
  DATTN_CUDNN_RETURN_IF_ERROR(cudnnBackendCreateDescriptor(type, &d));
  return Desc(
      d, [](void* p) { cudnnBackendDestroyDescriptor(static_cast<cudnnBackendDescriptor_t>(p)); });
}

absl::Status Set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                 int64_t count, const void* value) {
  DATTN_CUDNN_RETURN_IF_ERROR(cudnnBackendSetAttribute(Raw(d), name, type, count, value));
  return absl::OkStatus();
}

absl::Status SetDesc(const Desc& d, cudnnBackendAttributeName_t name, const Desc& value) {
  cudnnBackendDescriptor_t raw = Raw(value);
  return Set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

absl::Status Finalize(const Desc& d, const char* what) {
  const cudnnStatus_t s = cudnnBackendFinalize(Raw(d));
  if (s != CUDNN_STATUS_SUCCESS) {
    return CudnnErrorStatus(s, absl::StrCat("cudnnBackendFinalize(", what, ")").c_str(), __FILE__,
                            __LINE__);
  }
  return absl::OkStatus();
}

cudnnDataType_t CudnnType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return CUDNN_DATA_HALF;
    case DType::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kFloat32:
      return CUDNN_DATA_FLOAT;
    case DType::kFloat64:
      return CUDNN_DATA_DOUBLE;
  }
  return CUDNN_DATA_FLOAT;
}

using Dims = std::array<int64_t, 4>;

// Collects the descriptors of one graph (they must stay alive with the plan) and hands out uids.
class GraphBuilder {
 public:
  absl::StatusOr<Desc> Tensor(int64_t uid, cudnnDataType_t type, const Dims& dims,
                              const Dims& strides, bool is_virtual, bool by_value = false) {
    absl::StatusOr<Desc> t = Make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (!t.ok()) return t.status();
    const int64_t alignment = 16;
    const bool virt = is_virtual;
    DATTN_RETURN_IF_ERROR(Set(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    DATTN_RETURN_IF_ERROR(Set(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data()));
    DATTN_RETURN_IF_ERROR(Set(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data()));
    DATTN_RETURN_IF_ERROR(Set(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    DATTN_RETURN_IF_ERROR(
        Set(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    DATTN_RETURN_IF_ERROR(Set(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt));
    if (by_value) {
      const bool yes = true;
      DATTN_RETURN_IF_ERROR(Set(*t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes));
    }
    DATTN_RETURN_IF_ERROR(Finalize(*t, "tensor"));
    keep_.push_back(*t);
    return t;
  }

  // A virtual intermediate with a fresh uid.
  absl::StatusOr<Desc> Virtual(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return Tensor(next_virtual_++, type, dims, strides, /*is_virtual=*/true);
  }

  // A by-value fp32 scalar.
  absl::StatusOr<Desc> Scalar(int64_t uid) {
    return Tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, /*by_value=*/true);
  }

  absl::Status Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, const Desc& x,
                         const Desc* b, const Desc* t, const Desc& y, int64_t axis = -1) {
    absl::StatusOr<Desc> pw = Make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    if (!pw.ok()) return pw.status();
    DATTN_RETURN_IF_ERROR(Set(*pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    DATTN_RETURN_IF_ERROR(Set(*pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math));
    if (axis >= 0) {
      DATTN_RETURN_IF_ERROR(Set(*pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    }
    DATTN_RETURN_IF_ERROR(Finalize(*pw, "pointwise"));
    absl::StatusOr<Desc> op = Make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    if (!op.ok()) return op.status();
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x));
    if (b != nullptr) DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b));
    if (t != nullptr) DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y));
    DATTN_RETURN_IF_ERROR(Finalize(*op, "pointwise operation"));
    keep_.push_back(*pw);
    ops_.push_back(*op);
    return absl::OkStatus();
  }

  absl::Status Matmul(const Desc& a, const Desc& b, const Desc& c) {
    absl::StatusOr<Desc> mm = Make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    if (!mm.ok()) return mm.status();
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    DATTN_RETURN_IF_ERROR(Set(*mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    DATTN_RETURN_IF_ERROR(Finalize(*mm, "matmul"));
    absl::StatusOr<Desc> op = Make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    if (!op.ok()) return op.status();
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_MATMUL_DESC, *mm));
    DATTN_RETURN_IF_ERROR(Finalize(*op, "matmul operation"));
    keep_.push_back(*mm);
    ops_.push_back(*op);
    return absl::OkStatus();
  }

  absl::Status Reduce(cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y) {
    absl::StatusOr<Desc> red = Make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    if (!red.ok()) return red.status();
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    DATTN_RETURN_IF_ERROR(
        Set(*red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    DATTN_RETURN_IF_ERROR(
        Set(*red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    DATTN_RETURN_IF_ERROR(Finalize(*red, "reduction"));
    absl::StatusOr<Desc> op = Make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    if (!op.ok()) return op.status();
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, *red));
    DATTN_RETURN_IF_ERROR(Finalize(*op, "reduction operation"));
    keep_.push_back(*red);
    ops_.push_back(*op);
    return absl::OkStatus();
  }

  absl::Status Reshape(const Desc& x, const Desc& y) {
    absl::StatusOr<Desc> op = Make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    if (!op.ok()) return op.status();
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x));
    DATTN_RETURN_IF_ERROR(SetDesc(*op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y));
    DATTN_RETURN_IF_ERROR(Finalize(*op, "reshape operation"));
    ops_.push_back(*op);
    return absl::OkStatus();
  }

  // S := row >= col ? S : -inf (top-left aligned causal mask), as cuDNN's fusion engine expects it.
  absl::StatusOr<Desc> CausalMask(const Desc& s, const Dims& dims, const Dims& strides,
                                  const Desc& neg_inf) {
    absl::StatusOr<Desc> row = Virtual(CUDNN_DATA_INT32, dims, strides);
    absl::StatusOr<Desc> col = Virtual(CUDNN_DATA_INT32, dims, strides);
    absl::StatusOr<Desc> keep = Virtual(CUDNN_DATA_BOOLEAN, dims, strides);
    absl::StatusOr<Desc> out = Virtual(CUDNN_DATA_FLOAT, dims, strides);
    for (const auto* d : {&row, &col, &keep, &out}) {
      if (!d->ok()) return d->status();
    }
    DATTN_RETURN_IF_ERROR(
        Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, nullptr, nullptr, *row, 2));
    DATTN_RETURN_IF_ERROR(
        Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, nullptr, nullptr, *col, 3));
    DATTN_RETURN_IF_ERROR(
        Pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, *row, &*col, nullptr, *keep));
    DATTN_RETURN_IF_ERROR(
        Pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, &neg_inf, &*keep, *out));
    return out;
  }

  const std::vector<Desc>& ops() const { return ops_; }
  std::vector<Desc>& keep() { return keep_; }

 private:
  std::vector<Desc> ops_;
  std::vector<Desc> keep_;
  int64_t next_virtual_ = 1000;
};

// uids of the non-virtual tensors.
enum Uid : int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kStats = 5,
  kScale = 6,
  kNegInf = 7,
  kPScale = 8,
  kDO = 9,
  kDQ = 10,
  kDK = 11,
  kDV = 12,
  kDeltaScale = 13,
  kSoftmaxSum = 14,
  kDQAccum = 15,
};

Dims BhsdDims(const SdpaShape& s) { return {s.batch, s.heads, s.seq, s.head_dim}; }
Dims Strides(const SdpaStrides& st) { return {st.b, st.h, st.s, 1}; }
// K^T (or V^T) as the [b, h, d, s] view of the same memory.
Dims TransposedDims(const SdpaShape& s) { return {s.batch, s.heads, s.head_dim, s.seq}; }
Dims TransposedStrides(const SdpaStrides& st) { return {st.b, st.h, 1, st.s}; }
Dims RowDims(const SdpaShape& s) { return {s.batch, s.heads, s.seq, 1}; }
Dims RowStrides(const SdpaShape& s) { return {s.heads * s.seq, s.seq, 1, 1}; }
Dims ScoreDims(const SdpaShape& s) { return {s.batch, s.heads, s.seq, s.seq}; }
Dims ScoreStrides(const SdpaShape& s) { return {s.heads * s.seq * s.seq, s.seq * s.seq, s.seq, 1}; }

std::string StridesKey(const SdpaStrides& s) { return absl::StrCat(s.b, ",", s.h, ",", s.s); }

std::string ShapeKey(const SdpaShape& s) {
  return absl::StrCat(DTypeName(s.dtype), " b", s.batch, " h", s.heads, " s", s.seq, " d",
                      s.head_dim, s.causal ? " causal" : "");
}

}  // namespace

struct CudnnSdpa::Plan {
  std::vector<Desc> keep;  // tensors, ops, graph, configs: alive as long as the plan
  Desc plan;
  int64_t workspace = 0;
  std::string engine;  // for logs
};

namespace {

// Finalizes the graph and the first execution plan an engine accepts (heuristics mode A, then the
// fallback list). Returns UNIMPLEMENTED with cuDNN's reasons when no engine takes the graph.
absl::StatusOr<std::unique_ptr<CudnnSdpa::Plan>> BuildPlan(cudnnHandle_t handle,
                                                           GraphBuilder& builder,
                                                           const std::string& what) {
  auto plan = std::make_unique<CudnnSdpa::Plan>();
  absl::StatusOr<Desc> graph = Make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  if (!graph.ok()) return graph.status();
  std::vector<cudnnBackendDescriptor_t> raw_ops;
  for (const Desc& op : builder.ops()) raw_ops.push_back(Raw(op));
  DATTN_RETURN_IF_ERROR(Set(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                            static_cast<int64_t>(raw_ops.size()), raw_ops.data()));
  DATTN_RETURN_IF_ERROR(Set(*graph, kOpGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle));
  if (absl::Status s = Finalize(*graph, "operation graph"); !s.ok()) {
    return absl::UnimplementedError(
        absl::StrCat("cuDNN rejected the ", what, " attention graph: ", s.message()));
  }
  std::vector<std::string> reasons;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    absl::StatusOr<Desc> heur = Make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    if (!heur.ok()) return heur.status();
    DATTN_RETURN_IF_ERROR(SetDesc(*heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph));
    DATTN_RETURN_IF_ERROR(Set(*heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    if (absl::Status s = Finalize(*heur, "engine heuristics"); !s.ok()) {
      reasons.push_back(std::string(s.message()));
      continue;
    }
    int64_t count = 0;
    DATTN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(Raw(*heur), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                                         nullptr));
    if (count <= 0) {
      reasons.push_back(
          absl::StrCat("heuristics mode ", static_cast<int>(mode), " found no engine"));
      continue;
    }
    std::vector<Desc> configs;
    std::vector<cudnnBackendDescriptor_t> raw_configs;
    for (int64_t i = 0; i < count; ++i) {
      absl::StatusOr<Desc> cfg = Make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      if (!cfg.ok()) return cfg.status();
      configs.push_back(*cfg);
      raw_configs.push_back(Raw(*cfg));
    }
    int64_t returned = 0;
    DATTN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(Raw(*heur), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                                         &returned, raw_configs.data()));
    for (int64_t i = 0; i < returned; ++i) {
      absl::StatusOr<Desc> exec = Make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      if (!exec.ok()) return exec.status();
      DATTN_RETURN_IF_ERROR(Set(*exec, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle));
      DATTN_RETURN_IF_ERROR(SetDesc(*exec, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]));
      if (absl::Status s = Finalize(*exec, "execution plan"); !s.ok()) {
        reasons.push_back(absl::StrCat("engine config ", i, ": ", s.message()));
        continue;
      }
      int64_t workspace = 0;
      int64_t n = 0;
      DATTN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(Raw(*exec),
                                                           CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                           CUDNN_TYPE_INT64, 1, &n, &workspace));
      plan->keep = std::move(builder.keep());
      for (const Desc& op : builder.ops()) plan->keep.push_back(op);
      plan->keep.push_back(*graph);
      plan->keep.push_back(*heur);
      for (const Desc& c : configs) plan->keep.push_back(c);
      plan->plan = *exec;
      plan->workspace = workspace;
      plan->engine = absl::StrCat("heuristics mode ", static_cast<int>(mode), " config ", i);
      return plan;
    }
  }
  return absl::UnimplementedError(absl::StrCat("no cuDNN engine takes the ", what,
                                               " attention graph: ", absl::StrJoin(reasons, "; ")));
}

absl::Status Execute(cudnnHandle_t handle, const CudnnSdpa::Plan& plan,
                     const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
                     void* workspace) {
  absl::StatusOr<Desc> pack = Make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  if (!pack.ok()) return pack.status();
  DATTN_RETURN_IF_ERROR(Set(*pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                            static_cast<int64_t>(uids.size()), uids.data()));
  DATTN_RETURN_IF_ERROR(Set(*pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                            static_cast<int64_t>(pointers.size()), pointers.data()));
  DATTN_RETURN_IF_ERROR(
      Set(*pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  DATTN_RETURN_IF_ERROR(Finalize(*pack, "variant pack"));
  DATTN_CUDNN_RETURN_IF_ERROR(cudnnBackendExecute(handle, Raw(plan.plan), Raw(*pack)));
  return absl::OkStatus();
}

}  // namespace

CudnnSdpa::CudnnSdpa(void* handle) : handle_(handle) {}

CudnnSdpa::~CudnnSdpa() {
  plans_.clear();  // descriptors first, then the handle they were built on
  cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

int64_t CudnnSdpa::LoadedVersion() { return static_cast<int64_t>(cudnnGetVersion()); }

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::Create(cudaStream_t stream) {
  if (LoadedVersion() < 90000) {
    return absl::FailedPreconditionError(
        absl::StrCat("the loaded cuDNN is version ", LoadedVersion(),
                     "; the CUDA backend needs cuDNN 9 (built against ", CUDNN_VERSION, ")"));
  }
  cudnnHandle_t handle = nullptr;
  DATTN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&handle));
  std::unique_ptr<CudnnSdpa> sdpa(new CudnnSdpa(handle));
  DATTN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(handle, stream));
  return sdpa;
}

absl::StatusOr<CudnnSdpa::Plan*> CudnnSdpa::CachedPlan(
    const std::string& key, const std::function<absl::StatusOr<std::unique_ptr<Plan>>()>& build) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (auto it = failures_.find(key); it != failures_.end()) return it->second;
  absl::StatusOr<std::unique_ptr<Plan>> built = build();
  if (!built.ok()) {
    ++counters_.plan_failures;
    absl::Status failure(built.status().code(),
                         absl::StrCat(built.status().message(), " [", key, "]"));
    failures_.emplace(key, failure);
    return failure;
  }
  ++counters_.plans_built;
  counters_.max_workspace = std::max(counters_.max_workspace, (*built)->workspace);
  Plan* raw = built->get();
  plans_.emplace(key, std::move(*built));
  return raw;
}

absl::StatusOr<CudnnSdpa::Plan*> CudnnSdpa::ForwardPlan(const SdpaForwardArgs& a) {
  const SdpaShape& sh = a.shape;
  const bool p_scaled = a.p_scale != 1.0f;
  const std::string key = absl::StrCat("fwd ", ShapeKey(sh), " q", StridesKey(a.q_strides), " k",
                                       StridesKey(a.k_strides), " v", StridesKey(a.v_strides), " o",
                                       StridesKey(a.o_strides), p_scaled ? " p-scale" : "");
  auto build = [&]() -> absl::StatusOr<std::unique_ptr<Plan>> {
    GraphBuilder g;
    const cudnnDataType_t io = CudnnType(sh.dtype);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const Dims sd = ScoreDims(sh), ss = ScoreStrides(sh), rd = RowDims(sh), rs = RowStrides(sh);
    absl::StatusOr<Desc> q = g.Tensor(kQ, io, BhsdDims(sh), Strides(a.q_strides), false);
    absl::StatusOr<Desc> kt =
        g.Tensor(kK, io, TransposedDims(sh), TransposedStrides(a.k_strides), false);
    absl::StatusOr<Desc> v = g.Tensor(kV, io, BhsdDims(sh), Strides(a.v_strides), false);
    absl::StatusOr<Desc> o = g.Tensor(kO, io, BhsdDims(sh), Strides(a.o_strides), false);
    absl::StatusOr<Desc> stats = g.Tensor(kStats, f32, rd, rs, false);
    absl::StatusOr<Desc> scale = g.Scalar(kScale);
    for (const auto* d : {&q, &kt, &v, &o, &stats, &scale}) {
      if (!d->ok()) return d->status();
    }
    absl::StatusOr<Desc> s1 = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> s2 = g.Virtual(f32, sd, ss);
    if (!s1.ok() || !s2.ok()) return absl::InternalError("virtual tensor");
    DATTN_RETURN_IF_ERROR(g.Matmul(*q, *kt, *s1));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, *s1, &*scale, nullptr, *s2));
    Desc scores = *s2;
    if (sh.causal) {
      absl::StatusOr<Desc> neg_inf = g.Scalar(kNegInf);
      if (!neg_inf.ok()) return neg_inf.status();
      absl::StatusOr<Desc> masked = g.CausalMask(scores, sd, ss, *neg_inf);
      if (!masked.ok()) return masked.status();
      scores = *masked;
    }
    absl::StatusOr<Desc> mx = g.Virtual(f32, rd, rs);
    absl::StatusOr<Desc> centered = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> ex = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> sum = g.Virtual(f32, rd, rs);
    absl::StatusOr<Desc> lg = g.Virtual(f32, rd, rs);
    for (const auto* d : {&mx, &centered, &ex, &sum, &lg}) {
      if (!d->ok()) return d->status();
    }
    DATTN_RETURN_IF_ERROR(g.Reduce(CUDNN_REDUCE_TENSOR_MAX, scores, *mx));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, f32, scores, &*mx, nullptr, *centered));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_EXP, f32, *centered, nullptr, nullptr, *ex));
    DATTN_RETURN_IF_ERROR(g.Reduce(CUDNN_REDUCE_TENSOR_ADD, *ex, *sum));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_LOG, f32, *sum, nullptr, nullptr, *lg));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_ADD, f32, *mx, &*lg, nullptr, *stats));
    Desc p;
    if (p_scaled) {
      absl::StatusOr<Desc> p0 = g.Virtual(f32, sd, ss);
      absl::StatusOr<Desc> p1 = g.Virtual(io, sd, ss);
      absl::StatusOr<Desc> ps = g.Scalar(kPScale);
      for (const auto* d : {&p0, &p1, &ps}) {
        if (!d->ok()) return d->status();
      }
      DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_DIV, f32, *ex, &*sum, nullptr, *p0));
      DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, *p0, &*ps, nullptr, *p1));
      p = *p1;
    } else {
      absl::StatusOr<Desc> p1 = g.Virtual(io, sd, ss);
      if (!p1.ok()) return p1.status();
      DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_DIV, f32, *ex, &*sum, nullptr, *p1));
      p = *p1;
    }
    DATTN_RETURN_IF_ERROR(g.Matmul(p, *v, *o));
    return BuildPlan(static_cast<cudnnHandle_t>(handle_), g, "forward");
  };
  return CachedPlan(key, build);
}

absl::StatusOr<CudnnSdpa::Plan*> CudnnSdpa::BackwardPlan(const SdpaBackwardArgs& a) {
  const SdpaShape& sh = a.shape;
  const std::string key = absl::StrCat("bwd ", ShapeKey(sh), " q", StridesKey(a.q_strides), " k",
                                       StridesKey(a.k_strides), " v", StridesKey(a.v_strides), " o",
                                       StridesKey(a.o_strides), " do", StridesKey(a.do_strides),
                                       " dq", StridesKey(a.dq_strides), " dk",
                                       StridesKey(a.dk_strides), " dv", StridesKey(a.dv_strides));
  auto build = [&]() -> absl::StatusOr<std::unique_ptr<Plan>> {
    GraphBuilder g;
    const cudnnDataType_t io = CudnnType(sh.dtype);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const Dims dims = BhsdDims(sh);
    const Dims sd = ScoreDims(sh), ss = ScoreStrides(sh), rd = RowDims(sh), rs = RowStrides(sh);
    const Dims packed = {sh.heads * sh.seq * sh.head_dim, sh.seq * sh.head_dim, sh.head_dim, 1};
    absl::StatusOr<Desc> q = g.Tensor(kQ, io, dims, Strides(a.q_strides), false);
    absl::StatusOr<Desc> kt =
        g.Tensor(kK, io, TransposedDims(sh), TransposedStrides(a.k_strides), false);
    absl::StatusOr<Desc> vt =
        g.Tensor(kV, io, TransposedDims(sh), TransposedStrides(a.v_strides), false);
    absl::StatusOr<Desc> o = g.Tensor(kO, io, dims, Strides(a.o_strides), false);
    absl::StatusOr<Desc> d_o = g.Tensor(kDO, io, dims, Strides(a.do_strides), false);
    absl::StatusOr<Desc> stats = g.Tensor(kStats, f32, rd, rs, false);
    absl::StatusOr<Desc> dq = g.Tensor(kDQ, io, dims, Strides(a.dq_strides), false);
    absl::StatusOr<Desc> dk = g.Tensor(kDK, io, dims, Strides(a.dk_strides), false);
    absl::StatusOr<Desc> dv = g.Tensor(kDV, io, dims, Strides(a.dv_strides), false);
    absl::StatusOr<Desc> scale = g.Scalar(kScale);
    absl::StatusOr<Desc> delta_scale = g.Scalar(kDeltaScale);
    absl::StatusOr<Desc> softmax_sum = g.Tensor(kSoftmaxSum, f32, rd, rs, false);
    absl::StatusOr<Desc> dq_accum = g.Tensor(kDQAccum, f32, dims, packed, false);
    for (const auto* d : {&q, &kt, &vt, &o, &d_o, &stats, &dq, &dk, &dv, &scale, &delta_scale,
                          &softmax_sum, &dq_accum}) {
      if (!d->ok()) return d->status();
    }
    // softmax_sum = rowsum(dO * O) * 1. The multiplication by one is the frontend's topology (it
    // carries dropout's 1 - p when there is dropout); the fusion engine does not honour another
    // value there (seen with cuDNN 9.19 on an H100: gradients came out wrong), so it stays 1 and
    // callers scale O instead.
    absl::StatusOr<Desc> prod = g.Virtual(f32, dims, packed);
    absl::StatusOr<Desc> rowsum = g.Virtual(f32, rd, rs);
    if (!prod.ok() || !rowsum.ok()) return absl::InternalError("virtual tensor");
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, *d_o, &*o, nullptr, *prod));
    DATTN_RETURN_IF_ERROR(g.Reduce(CUDNN_REDUCE_TENSOR_ADD, *prod, *rowsum));
    DATTN_RETURN_IF_ERROR(
        g.Pointwise(CUDNN_POINTWISE_MUL, f32, *rowsum, &*delta_scale, nullptr, *softmax_sum));
    // P = exp(scale * Q K^T - Stats), masked.
    absl::StatusOr<Desc> s1 = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> s2 = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> s3 = g.Virtual(f32, sd, ss);
    if (!s1.ok() || !s2.ok() || !s3.ok()) return absl::InternalError("virtual tensor");
    DATTN_RETURN_IF_ERROR(g.Matmul(*q, *kt, *s1));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, *s1, &*scale, nullptr, *s2));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, f32, *s2, &*stats, nullptr, *s3));
    Desc logits = *s3;
    if (sh.causal) {
      absl::StatusOr<Desc> neg_inf = g.Scalar(kNegInf);
      if (!neg_inf.ok()) return neg_inf.status();
      absl::StatusOr<Desc> masked = g.CausalMask(logits, sd, ss, *neg_inf);
      if (!masked.ok()) return masked.status();
      logits = *masked;
    }
    absl::StatusOr<Desc> p = g.Virtual(f32, sd, ss);
    if (!p.ok()) return p.status();
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_EXP, f32, logits, nullptr, nullptr, *p));
    // dV = P^T dO
    const Dims td = {sh.batch, sh.heads, sh.seq, sh.seq};
    const Dims ts = {sh.heads * sh.seq * sh.seq, sh.seq * sh.seq, 1, sh.seq};
    absl::StatusOr<Desc> pt = g.Virtual(io, td, ts);
    if (!pt.ok()) return pt.status();
    DATTN_RETURN_IF_ERROR(g.Reshape(*p, *pt));
    DATTN_RETURN_IF_ERROR(g.Matmul(*pt, *d_o, *dv));
    // dS = P * (dO V^T - softmax_sum) * scale
    absl::StatusOr<Desc> dp = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> dp2 = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> ds0 = g.Virtual(f32, sd, ss);
    absl::StatusOr<Desc> ds = g.Virtual(f32, sd, ss);
    for (const auto* d : {&dp, &dp2, &ds0, &ds}) {
      if (!d->ok()) return d->status();
    }
    DATTN_RETURN_IF_ERROR(g.Matmul(*d_o, *vt, *dp));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_SUB, f32, *dp, &*softmax_sum, nullptr, *dp2));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, *dp2, &*p, nullptr, *ds0));
    DATTN_RETURN_IF_ERROR(g.Pointwise(CUDNN_POINTWISE_MUL, f32, *ds0, &*scale, nullptr, *ds));
    // dK = dS^T Q
    absl::StatusOr<Desc> dst = g.Virtual(io, td, ts);
    if (!dst.ok()) return dst.status();
    DATTN_RETURN_IF_ERROR(g.Reshape(*ds, *dst));
    DATTN_RETURN_IF_ERROR(g.Matmul(*dst, *q, *dk));
    // dQ = dS K through the fp32 accumulator.
    absl::StatusOr<Desc> k = g.Virtual(io, dims, Strides(a.k_strides));
    if (!k.ok()) return k.status();
    DATTN_RETURN_IF_ERROR(g.Reshape(*kt, *k));
    DATTN_RETURN_IF_ERROR(g.Matmul(*ds, *k, *dq_accum));
    DATTN_RETURN_IF_ERROR(
        g.Pointwise(CUDNN_POINTWISE_IDENTITY, f32, *dq_accum, nullptr, nullptr, *dq));
    return BuildPlan(static_cast<cudnnHandle_t>(handle_), g, "backward");
  };
  return CachedPlan(key, build);
}

absl::StatusOr<int64_t> CudnnSdpa::ForwardWorkspace(const SdpaForwardArgs& args) {
  absl::StatusOr<Plan*> plan = ForwardPlan(args);
  if (!plan.ok()) return plan.status();
  return (*plan)->workspace;
}

absl::StatusOr<int64_t> CudnnSdpa::BackwardWorkspace(const SdpaBackwardArgs& args) {
  absl::StatusOr<Plan*> plan = BackwardPlan(args);
  if (!plan.ok()) return plan.status();
  return (*plan)->workspace;
}

absl::Status CudnnSdpa::Forward(const SdpaForwardArgs& a, void* workspace) {
  absl::StatusOr<Plan*> plan = ForwardPlan(a);
  if (!plan.ok()) return plan.status();
  float scale = a.scale;
  float neg_inf = std::numeric_limits<float>::lowest();
  float p_scale = a.p_scale;
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs = {
      const_cast<void*>(a.q), const_cast<void*>(a.k), const_cast<void*>(a.v), a.o, a.stats, &scale};
  if (a.shape.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  if (a.p_scale != 1.0f) {
    uids.push_back(kPScale);
    ptrs.push_back(&p_scale);
  }
  DATTN_RETURN_IF_ERROR(
      Execute(static_cast<cudnnHandle_t>(handle_), **plan, uids, ptrs, workspace));
  ++counters_.executions;
  return absl::OkStatus();
}

absl::Status CudnnSdpa::Backward(const SdpaBackwardArgs& a, void* workspace) {
  absl::StatusOr<Plan*> plan = BackwardPlan(a);
  if (!plan.ok()) return plan.status();
  float scale = a.scale;
  float delta_scale = 1.0f;
  float neg_inf = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids = {kQ,  kK,  kV,     kO,          kDO,         kStats,  kDQ,
                               kDK, kDV, kScale, kDeltaScale, kSoftmaxSum, kDQAccum};
  std::vector<void*> ptrs = {const_cast<void*>(a.q),
                             const_cast<void*>(a.k),
                             const_cast<void*>(a.v),
                             const_cast<void*>(a.o),
                             const_cast<void*>(a.dout),
                             const_cast<float*>(a.stats),
                             a.dq,
                             a.dk,
                             a.dv,
                             &scale,
                             &delta_scale,
                             a.softmax_sum,
                             a.dq_accum};
  if (a.shape.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  DATTN_RETURN_IF_ERROR(
      Execute(static_cast<cudnnHandle_t>(handle_), **plan, uids, ptrs, workspace));
  ++counters_.executions;
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace dattn
