// JobService.Attend end to end: a coordinator and CPU workers from the real binaries, the caller's
// own tensors streamed in and the outputs streamed back, checked against the float64 oracle at 1,
// 2 and 4 ranks, both modes, causal or not, forward and backward; NaN and Inf; a 256 MiB round
// trip through a coordinator that never holds a whole tensor; malformed calls; cancel and deadline
// freeing the ranks (checked in the coordinator's metrics).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/npy.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "engine/attention_spec.h"
#include "engine/testing/oracle.h"
#include "engine/testing/sanitizers.h"
#include "engine/testing/test_util.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/attend_client.h"
#include "tests/cluster_fixture.h"
#include "tests/http_client.h"

namespace dattn::testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kChunk = int64_t{4} << 20;

struct Problem {
  std::vector<int64_t> segments = {8, 16};
  std::vector<int64_t> rates = {1, 2};
  bool causal = false;
  bool mixture = false;
  int64_t batch = 2, seq_len = 32, heads = 4, dim = 8;
  v1::DType dtype = v1::DTYPE_FP64;
  int num_ranks = 1;
  bool backward = false;
};

v1::AttendStart StartOf(const Problem& p) {
  v1::AttendStart start;
  for (int64_t w : p.segments) start.mutable_attention()->add_segment_lengths(w);
  for (int64_t r : p.rates) start.mutable_attention()->add_dilation_rates(r);
  start.mutable_attention()->set_causal(p.causal);
  start.mutable_attention()->set_mode(p.mixture ? v1::ATTENTION_MODE_MIXTURE
                                                : v1::ATTENTION_MODE_GROUPED);
  start.mutable_shape()->set_batch(p.batch);
  start.mutable_shape()->set_seq_len(p.seq_len);
  start.mutable_shape()->set_num_heads(p.heads);
  start.mutable_shape()->set_head_dim(p.dim);
  start.set_dtype(p.dtype);
  start.set_num_ranks(p.num_ranks);
  start.set_backward(p.backward);
  start.set_device(v1::DEVICE_PREFERENCE_CPU);
  return start;
}

std::string Encode(const std::vector<double>& values, v1::DType dtype) {
  return EncodeElements(values, dtype);
}
std::vector<double> Decode(const std::string& bytes, v1::DType dtype) {
  return DecodeElements(bytes, dtype);
}
using Answer = AttendAnswer;
Answer Call(v1::JobService::Stub& stub, const v1::AttendStart& start,
            const std::vector<std::string>& inputs, int64_t chunk = kChunk,
            std::chrono::seconds timeout = std::chrono::seconds(120)) {
  Answer answer = CallAttend(stub, start, inputs, chunk, timeout);
  EXPECT_EQ(answer.protocol_error, "");
  return answer;
}

class AttendTest : public ClusterTest {
 protected:
  std::unique_ptr<v1::JobService::Stub> Stub() {
    return v1::JobService::NewStub(cluster_->ChannelWithToken(cluster_->token(kAlice)));
  }
  std::string Metrics() {
    HttpResult r = HttpGet(cluster_->metrics_address(), "/metrics");
    return r.body;
  }
  // Waits until no Attend call is active and no worker has memory reserved for a rank.
  bool WaitForIdle(std::string* metrics) {
    for (int i = 0; i < 200; ++i) {
      *metrics = Metrics();
      bool busy = metrics->find("dattn_attend_calls_active 0") == std::string::npos;
      for (size_t at = metrics->find("dattn_worker_memory_reserved_bytes{");
           at != std::string::npos;
           at = metrics->find("dattn_worker_memory_reserved_bytes{", at + 1)) {
        const size_t space = metrics->find("} ", at);
        busy |= metrics->compare(space + 2, 2, "0\n") != 0;
      }
      if (!busy) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
};

// A fresh shared-memory region for `p`'s tensors, one after the other (q, k, v, (dout,) out, (dq,
// dk, dv)), placed in `start`; nullptr (and a test failure) if it cannot be made.
std::unique_ptr<SharedRegion> PlaceInRegion(const Problem& p, v1::AttendStart* start) {
  const int64_t element = p.dtype == v1::DTYPE_FP64 ? 8 : p.dtype == v1::DTYPE_FP32 ? 4 : 2;
  const int64_t tensor_bytes = p.batch * p.seq_len * p.heads * p.dim * element;
  absl::StatusOr<std::unique_ptr<SharedRegion>> made =
      SharedRegion::Create((p.backward ? 8 : 4) * tensor_bytes, "test");
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return nullptr;
  *start->mutable_shared_memory() = (*made)->Place(tensor_bytes, p.backward);
  return *std::move(made);
}

// Runs `p` on random inputs and compares every output with the oracle. `shared`: the tensors go
// through a shared-memory region (AttendStart.shared_memory) instead of the stream.
void CheckAgainstOracle(v1::JobService::Stub& stub, const Problem& p, uint64_t seed,
                        bool shared = false) {
  SCOPED_TRACE(absl::StrCat("ranks ", p.num_ranks, p.mixture ? " mixture" : " grouped",
                            p.causal ? " causal" : "", p.backward ? " backward" : "",
                            shared ? " shared memory" : ""));
  oracle::Shape shape{p.batch, p.seq_len, p.heads, p.dim};
  const int64_t n = shape.NumElements();
  std::vector<std::vector<double>> in;
  for (int t = 0; t < (p.backward ? 4 : 3); ++t) {
    in.push_back(testutil::RandomValues(n, seed + t));
    // What the workers see: values rounded to the dtype.
    in.back() = Decode(Encode(in.back(), p.dtype), p.dtype);
  }
  std::vector<std::string> bytes;
  for (const auto& x : in) bytes.push_back(Encode(x, p.dtype));
  Answer a;
  if (shared) {
    const int64_t tensor_bytes = static_cast<int64_t>(bytes[0].size());
    v1::AttendStart start = StartOf(p);
    std::unique_ptr<SharedRegion> region = PlaceInRegion(p, &start);
    ASSERT_NE(region, nullptr);
    for (size_t t = 0; t < bytes.size(); ++t) {
      std::memcpy(region->data() + t * tensor_bytes, bytes[t].data(), bytes[t].size());
    }
    a = Call(stub, start, {});
    EXPECT_TRUE(a.outputs.empty()) << "outputs came on the stream of a shared-memory call";
    a.outputs.clear();
    for (int t = 0; t < (p.backward ? 4 : 1); ++t) {
      const auto tensor = static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_OUT + t);
      a.outputs.emplace_back(
          region->data() + SharedRegion::Offset(tensor, tensor_bytes, p.backward),
          static_cast<size_t>(tensor_bytes));
    }
  } else {
    // Chunks that do not line up with rank shards or rows.
    a = Call(stub, StartOf(p), bytes, /*chunk=*/1000);
  }
  ASSERT_TRUE(a.status.ok()) << a.status.error_code() << " " << a.status.error_message();
  EXPECT_EQ(a.accepted.num_ranks(), p.num_ranks == 0 ? 1 : p.num_ranks);
  EXPECT_FALSE(a.accepted.job_id().empty());
  ASSERT_TRUE(a.has_done);
  EXPECT_EQ(a.done.ranks_size(), a.accepted.num_ranks());
  AttentionSpec spec;
  spec.segment_lengths = p.segments;
  spec.dilation_rates = p.rates;
  spec.causal = p.causal;
  spec.mode = p.mixture ? AttentionMode::kMixture : AttentionMode::kGrouped;
  auto fwd = oracle::Forward(spec, shape, in[0], in[1], in[2]);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  std::vector<std::vector<double>> want = {fwd->out};
  if (p.backward) {
    auto g = oracle::Backward(spec, shape, in[0], in[1], in[2], in[3]);
    ASSERT_TRUE(g.ok()) << g.status();
    want.push_back(g->dq);
    want.push_back(g->dk);
    want.push_back(g->dv);
  }
  ASSERT_EQ(a.outputs.size(), want.size());
  const double tolerance = p.dtype == v1::DTYPE_FP64 ? 1e-10 : 2e-5;
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (size_t t = 0; t < want.size(); ++t) {
    std::vector<double> got = Decode(a.outputs[t], p.dtype);
    ASSERT_EQ(got.size(), want[t].size()) << names[t];
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[t][i]) / (1 + std::abs(want[t][i])));
    }
    EXPECT_LE(worst, tolerance) << names[t];
  }
}

TEST_F(AttendTest, TheCallersTensorsAgainstTheOracleAtOneTwoAndFourRanks) {
  StartCluster(4);
  auto stub = Stub();
  uint64_t seed = 1;
  for (int ranks : {1, 2, 4}) {
    Problem grouped;
    grouped.num_ranks = ranks;
    grouped.causal = true;
    grouped.backward = true;
    CheckAgainstOracle(*stub, grouped, seed += 10);
    Problem mixture;
    mixture.num_ranks = ranks;
    mixture.mixture = true;
    mixture.backward = ranks != 2;
    mixture.dtype = ranks == 4 ? v1::DTYPE_FP32 : v1::DTYPE_FP64;
    CheckAgainstOracle(*stub, mixture, seed += 10);
  }
  // num_ranks 0: the fewest ranks that fit (one here).
  Problem fewest;
  fewest.num_ranks = 0;
  fewest.causal = true;
  CheckAgainstOracle(*stub, fewest, seed += 10);
  // The calls are attention jobs of the caller's tenant, succeeded; every rank's memory is free.
  std::string metrics;
  ASSERT_TRUE(WaitForIdle(&metrics)) << metrics;
  EXPECT_THAT(metrics, HasSubstr("dattn_attend_calls_total{code=\"OK\",tenant=\"alice\"} 7"));
  EXPECT_THAT(metrics, HasSubstr("dattn_attend_engine_seconds_count{tenant=\"alice\"} 7"));
  EXPECT_THAT(metrics, HasSubstr("dattn_attend_queue_seconds_count{tenant=\"alice\"} 7"));
}

// The tensors in a shared-memory region of the host instead of on the stream: the same answers
// at 1 and 2 ranks (each rank reads and writes its own rows of every batch row), nothing on the
// stream; and the refusals: a region that is not on the workers' host fails the job naming it.
TEST_F(AttendTest, SharedMemoryCallsAgainstTheOracle) {
  ClusterOptions options;
  options.coordinator_flags = {"--attend-shared-memory"};
  StartCluster(2, options);
  auto stub = Stub();
  uint64_t seed = 300;
  for (int ranks : {1, 2}) {
    Problem grouped;
    grouped.num_ranks = ranks;
    grouped.causal = true;
    grouped.backward = true;
    CheckAgainstOracle(*stub, grouped, seed += 10, /*shared=*/true);
    Problem mixture;
    mixture.num_ranks = ranks;
    mixture.mixture = true;
    mixture.dtype = v1::DTYPE_FP32;
    CheckAgainstOracle(*stub, mixture, seed += 10, /*shared=*/true);
  }
  // A region no worker's host has: the job fails, the call says why.
  Problem p;
  v1::AttendStart start = StartOf(p);
  std::unique_ptr<SharedRegion> region = PlaceInRegion(p, &start);
  ASSERT_NE(region, nullptr);
  const v1::SharedMemoryRegion placed = start.shared_memory();
  start.mutable_shared_memory()->set_name("/dattn-test-no-such-region");
  Answer missing = Call(*stub, start, {});
  EXPECT_EQ(missing.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(missing.status.error_message(),
              HasSubstr("shared memory /dattn-test-no-such-region does not exist on host"));
  // A region that is not the call's: INVALID_ARGUMENT naming the field, before any job.
  *start.mutable_shared_memory() = placed;
  start.mutable_shared_memory()->set_byte_size(placed.byte_size() - 1);
  Answer small = Call(*stub, start, {});
  EXPECT_EQ(small.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(small.status.error_message(),
              HasSubstr("start.shared_memory.tensors[3].offset: out at offset"));
  std::string metrics;
  ASSERT_TRUE(WaitForIdle(&metrics)) << metrics;
  EXPECT_THAT(metrics, HasSubstr("dattn_attend_calls_total{code=\"OK\",tenant=\"alice\"} 4"));
  EXPECT_THAT(metrics, HasSubstr("dattn_attend_bytes_total{direction=\"in\",tenant=\"alice\"} 0"));
}

// A coordinator not started with --attend-shared-memory refuses such calls, naming the flag.
TEST_F(AttendTest, SharedMemoryIsOffUnlessTheCoordinatorTakesIt) {
  StartCluster(1);
  auto stub = Stub();
  Problem p;
  v1::AttendStart start = StartOf(p);
  std::unique_ptr<SharedRegion> region = PlaceInRegion(p, &start);
  ASSERT_NE(region, nullptr);
  Answer a = Call(*stub, start, {});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(a.status.error_message(), HasSubstr("--attend-shared-memory"));
  EXPECT_FALSE(a.has_done);
}

// NaN and Inf in the inputs propagate as the engine contract says: compared with the oracle fed
// the same values, NaN for NaN, and equal elsewhere.
TEST_F(AttendTest, NanAndInfPropagateAsTheOracleSays) {
  StartCluster(2);
  auto stub = Stub();
  Problem p;
  p.num_ranks = 2;
  oracle::Shape shape{p.batch, p.seq_len, p.heads, p.dim};
  const int64_t n = shape.NumElements();
  std::vector<double> q = testutil::RandomValues(n, 3), k = testutil::RandomValues(n, 4),
                      v = testutil::RandomValues(n, 5);
  q[shape.Index(0, 3, 1, 2)] = std::numeric_limits<double>::quiet_NaN();
  v[shape.Index(1, 20, 0, 0)] = std::numeric_limits<double>::infinity();
  Answer a = Call(*stub, StartOf(p), {Encode(q, p.dtype), Encode(k, p.dtype), Encode(v, p.dtype)});
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  AttentionSpec spec;
  spec.segment_lengths = p.segments;
  spec.dilation_rates = p.rates;
  auto fwd = oracle::Forward(spec, shape, q, k, v);
  ASSERT_TRUE(fwd.ok());
  std::vector<double> got = Decode(a.outputs.at(0), p.dtype);
  int nans = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = fwd->out[static_cast<size_t>(i)];
    if (std::isnan(w)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got[static_cast<size_t>(i)])) << i;
    } else if (std::isinf(w)) {
      EXPECT_EQ(got[static_cast<size_t>(i)], w) << i;
    } else {
      EXPECT_NEAR(got[static_cast<size_t>(i)], w, 1e-10 * (1 + std::abs(w))) << i;
    }
  }
  EXPECT_GT(nans, 0);
}

// Peak resident memory of a process, from /proc (VmHWM), in bytes.
int64_t PeakRss(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// 256 MiB a tensor, in and out, over two ranks: with one-position segments out = v exactly, so the
// whole round trip is checked byte for byte; the coordinator relays it without ever holding a
// tensor (its peak memory stays far below one).
TEST_F(AttendTest, A256MiBRoundTripThroughABoundedRelay) {
  StartCluster(2);
  auto stub = Stub();
  Problem p;
  p.segments = {1};
  p.rates = {1};
  p.batch = 1;
  p.heads = 8;
  p.dim = 64;
  p.seq_len = (int64_t{256} << 20) / (p.heads * p.dim * 4);
  p.dtype = v1::DTYPE_FP32;
  p.num_ranks = 2;
  const size_t bytes = static_cast<size_t>(p.seq_len * p.heads * p.dim * 4);
  ASSERT_EQ(bytes, size_t{256} << 20);
  std::string q(bytes, '\0'), k(bytes, '\0'), v(bytes, '\0');
  // v: distinct finite floats; q, k: anything finite.
  for (size_t i = 0; i < bytes / 4; ++i) {
    const float x = static_cast<float>(i % 1000003) * 0.5f - 1000.f;
    std::memcpy(&v[i * 4], &x, 4);
  }
  const int64_t before = PeakRss(cluster_->coordinator().pid());
  Answer a = Call(*stub, StartOf(p), {q, k, v}, kChunk, std::chrono::seconds(600));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message() << cluster_->Logs();
  ASSERT_EQ(a.outputs.size(), 1u);
  EXPECT_EQ(a.outputs[0].size(), bytes);
  EXPECT_TRUE(a.outputs[0] == v) << "out differs from v";
  const int64_t peak = PeakRss(cluster_->coordinator().pid());
  std::printf("coordinator peak resident memory: %lld MiB before the call, %lld MiB after\n",
              static_cast<long long>(before >> 20), static_cast<long long>(peak >> 20));
  // The relay held at most 16 MiB a direction and a chunk a rank at once (its own count).
  const std::string metrics = Metrics();
  const std::string name = "\ndattn_attend_buffered_bytes_max ";
  const size_t at = metrics.find(name);
  ASSERT_NE(at, std::string::npos) << metrics;
  const double buffered = std::stod(metrics.substr(at + name.size()));
  EXPECT_GT(buffered, 0);
  EXPECT_LE(buffered, 2 * (16 << 20) + 2 * 4 * (4 << 20)) << buffered;
#if !DATTN_ADDRESS_SANITIZER  // AddressSanitizer keeps freed memory in quarantine (256 MiB).
  // And the process as a whole stayed below one tensor more than where it started (the relay's
  // queues, gRPC's buffers and malloc's two arenas, server/main.cc: 99-149 MiB in 20 runs on 2
  // cores); a coordinator that held a tensor would be 256 MiB above that.
  EXPECT_LT(peak - before, int64_t{256} << 20) << "before " << before << ", peak " << peak;
#else
  (void)before;
  (void)peak;
#endif
}

TEST_F(AttendTest, MalformedCallsAreInvalidArgumentNamingTheTensor) {
  StartCluster(2);
  auto stub = Stub();
  Problem p;
  p.num_ranks = 2;
  const int64_t n = p.batch * p.seq_len * p.heads * p.dim;
  const std::string whole(static_cast<size_t>(n * 8), '\0');
  // The stream ends with k short: "k incomplete".
  Answer a = Call(*stub, StartOf(p), {whole, whole.substr(0, 800)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("k incomplete: 800 of its 16384 bytes"));
  // q longer than its shape says.
  a = Call(*stub, StartOf(p), {whole + "12345678"});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("ends past the tensor's 16384 bytes"));
  // A chunk over 4 MiB.
  Problem big = p;
  big.seq_len = 8192;
  a = Call(*stub, StartOf(big), {std::string(size_t{5} << 20, '\0')}, /*chunk=*/int64_t{5} << 20);
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("a chunk has 1 .. 4194304"));
  // A bad start: named under "start".
  v1::AttendStart bad = StartOf(p);
  bad.mutable_shape()->set_seq_len(33);
  a = Call(*stub, bad, {});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("start."));
  EXPECT_THAT(a.status.error_message(), HasSubstr("33"));
  bad = StartOf(p);
  bad.set_dtype(v1::DTYPE_UNSPECIFIED);
  a = Call(*stub, bad, {});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("start.dtype"));
  // A first message without start; a chunk in its place.
  {
    grpc::ClientContext context;
    auto stream = stub->Attend(&context);
    v1::AttendRequest chunk;
    chunk.mutable_chunk()->set_tensor(v1::ATTEND_TENSOR_Q);
    stream->Write(chunk);
    stream->WritesDone();
    v1::AttendResponse r;
    while (stream->Read(&r)) {
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("start: required"));
  }
  // SubmitJob cannot make a streamed job.
  {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.set_idempotency_key("streamed");
    v1::AttentionJobSpec* job = request.mutable_spec()->mutable_attention();
    *job->mutable_attention() = StartOf(p).attention();
    *job->mutable_shape() = StartOf(p).shape();
    job->set_dtype(v1::DTYPE_FP64);
    job->set_streamed(true);
    v1::SubmitJobResponse response;
    grpc::Status s = stub->SubmitJob(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("spec.attention.streamed"));
  }
  // Every refused call left nothing behind.
  std::string metrics;
  EXPECT_TRUE(WaitForIdle(&metrics)) << metrics;
}

// A call cancelled mid-stream, one whose deadline passes, and one whose job someone cancels (dattn
// cancel) end their jobs CANCELLED: the ranks stop and their memory is free (the coordinator's
// metrics show no reservation and no active call).
TEST_F(AttendTest, CancelAndDeadlineFreeTheRanks) {
  StartCluster(2);
  auto stub = Stub();
  Problem p;
  p.num_ranks = 2;
  const std::string q(static_cast<size_t>(p.batch * p.seq_len * p.heads * p.dim * 8), '\0');
  enum Ending { kCancel, kDeadline, kDattnCancel };
  for (Ending ending : {kCancel, kDeadline, kDattnCancel}) {
    const bool deadline = ending == kDeadline;
    SCOPED_TRACE(ending == kCancel ? "cancel" : deadline ? "deadline" : "dattn cancel");
    grpc::ClientContext context;
    if (deadline) {
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    }
    auto stream = stub->Attend(&context);
    v1::AttendRequest first;
    *first.mutable_start() = StartOf(p);
    ASSERT_TRUE(stream->Write(first));
    v1::AttendResponse accepted;
    ASSERT_TRUE(stream->Read(&accepted));
    ASSERT_TRUE(accepted.has_accepted());
    v1::AttendRequest chunk;
    chunk.mutable_chunk()->set_tensor(v1::ATTEND_TENSOR_Q);
    chunk.mutable_chunk()->set_data(q);
    ASSERT_TRUE(stream->Write(chunk));
    v1::Job job;
    // Both ranks are placed and wait for k (a rank starts once its inputs are whole).
    ASSERT_TRUE(cluster_->WaitForJobState(accepted.accepted().job_id(), v1::JOB_STATE_PLACED,
                                          std::chrono::seconds(30), &job))
        << cluster_->Logs();
    if (ending == kCancel) context.TryCancel();
    if (ending == kDattnCancel) {
      // Someone else cancels the job while its ranks wait for k: the call ends CANCELLED.
      ProcessResult cancel = cluster_->Cli({"cancel", accepted.accepted().job_id()});
      EXPECT_EQ(cancel.exit_code, 0) << cancel.out << cancel.err;
    }
    v1::AttendResponse r;
    while (stream->Read(&r)) {
    }
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(),
              deadline ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED);
    // (A client that still holds its side open, as this one does, gets gRPC's own CANCELLED: the
    // call is cancelled under its pending read; one that had sent everything gets the reason.)
    ASSERT_TRUE(
        cluster_->WaitForJobEnd(accepted.accepted().job_id(), std::chrono::seconds(30), &job));
    EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED) << job.state_reason();
    std::string metrics;
    EXPECT_TRUE(WaitForIdle(&metrics)) << metrics;
  }
  EXPECT_THAT(Metrics(),
              HasSubstr("dattn_attend_calls_total{code=\"CANCELLED\",tenant=\"alice\"} 3"));
}

// Writes `values` as a (B, N, H, D) .npy file of `dtype`.
std::string WriteNpy(const std::string& path, const std::vector<double>& values, v1::DType dtype,
                     const std::vector<int64_t>& shape) {
  v1::TensorHeader header;
  header.set_dtype(dtype);
  for (int64_t d : shape) header.add_shape(d);
  header.set_total_bytes(static_cast<int64_t>(values.size()) * (dtype == v1::DTYPE_FP64 ? 8 : 4));
  absl::StatusOr<std::unique_ptr<client::NpyWriter>> w = client::NpyWriter::Open(path, header);
  EXPECT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->Append(Encode(values, dtype)).ok());
  EXPECT_TRUE((*w)->Finish().ok());
  return path;
}

std::vector<double> ReadNpy(const std::string& path, v1::DType dtype) {
  absl::StatusOr<std::unique_ptr<client::NpyReader>> r = client::NpyReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  EXPECT_EQ((*r)->header().dtype(), dtype);
  std::string data;
  EXPECT_TRUE((*r)->Read(int64_t{1} << 30, &data).ok());
  return Decode(data, dtype);
}

// `dattn attend` on .npy files: forward and backward over a ring of two, the saved outputs against
// the oracle; a file that is not a (B, N, H, D) array is a usage error naming it.
TEST_F(AttendTest, TheCliAttendsNpyFiles) {
  ClusterOptions options;
  options.coordinator_flags = {"--attend-shared-memory"};
  StartCluster(2, options);
  Problem p;
  p.dtype = v1::DTYPE_FP32;
  oracle::Shape shape{p.batch, p.seq_len, p.heads, p.dim};
  const std::vector<int64_t> dims = shape.Dims();
  const int64_t n = shape.NumElements();
  std::vector<std::vector<double>> in;
  std::vector<std::string> files;
  const char* names[] = {"q", "k", "v", "dout"};
  for (int t = 0; t < 4; ++t) {
    in.push_back(Decode(Encode(testutil::RandomValues(n, 40 + t), p.dtype), p.dtype));
    files.push_back(
        WriteNpy(absl::StrCat(cluster_->dir(), "/", names[t], ".npy"), in.back(), p.dtype, dims));
  }
  const std::string dir = cluster_->dir();
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "--shared-memory" : "streamed");
    std::vector<std::string> flags = {"attend",
                                      files[0],
                                      files[1],
                                      files[2],
                                      "--dout",
                                      files[3],
                                      "--segments",
                                      "8,16",
                                      "--rates",
                                      "1,2",
                                      "--causal",
                                      "--ranks",
                                      "2",
                                      "-o",
                                      dir + "/out.npy",
                                      "--dq",
                                      dir + "/dq.npy",
                                      "--dk",
                                      dir + "/dk.npy",
                                      "--dv",
                                      dir + "/dv.npy"};
    if (shared) flags.push_back("--shared-memory");
    ProcessResult r = cluster_->Cli(flags);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err << cluster_->Logs();
    if (shared) {
      EXPECT_THAT(r.out, HasSubstr("the tensors are in shared memory /dattn-cli-"));
      // The CLI removes its region when it is done.
      int left = 0;
      for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
        left += absl::StartsWith(entry.path().filename().string(), "dattn-cli-");
      }
      EXPECT_EQ(left, 0);
    }
    EXPECT_THAT(r.out, HasSubstr("on 2 ranks"));
    EXPECT_THAT(r.out, HasSubstr("Saved dv to"));
    AttentionSpec spec;
    spec.segment_lengths = p.segments;
    spec.dilation_rates = p.rates;
    spec.causal = true;
    auto fwd = oracle::Forward(spec, shape, in[0], in[1], in[2]);
    auto g = oracle::Backward(spec, shape, in[0], in[1], in[2], in[3]);
    ASSERT_TRUE(fwd.ok() && g.ok());
    const std::vector<std::vector<double>> want = {fwd->out, g->dq, g->dk, g->dv};
    const char* outs[] = {"out", "dq", "dk", "dv"};
    for (int t = 0; t < 4; ++t) {
      std::vector<double> got = ReadNpy(absl::StrCat(dir, "/", outs[t], ".npy"), p.dtype);
      ASSERT_EQ(got.size(), want[t].size()) << outs[t];
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[t][i], 2e-5 * (1 + std::abs(want[t][i]))) << outs[t] << " " << i;
      }
      std::remove(absl::StrCat(dir, "/", outs[t], ".npy").c_str());
    }
  }
  // A 3-D array is refused before anything is sent, naming the input.
  const std::string flat = WriteNpy(dir + "/flat.npy", in[0], p.dtype, {p.batch, p.seq_len, 32});
  ProcessResult r = cluster_->Cli({"attend", files[0], flat, files[2], "--segments", "8,16",
                                   "--rates", "1,2", "-o", dir + "/x.npy"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("k ("));
  EXPECT_THAT(r.err, HasSubstr("3 dimensions"));
  // The coordinator's own verdict, with its exit code: N not divisible by the ring.
  r = cluster_->Cli({"attend", files[0], files[1], files[2], "--segments", "8,16", "--rates", "1,2",
                     "--ranks", "3", "-o", dir + "/x.npy"});
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("start.num_ranks"));
}

// A client that goes away mid-stream (the CLI killed with SIGKILL while it sends 3 x 128 MiB): its
// job is cancelled and every rank's memory is free again.
TEST_F(AttendTest, AClientThatDisappearsFreesItsRanks) {
  StartCluster(2);
  const std::string dir = cluster_->dir();
  const int64_t n = 65536, heads = 8, dim = 64;
  v1::TensorHeader header;
  header.set_dtype(v1::DTYPE_FP32);
  for (int64_t d : {int64_t{1}, n, heads, dim}) header.add_shape(d);
  header.set_total_bytes(n * heads * dim * 4);
  std::vector<std::string> files;
  for (const char* name : {"q", "k", "v"}) {
    files.push_back(absl::StrCat(dir, "/big-", name, ".npy"));
    auto w = client::NpyWriter::Open(files.back(), header);
    ASSERT_TRUE(w.ok());
    const std::string zeros(size_t{16} << 20, '\0');
    for (int64_t at = 0; at < header.total_bytes(); at += zeros.size()) {
      ASSERT_TRUE((*w)->Append(zeros).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
  }
  ProcessOptions o;
  o.name = "attend-cli";
  o.log_dir = dir;
  o.argv = {testutil::RunfilePath("client/dattn"),
            "attend",
            files[0],
            files[1],
            files[2],
            "--segments",
            "256",
            "--rates",
            "1",
            "--ranks",
            "2",
            "-o",
            dir + "/big-out.npy"};
  o.env["DATTN_COORDINATOR"] = cluster_->address();
  o.env["DATTN_TLS_CA"] = cluster_->ca_file();
  o.env["DATTN_TOKEN"] = cluster_->token(kAlice);
  Process cli(o);
  std::string error;
  ASSERT_TRUE(cli.Start(&error)) << error;
  // Its job, as soon as the CLI says it was accepted; the CLI dies once the ranks are placed.
  std::string job_id;
  for (int i = 0; i < 3000 && job_id.empty(); ++i) {
    job_id = JobIdFrom(cli.ReadStdout());
    if (job_id.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(job_id.empty()) << cli.ReadStdout() << cli.ReadStderr();
  v1::Job job;
  ASSERT_TRUE(
      cluster_->WaitForJobState(job_id, v1::JOB_STATE_PLACED, std::chrono::seconds(30), &job) ||
      job.state() == v1::JOB_STATE_RUNNING)
      << v1::JobState_Name(job.state());
  cli.Kill();
  ASSERT_TRUE(cluster_->WaitForJobEnd(job_id, std::chrono::seconds(120), &job));
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED) << job.state_reason();
  std::string metrics;
  EXPECT_TRUE(WaitForIdle(&metrics)) << metrics;
}

}  // namespace
}  // namespace dattn::testing
