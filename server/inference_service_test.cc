// InferenceService (the Open Inference Protocol v2) over a real gRPC server and the generated
// inference::GRPCInferenceService::Stub, with an AttendFn fake that runs the attention on the CPU
// backend and answers like Coordinator::Attend: outputs against the float64 oracle (both modes,
// causal or not, forward and backward, raw and typed contents, FP32 and FP64); what the adapter
// hands Attend (the start, the tenant from the token, input chunks of at most 4 MiB in order);
// every malformed request INVALID_ARGUMENT naming the tensor or parameter, before any Attend
// call; another model NOT_FOUND; an answer that departs from Attend's protocol INTERNAL; health
// and metadata; the dattn_inference_* metrics. The real coordinator behind it:
// tests/inference_e2e_test.
#include "server/inference_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "api/engine_convert.h"
#include "api/limits.h"
#include "engine/attention.h"
#include "engine/cpu_backend.h"
#include "engine/testing/oracle.h"
#include "engine/testing/test_util.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "security/tokens.h"

namespace dattn {
namespace server {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;
using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-token-0123456789";  // Tenant "acme".
constexpr char kBobToken[] = "bob-token-0123456789";      // Tenant "beta".

DType EngineDType(const std::string& datatype) {
  return datatype == "FP64" ? DType::kFloat64 : DType::kFloat32;
}

// `values` as little-endian elements of `datatype` (FP32 or FP64).
std::string Encode(const std::vector<double>& values, const std::string& datatype) {
  std::string bytes;
  if (datatype == "FP64") {
    bytes.resize(values.size() * sizeof(double));
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else {
    std::vector<float> f(values.begin(), values.end());
    bytes.resize(f.size() * sizeof(float));
    std::memcpy(bytes.data(), f.data(), bytes.size());
  }
  return bytes;
}

std::vector<double> Decode(const std::string& bytes, const std::string& datatype) {
  std::vector<double> values;
  if (datatype == "FP64") {
    values.resize(bytes.size() / sizeof(double));
    std::memcpy(values.data(), bytes.data(), values.size() * sizeof(double));
  } else {
    std::vector<float> f(bytes.size() / sizeof(float));
    std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
    values.assign(f.begin(), f.end());
  }
  return values;
}

// The AttendFn fake: takes the call as Coordinator::Attend does (start, then q, k, v and dout in
// chunks), computes it on the CPU backend, and answers accepted, out (dq, dk, dv) in chunks of at
// most 4 MiB, done. `misbehave` makes it depart from the protocol on purpose.
class FakeAttend {
 public:
  enum class Misbehave { kNone, kGap, kShort, kForeignTensor, kNoDone, kDqBeforeOut, kFail };

  absl::Status Call(const v1::AttendRequest& first, const AttendSource& next,
                    const AttendSink& emit, const CancelledFn&) {
    calls_.fetch_add(1);
    if (!first.has_start()) return absl::InvalidArgumentError("start: missing");
    const v1::AttendStart& start = first.start();
    {
      absl::MutexLock lock(&mu_);
      start_ = start;
    }
    if (misbehave_ == Misbehave::kFail) {
      return absl::ResourceExhaustedError("fits no worker: 3 GiB per rank, 1 GiB free");
    }
    const int count = start.backward() ? 4 : 3;
    std::vector<std::string> inputs(4);
    v1::AttendRequest message;
    int expected = 0;  // The input being received.
    while (next(&message)) {
      const v1::AttendChunk& c = message.chunk();
      const int t = static_cast<int>(c.tensor()) - static_cast<int>(v1::ATTEND_TENSOR_Q);
      absl::MutexLock lock(&mu_);
      max_input_chunk_ = std::max<int64_t>(max_input_chunk_, c.data().size());
      input_chunks_++;
      if (!message.has_chunk() || t < expected || t >= count || c.data().empty() ||
          static_cast<int64_t>(c.data().size()) > api::kMaxOutputChunkBytes ||
          c.offset() != static_cast<int64_t>(inputs[static_cast<size_t>(t)].size())) {
        input_errors_.push_back(absl::StrCat("tensor ", t, " offset ", c.offset(), " size ",
                                             c.data().size(), " while at ", expected));
        continue;
      }
      expected = t;
      inputs[static_cast<size_t>(t)] += c.data();
    }
    absl::StatusOr<AttentionSpec> spec = api::ToEngineSpec(start.attention());
    if (!spec.ok()) return spec.status();
    absl::StatusOr<DType> dtype = api::ToEngineDType(start.dtype());
    if (!dtype.ok()) return dtype.status();
    const v1::TensorShape& s = start.shape();
    const std::vector<int64_t> dims = {s.batch(), s.seq_len(), s.num_heads(), s.head_dim()};
    const size_t bytes =
        static_cast<size_t>(s.batch() * s.seq_len() * s.num_heads() * s.head_dim()) *
        DTypeSize(*dtype);
    for (int t = 0; t < count; ++t) {
      if (inputs[static_cast<size_t>(t)].size() != bytes) {
        return absl::InvalidArgumentError(absl::StrCat("input ", t, " incomplete"));
      }
    }
    auto view = [&](std::string& data) {
      return TensorView::Contiguous(data.data(), *dtype, dims);
    };
    const DType lse_dtype = *dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    std::string lse(
        static_cast<size_t>(s.batch() * s.num_heads() * s.seq_len()) * DTypeSize(lse_dtype), '\0');
    std::vector<std::string> outputs(count == 4 ? 4 : 1, std::string(bytes, '\0'));
    CpuBackendOptions options;
    options.num_threads = 1;
    std::unique_ptr<AttentionBackend> backend = NewCpuBackend(options);
    ForwardArgs f{
        view(inputs[0]), view(inputs[1]), view(inputs[2]), view(outputs[0]),
        TensorView::Contiguous(lse.data(), lse_dtype, {s.batch(), s.num_heads(), s.seq_len()})};
    if (absl::Status st = backend->Forward(*spec, f); !st.ok()) return st;
    if (count == 4) {
      BackwardArgs b{f.q,
                     f.k,
                     f.v,
                     f.out,
                     f.lse,
                     view(inputs[3]),
                     view(outputs[1]),
                     view(outputs[2]),
                     view(outputs[3])};
      if (absl::Status st = backend->Backward(*spec, b); !st.ok()) return st;
    }

    v1::AttendResponse r;
    r.mutable_accepted()->set_job_id("j-fake");
    r.mutable_accepted()->set_num_ranks(1);
    if (!Emit(emit, r)) return absl::CancelledError("emit failed");
    std::vector<int> order;
    for (int t = 0; t < static_cast<int>(outputs.size()); ++t) order.push_back(t);
    if (misbehave_ == Misbehave::kDqBeforeOut) order = {1, 0, 2, 3};
    for (int t : order) {
      const std::string& out = outputs[static_cast<size_t>(t)];
      size_t end = out.size();
      if (misbehave_ == Misbehave::kShort && t == static_cast<int>(outputs.size()) - 1) end -= 4;
      for (size_t offset = 0; offset < end; offset += static_cast<size_t>(chunk_bytes_)) {
        v1::AttendResponse c;
        c.mutable_chunk()->set_tensor(static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_OUT + t));
        c.mutable_chunk()->set_offset(static_cast<int64_t>(offset));
        c.mutable_chunk()->set_data(
            out.substr(offset, std::min<size_t>(static_cast<size_t>(chunk_bytes_), end - offset)));
        if (misbehave_ == Misbehave::kGap && offset > 0) {
          c.mutable_chunk()->set_offset(static_cast<int64_t>(offset) + 8);
        }
        if (!Emit(emit, c)) return absl::CancelledError("emit failed");
      }
    }
    if (misbehave_ == Misbehave::kForeignTensor) {
      v1::AttendResponse c;
      c.mutable_chunk()->set_tensor(v1::ATTEND_TENSOR_DQ);
      c.mutable_chunk()->set_data("abcd");
      if (!Emit(emit, c)) return absl::CancelledError("emit failed");
    }
    if (misbehave_ == Misbehave::kNoDone) return absl::OkStatus();
    v1::AttendResponse done;
    done.mutable_done()->set_seconds_per_step(0.25);
    if (!Emit(emit, done)) return absl::CancelledError("emit failed");
    return absl::OkStatus();
  }

  Misbehave misbehave_ = Misbehave::kNone;
  int64_t chunk_bytes_ = api::kMaxOutputChunkBytes;
  std::atomic<int> calls_{0};
  std::atomic<bool> emit_refused_{false};

  v1::AttendStart start() {
    absl::MutexLock lock(&mu_);
    return start_;
  }
  int64_t max_input_chunk() {
    absl::MutexLock lock(&mu_);
    return max_input_chunk_;
  }
  int input_chunks() {
    absl::MutexLock lock(&mu_);
    return input_chunks_;
  }
  std::vector<std::string> input_errors() {
    absl::MutexLock lock(&mu_);
    return input_errors_;
  }

 private:
  bool Emit(const AttendSink& emit, const v1::AttendResponse& r) {
    if (emit(r)) return true;
    emit_refused_ = true;
    return false;
  }

  absl::Mutex mu_;
  v1::AttendStart start_ ABSL_GUARDED_BY(mu_);
  int64_t max_input_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  int input_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> input_errors_ ABSL_GUARDED_BY(mu_);
};

// The coordinator's side of deployments: a job table and a Score that answers
// logprobs[i] = -(tokens[i + 1] + 1) / 64 for a vocabulary of 256.
class FakeDeployments {
 public:
  FakeDeployments() {
    Add("dep-acme", "acme", true, true);
    Add("dep-loading", "acme", true, false);
    Add("dep-beta", "beta", true, true);
    Add("train-acme", "acme", false, false);
  }
  DeploymentCalls Calls() {
    return DeploymentCalls{
        [this](const std::string& id) -> absl::StatusOr<v1::Job> {
          absl::MutexLock lock(&mu_);
          auto it = jobs_.find(id);
          if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
          return it->second;
        },
        [this](const std::string& id) -> absl::Status {
          absl::MutexLock lock(&mu_);
          return serving_.count(id) > 0 ? absl::OkStatus()
                                        : absl::FailedPreconditionError("loading its model");
        },
        [this](const v1::ScoreRequest& request,
               const CancelledFn&) -> absl::StatusOr<v1::ScoreResponse> {
          absl::MutexLock lock(&mu_);
          ++scores_;
          last_ = request;
          if (serving_.count(request.deployment_id()) == 0) {
            return absl::FailedPreconditionError(
                absl::StrCat("deployment ", request.deployment_id(), " is not serving yet"));
          }
          std::vector<int32_t> tokens(request.tokens().begin(), request.tokens().end());
          for (unsigned char c : request.text()) tokens.push_back(c);
          v1::ScoreResponse r;
          double sum = 0;
          for (size_t i = 0; i < tokens.size(); ++i) {
            if (tokens[i] < 0 || tokens[i] >= 256) {
              return absl::InvalidArgumentError(
                  absl::StrCat("tokens[", i, "]: ", tokens[i], " is outside the vocabulary"));
            }
            if (i == 0) continue;
            r.add_logprobs(-(tokens[i] + 1) / 64.0);
            sum += r.logprobs(static_cast<int>(i - 1));
          }
          r.set_tokens(static_cast<int64_t>(tokens.size()));
          r.set_loss(tokens.size() > 1 ? -sum / static_cast<double>(tokens.size() - 1) : 0);
          r.set_seconds(0.25);
          return r;
        }};
  }
  int scores() {
    absl::MutexLock lock(&mu_);
    return scores_;
  }
  v1::ScoreRequest last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  void Add(const std::string& id, const std::string& tenant, bool deployment, bool serving) {
    absl::MutexLock lock(&mu_);
    v1::Job job;
    job.set_job_id(id);
    job.mutable_spec()->set_tenant(tenant);
    if (deployment) job.mutable_spec()->mutable_deployment()->set_checkpoint("/models/m");
    jobs_[id] = job;
    if (serving) serving_.insert(id);
  }
  absl::Mutex mu_;
  std::map<std::string, v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> serving_ ABSL_GUARDED_BY(mu_);
  int scores_ ABSL_GUARDED_BY(mu_) = 0;
  v1::ScoreRequest last_ ABSL_GUARDED_BY(mu_);
};

class InferenceServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string path =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/inference_tokens_", getpid(), "_", counter++);
    {
      std::ofstream file(path);
      file << security::HashToken(kAliceToken) << " acme user alice\n";
      file << security::HashToken(kBobToken) << " beta user bob\n";
    }
    absl::StatusOr<std::unique_ptr<security::TokenTable>> tokens = security::TokenTable::Load(path);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    tokens_ = *std::move(tokens);
    AccessOptions options;
    options.tokens = tokens_.get();
    absl::StatusOr<std::unique_ptr<Access>> access = Access::Create(options);
    ASSERT_TRUE(access.ok()) << access.status();
    access_ = *std::move(access);
    service_ = std::make_unique<InferenceService>(
        [this](const v1::AttendRequest& first, const AttendSource& next, const AttendSink& emit,
               const CancelledFn& cancelled) { return fake_.Call(first, next, emit, cancelled); },
        [this] { return health_; }, deployments_.Calls(), &metrics_, access_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(api::kMaxMessageBytes);
    builder.SetMaxSendMessageSize(api::kMaxMessageBytes);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(api::kMaxMessageBytes);
    args.SetMaxSendMessageSize(api::kMaxMessageBytes);
    stub_ = inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // A call of `method` with `token` (none when empty).
  template <typename Request, typename Response, typename Method>
  grpc::Status Call(Method method, const Request& request, Response* response,
                    const std::string& token = kAliceToken) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return ((*stub_).*method)(&context, request, response);
  }

  grpc::Status Infer(const ModelInferRequest& request, ModelInferResponse* response,
                     const std::string& token = kAliceToken) {
    return Call(&inference::GRPCInferenceService::Stub::ModelInfer, request, response, token);
  }

  std::string Metric(const std::string& prefix) {
    const std::string text = metrics_.Serialize();
    const size_t at = text.find(prefix);
    if (at == std::string::npos) return "(absent)";
    return text.substr(at + prefix.size() + 1, text.find('\n', at) - at - prefix.size() - 1);
  }

  FakeAttend fake_;
  FakeDeployments deployments_;
  absl::Status health_;
  Metrics metrics_;
  std::unique_ptr<security::TokenTable> tokens_;
  std::unique_ptr<Access> access_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

// What one test call asks for.
struct Problem {
  std::string datatype = "FP32";
  int64_t batch = 2, seq_len = 32, heads = 4, dim = 8;
  std::string segments = "8,16", rates = "1,2";
  std::string mode = "grouped";
  bool causal = false;
  bool backward = false;
  bool typed = false;
  std::vector<int64_t> ShapeDims() const { return {batch, seq_len, heads, dim}; }
  int64_t Elements() const { return batch * seq_len * heads * dim; }
};

// q, k, v (and dout) of `p`, as the datatype holds them.
std::vector<std::vector<double>> Inputs(const Problem& p, uint64_t seed) {
  std::vector<std::vector<double>> inputs;
  for (int t = 0; t < (p.backward ? 4 : 3); ++t) {
    std::vector<double> x = testutil::RandomValues(p.Elements(), seed + static_cast<uint64_t>(t));
    for (double& e : x) e = testutil::RoundToDType(e, EngineDType(p.datatype));
    inputs.push_back(std::move(x));
  }
  return inputs;
}

ModelInferRequest Request(const Problem& p, const std::vector<std::vector<double>>& inputs) {
  ModelInferRequest r;
  r.set_model_name("dilated-attention");
  r.set_id("req-7");
  const char* names[] = {"q", "k", "v", "dout"};
  for (size_t t = 0; t < inputs.size(); ++t) {
    auto* in = r.add_inputs();
    in->set_name(names[t]);
    in->set_datatype(p.datatype);
    for (int64_t d : p.ShapeDims()) in->add_shape(d);
    if (p.typed) {
      for (double x : inputs[t]) {
        if (p.datatype == "FP64") {
          in->mutable_contents()->add_fp64_contents(x);
        } else {
          in->mutable_contents()->add_fp32_contents(static_cast<float>(x));
        }
      }
    } else {
      r.add_raw_input_contents(Encode(inputs[t], p.datatype));
    }
  }
  auto& params = *r.mutable_parameters();
  params["segment_lengths"].set_string_param(p.segments);
  params["dilation_rates"].set_string_param(p.rates);
  params["mode"].set_string_param(p.mode);
  params["causal"].set_bool_param(p.causal);
  return r;
}

// The oracle's spec for `p`, written from the test's own parameters.
AttentionSpec OracleSpec(const Problem& p) {
  AttentionSpec spec;
  for (absl::string_view w : absl::StrSplit(p.segments, ',')) {
    spec.segment_lengths.push_back(std::stoll(std::string(w)));
  }
  for (absl::string_view r : absl::StrSplit(p.rates, ',')) {
    spec.dilation_rates.push_back(std::stoll(std::string(r)));
  }
  spec.mode = p.mode == "mixture" ? AttentionMode::kMixture : AttentionMode::kGrouped;
  spec.causal = p.causal;
  return spec;
}

// Runs `p` (its request changed by `change`, when given) through `infer` and checks every output
// against the oracle under `spec`.
using InferFn = std::function<grpc::Status(const ModelInferRequest&, ModelInferResponse*)>;
void CheckAgainstOracle(const Problem& p, const InferFn& infer, const AttentionSpec& spec,
                        const std::function<void(ModelInferRequest*)>& change = nullptr) {
  SCOPED_TRACE(absl::StrCat(p.datatype, " ", p.mode, p.causal ? " causal" : "",
                            p.backward ? " backward" : "", p.typed ? " typed" : " raw"));
  const std::vector<std::vector<double>> inputs = Inputs(p, 1234);
  ModelInferRequest request = Request(p, inputs);
  if (change) change(&request);
  ModelInferResponse response;
  grpc::Status status = infer(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const oracle::Shape shape{p.batch, p.seq_len, p.heads, p.dim};
  absl::StatusOr<oracle::ForwardResult> ref =
      oracle::Forward(spec, shape, inputs[0], inputs[1], inputs[2]);
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<std::vector<double>> want = {ref->out};
  if (p.backward) {
    absl::StatusOr<oracle::Gradients> g =
        oracle::Backward(spec, shape, inputs[0], inputs[1], inputs[2], inputs[3]);
    ASSERT_TRUE(g.ok()) << g.status();
    want.push_back(g->dq);
    want.push_back(g->dk);
    want.push_back(g->dv);
  }
  const char* names[] = {"out", "dq", "dk", "dv"};
  EXPECT_EQ(response.model_name(), "dilated-attention");
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_EQ(response.id(), "req-7");
  EXPECT_EQ(response.parameters().at("job_id").string_param(), "j-fake");
  EXPECT_EQ(response.parameters().at("num_ranks").int64_param(), 1);
  ASSERT_EQ(response.outputs_size(), static_cast<int>(want.size()));
  ASSERT_EQ(response.raw_output_contents_size(), static_cast<int>(want.size()));
  for (size_t t = 0; t < want.size(); ++t) {
    const auto& out = response.outputs(static_cast<int>(t));
    EXPECT_EQ(out.name(), names[t]);
    EXPECT_EQ(out.datatype(), p.datatype);
    EXPECT_THAT(out.shape(), ::testing::ElementsAreArray(p.ShapeDims()));
    EXPECT_TRUE(testutil::RelativelyNear(
        names[t], Decode(response.raw_output_contents(static_cast<int>(t)), p.datatype), want[t],
        testutil::SpecTolerance(EngineDType(p.datatype))));
  }
}

TEST_F(InferenceServiceTest, ModelInferAgainstTheOracle) {
  auto infer = [this](const ModelInferRequest& r, ModelInferResponse* out) {
    return Infer(r, out);
  };
  for (const char* mode : {"grouped", "mixture"}) {
    for (bool causal : {false, true}) {
      for (bool backward : {false, true}) {
        Problem p;
        p.mode = mode;
        p.causal = causal;
        p.backward = backward;
        p.typed = causal;  // Typed fp32_contents half the time, raw the other half.
        CheckAgainstOracle(p, infer, OracleSpec(p));
      }
    }
  }
  // FP64, raw and typed.
  for (bool typed : {false, true}) {
    Problem p;
    p.datatype = "FP64";
    p.mode = "mixture";
    p.backward = true;
    p.typed = typed;
    CheckAgainstOracle(p, infer, OracleSpec(p));
  }
  EXPECT_EQ(fake_.calls_.load(), 10);
  EXPECT_THAT(fake_.input_errors(), ::testing::IsEmpty());
}

TEST_F(InferenceServiceTest, ParametersReachTheAttendStart) {
  Problem p;
  p.mode = "mixture";
  p.backward = true;
  p.segments = "16";
  p.rates = "2";
  AttentionSpec spec;
  spec.segment_lengths = {16};
  spec.dilation_rates = {2};
  spec.mode = AttentionMode::kMixture;
  spec.head_offsets = HeadOffsets::kBlocked;
  spec.scale = 0.5;
  // The outputs follow the oracle under the parameters, and the start carries them all.
  CheckAgainstOracle(
      p,
      [this](const ModelInferRequest& r, ModelInferResponse* out) {
        return Infer(r, out, kBobToken);
      },
      spec,
      [](ModelInferRequest* r) {
        auto& params = *r->mutable_parameters();
        params["scale"].set_double_param(0.5);
        params["head_offsets"].set_string_param("blocked");
        params["num_ranks"].set_int64_param(2);
        params["device"].set_string_param("cpu");
        params["priority"].set_int64_param(-5);
        params["segment_lengths"].set_int64_param(16);  // An int64 for one pattern.
        params["dilation_rates"].set_int64_param(2);
      });
  const v1::AttendStart start = fake_.start();
  EXPECT_EQ(start.tenant(), "beta");  // Bob's token's tenant.
  EXPECT_EQ(start.dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(start.shape().batch(), 2);
  EXPECT_EQ(start.shape().seq_len(), 32);
  EXPECT_EQ(start.shape().num_heads(), 4);
  EXPECT_EQ(start.shape().head_dim(), 8);
  EXPECT_TRUE(start.backward());
  EXPECT_EQ(start.num_ranks(), 2);
  EXPECT_EQ(start.device(), v1::DEVICE_PREFERENCE_CPU);
  EXPECT_EQ(start.priority(), -5);
  EXPECT_EQ(start.attention().mode(), v1::ATTENTION_MODE_MIXTURE);
  EXPECT_EQ(start.attention().head_offsets(), v1::HEAD_OFFSETS_BLOCKED);
  EXPECT_THAT(start.attention().segment_lengths(), ::testing::ElementsAre(16));
  EXPECT_THAT(start.attention().dilation_rates(), ::testing::ElementsAre(2));
  EXPECT_DOUBLE_EQ(start.attention().scale(), 0.5);
  EXPECT_FALSE(start.attention().causal());

  // Alice's calls are her tenant's.
  ModelInferResponse response;
  ASSERT_TRUE(Infer(Request(p, Inputs(p, 3)), &response).ok());
  EXPECT_EQ(fake_.start().tenant(), "acme");
}

TEST_F(InferenceServiceTest, TensorsOverFourMiBTravelInChunksOfAtMostFourMiB) {
  Problem p;
  p.batch = 1;
  p.seq_len = 4096;
  p.heads = 4;
  p.dim = 80;  // 1,310,720 fp32 elements: 5 MiB per tensor.
  p.segments = "64";
  p.rates = "1";
  const int64_t bytes = p.Elements() * 4;
  ASSERT_GT(bytes, api::kMaxOutputChunkBytes);
  fake_.chunk_bytes_ = api::kMaxOutputChunkBytes;
  CheckAgainstOracle(
      p, [this](const ModelInferRequest& r, ModelInferResponse* out) { return Infer(r, out); },
      OracleSpec(p));
  EXPECT_EQ(fake_.max_input_chunk(), api::kMaxOutputChunkBytes);
  EXPECT_EQ(fake_.input_chunks(), 3 * 2);  // q, k, v: 4 MiB and 1 MiB each.
  EXPECT_THAT(fake_.input_errors(), ::testing::IsEmpty());

  // Outputs assembled from many small chunks.
  fake_.chunk_bytes_ = 1000;
  Problem small;
  small.backward = true;
  CheckAgainstOracle(
      small, [this](const ModelInferRequest& r, ModelInferResponse* out) { return Infer(r, out); },
      OracleSpec(small));
}

TEST_F(InferenceServiceTest, MalformedRequestsNameTheTensorOrParameter) {
  Problem p;
  p.backward = true;
  const std::vector<std::vector<double>> inputs = Inputs(p, 5);
  struct Case {
    const char* what;
    std::function<void(ModelInferRequest*)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"wrong byte length",
       [](ModelInferRequest* r) { r->mutable_raw_input_contents(1)->pop_back(); },
       "input \"k\": 8191 bytes of raw contents, expected 8192 (shape [2, 32, 4, 8] of FP32)"},
      {"shapes differ", [](ModelInferRequest* r) { r->mutable_inputs(2)->set_shape(1, 16); },
       "input \"v\": shape [2, 16, 4, 8] is not q's ([2, 32, 4, 8])"},
      {"q's shape not 4-d",
       [](ModelInferRequest* r) {
         for (int i = 0; i < 4; ++i) r->mutable_inputs(i)->mutable_shape()->RemoveLast();
       },
       "input \"q\": shape [2, 32, 4] is not (B, N, H, D)"},
      {"unknown datatype",
       [](ModelInferRequest* r) {
         for (int i = 0; i < 4; ++i) r->mutable_inputs(i)->set_datatype("INT8");
       },
       "input \"q\": datatype \"INT8\" is not FP32, FP64, FP16 or BF16"},
      {"datatypes differ", [](ModelInferRequest* r) { r->mutable_inputs(3)->set_datatype("FP64"); },
       "input \"dout\": datatype \"FP64\" is not q's (FP32)"},
      {"missing v",
       [](ModelInferRequest* r) {
         r->mutable_inputs()->DeleteSubrange(2, 1);
         r->mutable_raw_input_contents()->DeleteSubrange(2, 1);
       },
       "input \"v\": required (q, k and v)"},
      {"unknown input", [](ModelInferRequest* r) { r->mutable_inputs(3)->set_name("x"); },
       "inputs[3]: unknown input \"x\""},
      {"repeated input", [](ModelInferRequest* r) { r->mutable_inputs(3)->set_name("k"); },
       "input \"k\": given twice"},
      {"raw contents of another count",
       [](ModelInferRequest* r) { r->mutable_raw_input_contents()->RemoveLast(); },
       "raw_input_contents: 3 entries for 4 inputs"},
      {"typed contents of the wrong count",
       [&](ModelInferRequest* r) {
         r->clear_raw_input_contents();
         for (int i = 0; i < 4; ++i) {
           for (double x : inputs[static_cast<size_t>(i)]) {
             r->mutable_inputs(i)->mutable_contents()->add_fp32_contents(static_cast<float>(x));
           }
         }
         r->mutable_inputs(0)->mutable_contents()->mutable_fp32_contents()->RemoveLast();
       },
       "input \"q\": contents hold 2047 fp32 and 0 fp64 values"},
      {"FP16 as typed contents",
       [](ModelInferRequest* r) {
         r->clear_raw_input_contents();
         for (int i = 0; i < 4; ++i) {
           r->mutable_inputs(i)->set_datatype("FP16");
           r->mutable_inputs(i)->mutable_contents()->add_fp32_contents(1);
         }
       },
       "input \"q\": FP16 travels only as raw_input_contents"},
      {"FP16 raw of FP32's length",
       [](ModelInferRequest* r) {
         for (int i = 0; i < 4; ++i) r->mutable_inputs(i)->set_datatype("FP16");
       },
       "input \"q\": 8192 bytes of raw contents, expected 4096 (shape [2, 32, 4, 8] of FP16)"},
      {"unknown parameter",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["window"].set_int64_param(3); },
       "parameters[\"window\"]: unknown"},
      {"bad mode",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["mode"].set_string_param("dense"); },
       "parameters[\"mode\"]: \"dense\" is not \"grouped\" or \"mixture\""},
      {"mistyped causal",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["causal"].set_string_param("yes"); },
       "parameters[\"causal\"]: a bool"},
      {"bad segment list",
       [](ModelInferRequest* r) {
         (*r->mutable_parameters())["segment_lengths"].set_string_param("8,x");
       },
       "parameters[\"segment_lengths\"]: \"x\" in \"8,x\" is not an integer"},
      {"missing dilation_rates",
       [](ModelInferRequest* r) { r->mutable_parameters()->erase("dilation_rates"); },
       "parameters[\"dilation_rates\"]: required"},
      {"bad device",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["device"].set_string_param("tpu"); },
       "parameters[\"device\"]: \"tpu\" is not \"any\", \"cpu\" or \"gpu\""},
      {"bad head_offsets",
       [](ModelInferRequest* r) {
         (*r->mutable_parameters())["head_offsets"].set_string_param("random");
       },
       "parameters[\"head_offsets\"]: \"random\" is not \"modulo\" or \"blocked\""},
      {"priority out of range",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["priority"].set_int64_param(1000); },
       "parameters[\"priority\"]: 1000 is not in -100 .. 100"},
      {"num_ranks negative",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["num_ranks"].set_int64_param(-1); },
       "parameters[\"num_ranks\"]: -1 is not in 0 .. 256"},
      {"unknown output", [](ModelInferRequest* r) { r->add_outputs()->set_name("lse"); },
       "outputs[0]: unknown output \"lse\""},
      {"a gradient without dout",
       [](ModelInferRequest* r) {
         r->mutable_inputs()->RemoveLast();
         r->mutable_raw_input_contents()->RemoveLast();
         r->add_outputs()->set_name("dq");
       },
       "outputs[0]: dq needs the input dout (the backward)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ModelInferRequest request = Request(p, inputs);
    c.change(&request);
    ModelInferResponse response;
    grpc::Status status = Infer(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  EXPECT_EQ(fake_.calls_.load(), 0);  // Refused before any Attend call.
  EXPECT_EQ(Metric("dattn_inference_requests_total{code=\"INVALID_ARGUMENT\",model=\"dilated-"
                   "attention\",tenant=\"acme\"}"),
            absl::StrCat(cases.size()));
}

TEST_F(InferenceServiceTest, AnotherModelOrVersionIsNotFound) {
  Problem p;
  ModelInferRequest request = Request(p, Inputs(p, 3));
  request.set_model_name("resnet");
  ModelInferResponse response;
  grpc::Status status = Infer(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("model \"resnet\" not found"));
  request.set_model_name("dilated-attention");
  request.set_model_version("2");
  status = Infer(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("has no version \"2\""));

  inference::ModelReadyRequest ready;
  ready.set_name("resnet");
  inference::ModelReadyResponse ready_response;
  EXPECT_EQ(
      Call(&inference::GRPCInferenceService::Stub::ModelReady, ready, &ready_response).error_code(),
      grpc::StatusCode::NOT_FOUND);
  inference::ModelMetadataRequest meta;
  meta.set_name("dilated-attention");
  meta.set_version("0");
  inference::ModelMetadataResponse meta_response;
  EXPECT_EQ(Call(&inference::GRPCInferenceService::Stub::ModelMetadata, meta, &meta_response)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(fake_.calls_.load(), 0);
}

TEST_F(InferenceServiceTest, AnAnswerThatDepartsFromTheProtocolIsInternal) {
  Problem p;
  const std::vector<std::vector<double>> inputs = Inputs(p, 11);
  struct Case {
    FakeAttend::Misbehave misbehave;
    bool backward;
    const char* message;
  };
  const std::vector<Case> cases = {
      {FakeAttend::Misbehave::kGap, false, "a chunk of out at offset 1008, expected 1000"},
      {FakeAttend::Misbehave::kShort, false, "done while output out had 8188 of its 8192 bytes"},
      {FakeAttend::Misbehave::kShort, true, "done while output dv had 8188 of its 8192 bytes"},
      {FakeAttend::Misbehave::kForeignTensor, false,
       "a chunk of tensor ATTEND_TENSOR_DQ (6), which is not an output of this call"},
      {FakeAttend::Misbehave::kDqBeforeOut, true, "a chunk of dq while out had 0 of its 8192"},
      {FakeAttend::Misbehave::kNoDone, false, "the Attend call ended OK without done"},
  };
  fake_.chunk_bytes_ = 1000;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    fake_.misbehave_ = c.misbehave;
    fake_.emit_refused_ = false;
    Problem q = p;
    q.backward = c.backward;
    ModelInferResponse response;
    grpc::Status status = Infer(Request(q, Inputs(q, 11)), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
    // The call is told to stop at the departure (not for a missing done: nothing to refuse).
    EXPECT_EQ(fake_.emit_refused_.load(), c.misbehave != FakeAttend::Misbehave::kNoDone);
  }
  // The AttendFn's own errors pass unchanged.
  fake_.misbehave_ = FakeAttend::Misbehave::kFail;
  ModelInferResponse response;
  grpc::Status status = Infer(Request(p, inputs), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("fits no worker"));
  EXPECT_EQ(Metric("dattn_inference_requests_total{code=\"INTERNAL\",model=\"dilated-attention\","
                   "tenant=\"acme\"}"),
            "6");
}

TEST_F(InferenceServiceTest, HealthAndMetadata) {
  using Stub = inference::GRPCInferenceService::Stub;
  inference::ServerLiveResponse live;
  ASSERT_TRUE(Call(&Stub::ServerLive, inference::ServerLiveRequest(), &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(Call(&Stub::ServerReady, inference::ServerReadyRequest(), &ready).ok());
  EXPECT_TRUE(ready.ready());
  inference::ModelReadyRequest model;
  model.set_name("dilated-attention");
  inference::ModelReadyResponse model_ready;
  ASSERT_TRUE(Call(&Stub::ModelReady, model, &model_ready).ok());
  EXPECT_TRUE(model_ready.ready());
  model.set_version("1");
  ASSERT_TRUE(Call(&Stub::ModelReady, model, &model_ready).ok());
  EXPECT_TRUE(model_ready.ready());

  // Not ready while the health function says so; still live.
  health_ = absl::UnavailableError("shutting down");
  ASSERT_TRUE(Call(&Stub::ServerReady, inference::ServerReadyRequest(), &ready).ok());
  EXPECT_FALSE(ready.ready());
  ASSERT_TRUE(Call(&Stub::ModelReady, model, &model_ready).ok());
  EXPECT_FALSE(model_ready.ready());
  ASSERT_TRUE(Call(&Stub::ServerLive, inference::ServerLiveRequest(), &live).ok());
  EXPECT_TRUE(live.live());

  inference::ServerMetadataResponse server;
  ASSERT_TRUE(Call(&Stub::ServerMetadata, inference::ServerMetadataRequest(), &server).ok());
  EXPECT_EQ(server.name(), "dattn");
  EXPECT_EQ(server.version(), "v1");
  EXPECT_EQ(server.extensions_size(), 0);

  inference::ModelMetadataRequest meta;
  meta.set_name("dilated-attention");
  inference::ModelMetadataResponse m;
  ASSERT_TRUE(Call(&Stub::ModelMetadata, meta, &m).ok());
  EXPECT_EQ(m.name(), "dilated-attention");
  EXPECT_THAT(m.versions(), ::testing::ElementsAre("1"));
  const char* inputs[] = {"q", "k", "v", "dout"};
  const char* outputs[] = {"out", "dq", "dk", "dv"};
  ASSERT_EQ(m.inputs_size(), 4);
  ASSERT_EQ(m.outputs_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(m.inputs(i).name(), inputs[i]);
    EXPECT_EQ(m.inputs(i).datatype(), "FP32");
    EXPECT_THAT(m.inputs(i).shape(), ::testing::ElementsAre(-1, -1, -1, -1));
    EXPECT_EQ(m.outputs(i).name(), outputs[i]);
    EXPECT_EQ(m.outputs(i).datatype(), "FP32");
    EXPECT_THAT(m.outputs(i).shape(), ::testing::ElementsAre(-1, -1, -1, -1));
  }
  EXPECT_THAT(m.properties().at("parameters"), HasSubstr("segment_lengths"));

  // Without a token: UNAUTHENTICATED, for health as for inference.
  EXPECT_EQ(Call(&Stub::ServerReady, inference::ServerReadyRequest(), &ready, "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  Problem p;
  ModelInferResponse response;
  EXPECT_EQ(Infer(Request(p, Inputs(p, 1)), &response, "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(fake_.calls_.load(), 0);
}

TEST_F(InferenceServiceTest, MetricsCountCallsBytesAndTime) {
  Problem p;
  const std::vector<std::vector<double>> inputs = Inputs(p, 21);
  ModelInferResponse response;
  ASSERT_TRUE(Infer(Request(p, inputs), &response).ok());
  ASSERT_TRUE(Infer(Request(p, inputs), &response).ok());
  ASSERT_TRUE(Infer(Request(p, inputs), &response, kBobToken).ok());
  ModelInferRequest bad = Request(p, inputs);
  bad.mutable_parameters()->erase("segment_lengths");
  EXPECT_FALSE(Infer(bad, &response, kBobToken).ok());

  const std::string labels = "model=\"dilated-attention\",tenant=\"acme\"";
  EXPECT_EQ(Metric(absl::StrCat("dattn_inference_requests_total{code=\"OK\",", labels, "}")), "2");
  EXPECT_EQ(Metric("dattn_inference_requests_total{code=\"OK\",model=\"dilated-attention\","
                   "tenant=\"beta\"}"),
            "1");
  EXPECT_EQ(Metric("dattn_inference_requests_total{code=\"INVALID_ARGUMENT\",model=\"dilated-"
                   "attention\",tenant=\"beta\"}"),
            "1");
  // 3 tensors of 8192 bytes in, one of 8192 out, per call.
  EXPECT_EQ(Metric(absl::StrCat("dattn_inference_bytes_total{direction=\"in\",", labels, "}")),
            "49152");
  EXPECT_EQ(Metric(absl::StrCat("dattn_inference_bytes_total{direction=\"out\",", labels, "}")),
            "16384");
  EXPECT_EQ(Metric("dattn_inference_request_seconds_count{model=\"dilated-attention\"}"), "4");
  EXPECT_EQ(Metric("dattn_rpc_total{code=\"OK\",method=\"/inference.GRPCInferenceService/"
                   "ModelInfer\"}"),
            "3");
}

// --- Deployments as models: ModelInfer is Score.

// A deployment request with one "tokens" input of `datatype`, shape [n] (or [1, n]), raw or typed.
ModelInferRequest TokensRequest(const std::string& model, const std::vector<int64_t>& tokens,
                                const std::string& datatype, bool raw, bool batched) {
  ModelInferRequest r;
  r.set_model_name(model);
  r.set_id("req-7");
  auto* in = r.add_inputs();
  in->set_name("tokens");
  in->set_datatype(datatype);
  if (batched) in->add_shape(1);
  in->add_shape(static_cast<int64_t>(tokens.size()));
  std::string bytes;
  for (int64_t t : tokens) {
    if (datatype == "INT32") {
      const int32_t v = static_cast<int32_t>(t);
      if (raw)
        bytes.append(reinterpret_cast<const char*>(&v), 4);
      else
        in->mutable_contents()->add_int_contents(v);
    } else {
      if (raw)
        bytes.append(reinterpret_cast<const char*>(&t), 8);
      else
        in->mutable_contents()->add_int64_contents(t);
    }
  }
  if (raw) r.add_raw_input_contents(bytes);
  return r;
}

std::vector<double> Doubles(const std::string& raw) {
  std::vector<double> v(raw.size() / 8);
  std::memcpy(v.data(), raw.data(), v.size() * 8);
  return v;
}

TEST_F(InferenceServiceTest, ModelInferOnADeploymentIsScore) {
  const std::vector<int64_t> tokens = {72, 105, 33, 0, 255};
  const std::vector<double> expected = {-106 / 64.0, -34 / 64.0, -1 / 64.0, -256 / 64.0};
  double loss = 0;
  for (double e : expected) loss -= e / 4;
  for (const char* datatype : {"INT32", "INT64"}) {
    for (bool raw : {false, true}) {
      for (bool batched : {false, true}) {
        SCOPED_TRACE(absl::StrCat(datatype, raw ? " raw" : " typed", batched ? " [1, N]" : " [N]"));
        ModelInferResponse response;
        grpc::Status status =
            Infer(TokensRequest("dep-acme", tokens, datatype, raw, batched), &response);
        ASSERT_TRUE(status.ok()) << status.error_message();
        EXPECT_THAT(deployments_.last().tokens(), ::testing::ElementsAre(72, 105, 33, 0, 255));
        EXPECT_EQ(deployments_.last().deployment_id(), "dep-acme");
        EXPECT_EQ(response.model_name(), "dep-acme");
        EXPECT_EQ(response.model_version(), "1");
        EXPECT_EQ(response.id(), "req-7");
        ASSERT_EQ(response.outputs_size(), 2);
        ASSERT_EQ(response.raw_output_contents_size(), 2);
        EXPECT_EQ(response.outputs(0).name(), "logprobs");
        EXPECT_EQ(response.outputs(0).datatype(), "FP64");
        EXPECT_EQ(response.outputs(1).name(), "loss");
        if (batched) {
          EXPECT_THAT(response.outputs(0).shape(), ::testing::ElementsAre(1, 4));
          EXPECT_THAT(response.outputs(1).shape(), ::testing::ElementsAre(1, 1));
        } else {
          EXPECT_THAT(response.outputs(0).shape(), ::testing::ElementsAre(4));
          EXPECT_THAT(response.outputs(1).shape(), ::testing::ElementsAre(1));
        }
        EXPECT_EQ(Doubles(response.raw_output_contents(0)), expected);
        EXPECT_THAT(Doubles(response.raw_output_contents(1)), ::testing::ElementsAre(loss));
        EXPECT_EQ(response.parameters().at("tokens").int64_param(), 5);
        EXPECT_EQ(response.parameters().at("seconds").double_param(), 0.25);
      }
    }
  }
  // Text, typed and in the protocol's raw BYTES layout; and an output subset, in its order.
  for (bool raw : {false, true}) {
    ModelInferRequest r;
    r.set_model_name("dep-acme");
    r.set_model_version("1");
    auto* in = r.add_inputs();
    in->set_name("text");
    in->set_datatype("BYTES");
    in->add_shape(1);
    if (raw) {
      const uint32_t length = 3;
      r.add_raw_input_contents(std::string(reinterpret_cast<const char*>(&length), 4) + "Hi!");
    } else {
      in->mutable_contents()->add_bytes_contents("Hi!");
    }
    r.add_outputs()->set_name("loss");
    ModelInferResponse response;
    grpc::Status status = Infer(r, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(deployments_.last().text(), "Hi!");
    EXPECT_EQ(deployments_.last().tokens_size(), 0);
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).name(), "loss");
    EXPECT_THAT(Doubles(response.raw_output_contents(0)),
                ::testing::ElementsAre((106 / 64.0 + 34 / 64.0) / 2));
  }
  EXPECT_EQ(
      Metric("dattn_inference_requests_total{code=\"OK\",model=\"dep-acme\",tenant=\"acme\"}"),
      "10");
}

TEST_F(InferenceServiceTest, MalformedDeploymentRequestsNameTheTensorOrParameter) {
  const std::vector<int64_t> tokens = {1, 2, 3};
  struct Case {
    std::function<void(ModelInferRequest*)> change;
    const char* message;
  };
  auto in = [](ModelInferRequest* r) { return r->mutable_inputs(0); };
  const std::vector<Case> cases = {
      {[](ModelInferRequest* r) { r->clear_inputs(); }, "inputs: 0 inputs: give exactly one"},
      {[](ModelInferRequest* r) { *r->add_inputs() = r->inputs(0); },
       "inputs: 2 inputs: give exactly one"},
      {[&](ModelInferRequest* r) { in(r)->set_name("ids"); },
       "inputs[0].name: \"ids\" is not \"tokens\" or \"text\""},
      {[&](ModelInferRequest* r) { in(r)->set_datatype("FP32"); },
       "inputs[\"tokens\"].datatype: \"FP32\" is not \"INT32\" or \"INT64\""},
      {[&](ModelInferRequest* r) { in(r)->add_shape(1); },
       "inputs[\"tokens\"].shape: [3, 1] is not [N] or [1, N]"},
      {[&](ModelInferRequest* r) { in(r)->set_shape(0, 0); },
       "inputs[\"tokens\"].shape: [0] is not [N] or [1, N]"},
      {[&](ModelInferRequest* r) { in(r)->set_shape(0, 4); },
       "inputs[\"tokens\"].contents: want 4 values in int_contents"},
      {[&](ModelInferRequest* r) { in(r)->mutable_contents()->add_fp32_contents(1); },
       "inputs[\"tokens\"].contents: want 3 values in int_contents and nothing else"},
      {[&](ModelInferRequest* r) { r->add_raw_input_contents("abcdefghijkl"); },
       "inputs[\"tokens\"]: both raw_input_contents and contents"},
      {[&](ModelInferRequest* r) {
         in(r)->clear_contents();
         r->add_raw_input_contents("abcdefghij");
       },
       "raw_input_contents[0]: 10 bytes for 3 INT32 values (12 bytes)"},
      {[&](ModelInferRequest* r) {
         in(r)->clear_contents();
         r->add_raw_input_contents("abcdefghijkl");
         r->add_raw_input_contents("abcdefghijkl");
       },
       "raw_input_contents: 2 entries for 1 input"},
      {[&](ModelInferRequest* r) {
         in(r)->set_datatype("INT64");
         in(r)->clear_contents();
         for (int64_t v : {1ll, 5000000000ll, 2ll})
           in(r)->mutable_contents()->add_int64_contents(v);
       },
       "inputs[\"tokens\"][1]: 5000000000 does not fit an int32"},
      {[&](ModelInferRequest* r) {
         in(r)->set_name("text");
         in(r)->set_datatype("BYTES");
       },
       "inputs[\"text\"].shape: [3] is not [1] or [1, 1]"},
      {[&](ModelInferRequest* r) {
         in(r)->set_name("text");
         in(r)->set_datatype("BYTES");
         in(r)->set_shape(0, 1);
         in(r)->clear_contents();
         r->add_raw_input_contents(std::string("\x09\0\0\0abc", 7));
       },
       "raw_input_contents[0]: its length prefix says 9 bytes, 3 follow"},
      {[](ModelInferRequest* r) { (*r->mutable_parameters())["temperature"].set_double_param(1); },
       "parameters[\"temperature\"]: a deployment takes no request parameters"},
      {[](ModelInferRequest* r) { r->add_outputs()->set_name("logits"); },
       "outputs[0].name: \"logits\" is not \"logprobs\" or \"loss\""},
      {[](ModelInferRequest* r) {
         r->add_outputs()->set_name("loss");
         r->add_outputs()->set_name("loss");
       },
       "outputs[1].name: \"loss\" repeated"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    ModelInferRequest request = TokensRequest("dep-acme", tokens, "INT32", false, false);
    c.change(&request);
    ModelInferResponse response;
    grpc::Status status = Infer(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  EXPECT_EQ(deployments_.scores(), 0);  // Refused before any Score call.
  // Score's own errors pass unchanged: a token outside the vocabulary, a deployment loading.
  ModelInferResponse response;
  grpc::Status status =
      Infer(TokensRequest("dep-acme", {1, 256}, "INT32", false, false), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("tokens[1]: 256 is outside the vocabulary"));
  status = Infer(TokensRequest("dep-loading", tokens, "INT32", false, false), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("not serving yet"));
  EXPECT_EQ(Metric("dattn_inference_requests_total{code=\"INVALID_ARGUMENT\",model=\"dep-acme\","
                   "tenant=\"acme\"}"),
            absl::StrCat(cases.size() + 1));
}

TEST_F(InferenceServiceTest, DeploymentsOfOtherTenantsAndOtherJobsAreNotFound) {
  using Stub = inference::GRPCInferenceService::Stub;
  const std::vector<int64_t> tokens = {1, 2, 3};
  // Unknown, not a deployment, another tenant's: the same NOT_FOUND (never told apart), no Score.
  std::vector<std::string> messages;
  for (const char* model : {"dep-nowhere", "train-acme", "dep-beta"}) {
    SCOPED_TRACE(model);
    ModelInferResponse response;
    grpc::Status status = Infer(TokensRequest(model, tokens, "INT32", false, false), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("model \"", model, "\" not found")));
    messages.push_back(absl::StrReplaceAll(status.error_message(), {{model, "X"}}));
    inference::ModelReadyRequest ready;
    ready.set_name(model);
    inference::ModelReadyResponse ready_response;
    EXPECT_EQ(Call(&Stub::ModelReady, ready, &ready_response).error_code(),
              grpc::StatusCode::NOT_FOUND);
    inference::ModelMetadataRequest meta;
    meta.set_name(model);
    inference::ModelMetadataResponse meta_response;
    EXPECT_EQ(Call(&Stub::ModelMetadata, meta, &meta_response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[0], messages[2]);
  EXPECT_EQ(deployments_.scores(), 0);
  // Its own tenant reaches it; unknown names never become metric labels.
  ModelInferResponse response;
  EXPECT_TRUE(
      Infer(TokensRequest("dep-beta", tokens, "INT32", false, false), &response, kBobToken).ok());
  EXPECT_EQ(Metric("dattn_inference_requests_total{code=\"NOT_FOUND\",model=\"unknown\","
                   "tenant=\"acme\"}"),
            "3");
  EXPECT_EQ(Metric("dattn_inference_requests_total{code=\"NOT_FOUND\",model=\"dep-nowhere\""),
            "(absent)");
  // Another version of a deployment: NOT_FOUND naming it.
  ModelInferRequest request = TokensRequest("dep-acme", tokens, "INT32", false, false);
  request.set_model_version("2");
  grpc::Status status = Infer(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("model \"dep-acme\" has no version \"2\""));
}

TEST_F(InferenceServiceTest, DeploymentReadinessAndMetadata) {
  using Stub = inference::GRPCInferenceService::Stub;
  inference::ModelReadyRequest ready;
  inference::ModelReadyResponse r;
  ready.set_name("dep-acme");
  ASSERT_TRUE(Call(&Stub::ModelReady, ready, &r).ok());
  EXPECT_TRUE(r.ready());
  ready.set_name("dep-loading");  // Known, loading its model: not ready, not an error.
  ASSERT_TRUE(Call(&Stub::ModelReady, ready, &r).ok());
  EXPECT_FALSE(r.ready());
  inference::ModelMetadataRequest meta;
  meta.set_name("dep-acme");
  inference::ModelMetadataResponse m;
  ASSERT_TRUE(Call(&Stub::ModelMetadata, meta, &m).ok());
  EXPECT_EQ(m.name(), "dep-acme");
  EXPECT_THAT(m.versions(), ::testing::ElementsAre("1"));
  EXPECT_EQ(m.platform(), "dattn-longnet");
  ASSERT_EQ(m.inputs_size(), 2);
  EXPECT_EQ(m.inputs(0).name(), "tokens");
  EXPECT_EQ(m.inputs(0).datatype(), "INT32");
  EXPECT_EQ(m.inputs(1).name(), "text");
  EXPECT_EQ(m.inputs(1).datatype(), "BYTES");
  ASSERT_EQ(m.outputs_size(), 2);
  EXPECT_EQ(m.outputs(0).name(), "logprobs");
  EXPECT_EQ(m.outputs(1).name(), "loss");
  EXPECT_EQ(m.outputs(1).datatype(), "FP64");
}

}  // namespace
}  // namespace server
}  // namespace dattn
