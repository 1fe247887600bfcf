// End-to-end tests of deployments (docs/SERVING.md): the real dattn-coordinator and dattn-worker
// on loopback, a CPU worker serving a LongNet checkpoint.
//
// - A deployment submitted with a checkpoint becomes ready; Generate streams exactly the tokens
//   model::Generate gives on the same weights (greedy, fp32, one thread), as text and as ids;
//   Score gives the forward pass's log-probabilities.
// - Four concurrent requests are decoded together and each gets what it gets alone.
// - A client that goes away mid-request frees it; the deployment serves on.
// - Bad requests get clear errors naming the value (unknown deployment, a token outside the
//   vocabulary, a prompt over max_context, a job that is not a deployment, a checkpoint that
//   does not exist); an undeployed deployment refuses further requests.
// - An imported model (config.json + BF16 safetensors) serves its own bf16 weights.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "dattn/v1/job_service.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "model/decoder.h"
#include "model/generation.h"
#include "model/longnet.h"
#include "model/testing/test_checkpoint.h"
#include "tests/cluster.h"
#include "tests/cluster_fixture.h"
#include "tests/http_client.h"

namespace dattn::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

model::LongNetConfig ByteModel() {
  model::LongNetConfig c;
  c.vocab_size = 256;
  c.d_model = 32;
  c.num_layers = 2;
  c.num_heads = 2;
  c.ffn_dim = 48;
  c.segment_lengths = {8, 32};
  c.dilation_rates = {1, 4};
  return c;
}

// Saves a perturbed model under `root`; returns the step folder and the weights.
std::string SaveModel(const std::string& root, std::vector<float>* weights) {
  absl::StatusOr<std::string> dir =
      model::testing::SaveTestCheckpoint(root, ByteModel(), 11, 7, 0.5f, weights);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

// What model::Generate gives on these weights, greedy.
std::vector<int32_t> Expected(const std::vector<float>& weights, const std::vector<int32_t>& prompt,
                              int64_t max_tokens, int64_t max_context = 4096) {
  auto lm = model::LongNetLM<float>::CreateCpu(ByteModel(), {}, 1);
  EXPECT_TRUE((*lm)->CopyParamsFromHost(weights.data()).ok());
  auto decoder = model::Decoder<float>::Create(lm->get(), max_context);
  model::GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = max_tokens;
  auto r = model::Generate<float>(**decoder, prompt, o, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> t;
  for (const model::GeneratedToken& g : r->tokens) t.push_back(g.token);
  return t;
}

// log p(text[i + 1] | text[..i]) on these weights, from the model's forward pass.
std::vector<double> LogProbs(const std::vector<float>& weights, const std::string& text) {
  const std::vector<int32_t> tokens(
      reinterpret_cast<const unsigned char*>(text.data()),
      reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  auto lm = model::LongNetLM<float>::CreateCpu(ByteModel(), {}, 1);
  EXPECT_TRUE((*lm)->CopyParamsFromHost(weights.data()).ok());
  model::TokenBatch b;
  b.tokens = tokens.data();
  b.batch = 1;
  b.seq_len = static_cast<int64_t>(tokens.size());
  EXPECT_TRUE((*lm)->Forward(b).ok());
  std::vector<float> logits(tokens.size() * 256);
  EXPECT_TRUE((*lm)->CopyLogitsToHost(logits.data()).ok());
  std::vector<double> lp;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    double z = 0;
    for (int k = 0; k < 256; ++k) z += std::exp(static_cast<double>(logits[i * 256 + k]));
    lp.push_back(logits[i * 256 + static_cast<size_t>(tokens[i + 1])] - std::log(z));
  }
  return lp;
}

// The value of the first sample of `name` on a /metrics page whose labels include every one of
// `labels` (each `key="value"`), or -1.
double MetricValue(const std::string& page, const std::string& name,
                   const std::vector<std::string>& labels) {
  size_t at = 0;
  while ((at = page.find("\n" + name + "{", at)) != std::string::npos) {
    const size_t end = page.find('\n', at + 1);
    const std::string line = page.substr(at + 1, end - at - 1);
    at = end;
    bool all = true;
    for (const std::string& l : labels) all &= line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

struct Generated {
  grpc::Status status;
  std::string accepted;
  std::vector<int32_t> tokens;
  v1::GenerateDone done;
};

v1::GenerateRequest Greedy(const std::string& id, const std::string& text, int64_t max_tokens) {
  v1::GenerateRequest r;
  r.set_deployment_id(id);
  r.set_prompt_text(text);
  r.set_max_tokens(max_tokens);
  return r;
}

class ServingTest : public ClusterTest {
 protected:
  // A deployment of `checkpoint`, waited for until ready (30 s at most); its job id.
  std::string Deploy(const std::string& checkpoint, int max_batch = 4, int64_t max_context = 0,
                     int ranks = 0) {
    v1::SubmitJobRequest request;
    request.set_idempotency_key(
        absl::StrCat("deploy-", std::hash<std::string>{}(checkpoint), "-", ranks));
    request.mutable_spec()->set_name("serve");
    request.mutable_spec()->mutable_deployment()->set_checkpoint(checkpoint);
    request.mutable_spec()->mutable_deployment()->set_max_batch(max_batch);
    request.mutable_spec()->mutable_deployment()->set_max_context(max_context);
    request.mutable_spec()->mutable_deployment()->set_ranks(ranks);
    grpc::ClientContext context;
    v1::SubmitJobResponse response;
    const grpc::Status s = cluster_->jobs().SubmitJob(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    const std::string id = response.job().job_id();
    for (int i = 0; i < 300; ++i) {
      v1::Job job;
      grpc::ClientContext c;
      v1::GetJobRequest get;
      get.set_job_id(id);
      if (cluster_->jobs().GetJob(&c, get, &job).ok() && job.progress().deployment().ready() &&
          job.state() == v1::JOB_STATE_RUNNING) {
        return id;
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
    ADD_FAILURE() << "deployment " << id << " did not become ready\n" << cluster_->Logs();
    return id;
  }

  Generated Generate(const v1::GenerateRequest& request, int stop_after = -1) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + seconds(60));
    auto reader = cluster_->jobs().Generate(&context, request);
    Generated g;
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      if (r.has_accepted()) g.accepted = r.accepted();
      if (r.has_token()) g.tokens.push_back(r.token().token());
      if (r.has_done()) g.done = r.done();
      if (stop_after >= 0 && static_cast<int>(g.tokens.size()) >= stop_after) {
        context.TryCancel();
        break;
      }
    }
    g.status = reader->Finish();
    return g;
  }

  // Score of `text` on deployment `id`, which must succeed.
  void Score(const std::string& id, const std::string& text, v1::ScoreRequest* request,
             v1::ScoreResponse* response) {
    request->set_deployment_id(id);
    request->set_text(text);
    grpc::ClientContext c;
    const grpc::Status s = cluster_->jobs().Score(&c, *request, response);
    ASSERT_TRUE(s.ok()) << s.error_message() << cluster_->Logs();
  }

  // Score of `text` on deployment `id`, each log-probability within 1e-4 of the model's forward
  // pass with `weights` (LogProbs); the response in *response.
  void ExpectScoreOfModel(const std::string& id, const std::vector<float>& weights,
                          const std::string& text, v1::ScoreResponse* response) {
    v1::ScoreRequest request;
    ASSERT_NO_FATAL_FAILURE(Score(id, text, &request, response));
    const std::vector<double> expected = LogProbs(weights, text);
    ASSERT_EQ(response->logprobs_size(), static_cast<int>(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(response->logprobs(static_cast<int>(i)), expected[i], 1e-4) << i;
    }
  }

  // Job `id` once `done` holds of it (polled for 30 s at most; then the last one read).
  v1::Job WaitJob(const std::string& id, const std::function<bool(const v1::Job&)>& done) {
    v1::Job job;
    for (int i = 0; i < 300; ++i) {
      grpc::ClientContext c;
      v1::GetJobRequest get;
      get.set_job_id(id);
      if (cluster_->jobs().GetJob(&c, get, &job).ok() && done(job)) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    return job;
  }

  // A long request on deployment `id`, in flight when worker `victim` is killed (SIGKILL).
  Generated KillMidRequest(const std::string& id, int victim) {
    Generated in_flight;
    std::thread caller([&] { in_flight = Generate(Greedy(id, "x", 190000)); });
    std::this_thread::sleep_for(milliseconds(500));
    cluster_->worker(victim).Signal(SIGKILL);
    caller.join();
    return in_flight;
  }

  std::vector<float> weights_;
  std::string checkpoint_;

  void SetUpServing() {
    StartCluster(1, ClusterOptions{});
    checkpoint_ = SaveModel(cluster_->dir() + "/model", &weights_);
  }
};

std::vector<int32_t> Bytes(const std::string& s) {
  return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(s.data()),
                              reinterpret_cast<const unsigned char*>(s.data()) + s.size());
}

TEST_F(ServingTest, GenerateAndScoreAreTheModelsAndConcurrentRequestsKeepTheirOwn) {
  SetUpServing();
  const std::string id = Deploy(checkpoint_);
  {
    v1::Job job;
    grpc::ClientContext c;
    v1::GetJobRequest get;
    get.set_job_id(id);
    get.set_include_events(true);
    ASSERT_TRUE(cluster_->jobs().GetJob(&c, get, &job).ok());
    EXPECT_EQ(job.progress().deployment().checkpoint_step(), 7);
    bool ready_event = false;
    for (const v1::JobEvent& e : job.events()) ready_event |= e.kind() == "ready";
    EXPECT_TRUE(ready_event) << job.DebugString();
  }
  Generated g = Generate(Greedy(id, "In the beginning", 40));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << cluster_->Logs();
  EXPECT_EQ(g.accepted.rfind(id + "/", 0), 0u) << g.accepted;
  EXPECT_EQ(g.tokens, Expected(weights_, Bytes("In the beginning"), 40));
  EXPECT_EQ(g.done.finish_reason(), "length");
  EXPECT_EQ(g.done.generated_tokens(), 40);
  EXPECT_EQ(g.done.prompt_tokens(), 16);
  EXPECT_GT(g.done.first_token_seconds(), 0);

  // Token ids, and a stop sequence taken from the output itself.
  v1::GenerateRequest ids;
  ids.set_deployment_id(id);
  for (int32_t t : Bytes("In the beginning")) ids.add_prompt(t);
  ids.set_max_tokens(40);
  ids.add_stop_text(std::string(g.tokens.begin() + 20, g.tokens.begin() + 22));
  Generated stopped = Generate(ids);
  ASSERT_TRUE(stopped.status.ok()) << stopped.status.error_message();
  EXPECT_EQ(stopped.done.finish_reason(), "stop");
  EXPECT_LE(stopped.tokens.size(), 20u);
  EXPECT_TRUE(std::equal(stopped.tokens.begin(), stopped.tokens.end(), g.tokens.begin()));

  // Score: the forward pass's log-probabilities.
  const std::string light = "And God said, Let there be light";
  v1::ScoreResponse scored;
  ASSERT_NO_FATAL_FAILURE(ExpectScoreOfModel(id, weights_, light, &scored));
  const std::vector<int32_t> text = Bytes(light);

  // The same Score as ModelInfer of the Open Inference Protocol, the deployment's job id its model
  // name: the same numbers, and the deployment reports itself ready.
  {
    auto oip = inference::GRPCInferenceService::NewStub(
        cluster_->ChannelWithToken(cluster_->token(kAdmin)));
    inference::ModelInferRequest infer;
    infer.set_model_name(id);
    auto* in = infer.add_inputs();
    in->set_name("tokens");
    in->set_datatype("INT32");
    in->add_shape(static_cast<int64_t>(text.size()));
    for (int32_t t : text) in->mutable_contents()->add_int_contents(t);
    inference::ModelInferResponse inferred;
    grpc::ClientContext c;
    const grpc::Status s = oip->ModelInfer(&c, infer, &inferred);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(inferred.raw_output_contents_size(), 2);
    std::vector<double> logprobs(text.size() - 1);
    ASSERT_EQ(inferred.raw_output_contents(0).size(), logprobs.size() * 8);
    std::memcpy(logprobs.data(), inferred.raw_output_contents(0).data(), logprobs.size() * 8);
    EXPECT_TRUE(std::equal(logprobs.begin(), logprobs.end(), scored.logprobs().begin()));
    double loss = 0;
    std::memcpy(&loss, inferred.raw_output_contents(1).data(), 8);
    EXPECT_EQ(loss, scored.loss());
    inference::ModelReadyRequest ready;
    ready.set_name(id);
    inference::ModelReadyResponse is_ready;
    grpc::ClientContext rc;
    ASSERT_TRUE(oip->ModelReady(&rc, ready, &is_ready).ok());
    EXPECT_TRUE(is_ready.ready());
  }

  // Four at once: decoded together, each what it is alone.
  const std::string prompts[] = {"a", "Let there", "light and darkness", "1:1 In"};
  std::vector<Generated> together(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { together[i] = Generate(Greedy(id, prompts[i], 30)); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(together[i].tokens, Expected(weights_, Bytes(prompts[i]), 30)) << prompts[i];
  }

  // The serving metrics count what was served.
  const HttpResult page = HttpGet(cluster_->metrics_address(), "/metrics");
  ASSERT_EQ(page.status, 200) << page.error;
  const std::string d = "deployment=\"" + id + "\"";
  EXPECT_EQ(MetricValue(page.body, "dattn_serving_requests_total",
                        {d, "call=\"generate\"", "code=\"OK\""}),
            6);
  EXPECT_EQ(
      MetricValue(page.body, "dattn_serving_requests_total", {d, "call=\"score\"", "code=\"OK\""}),
      2);  // Score and ModelInfer
  EXPECT_EQ(MetricValue(page.body, "dattn_inference_requests_total",
                        {"model=\"" + id + "\"", "code=\"OK\""}),
            1);
  EXPECT_EQ(MetricValue(page.body, "dattn_generated_tokens_total", {d}),
            static_cast<double>(40 + stopped.tokens.size() + 4 * 30));
  EXPECT_EQ(MetricValue(page.body, "dattn_generate_first_token_seconds_count", {d}), 6);
  EXPECT_EQ(MetricValue(page.body, "dattn_generate_output_token_seconds_count", {d}), 6);
  EXPECT_EQ(MetricValue(page.body, "dattn_generate_queue_seconds_count", {d}), 6);
  EXPECT_EQ(MetricValue(page.body, "dattn_generate_prefill_tokens_per_second_count", {d}), 6);
  EXPECT_GE(MetricValue(page.body, "dattn_deployment_cache_bytes", {d}), 0);
  EXPECT_GE(MetricValue(page.body, "dattn_deployment_sequences", {d, "state=\"queued\""}), 0);
}

TEST_F(ServingTest, CancelledRequestsFreeTheirSequenceAndBadRequestsAreNamed) {
  SetUpServing();
  const std::string id = Deploy(checkpoint_, /*max_batch=*/1);
  // The client goes away after 5 tokens of a long request: the rank stops it (far short of its
  // 4,000 tokens, as the deployment's own count shows) and, with one sequence only, serves the
  // next request.
  Generated gone = Generate(Greedy(id, "x", 4000), /*stop_after=*/5);
  EXPECT_EQ(gone.status.error_code(), grpc::StatusCode::CANCELLED);
  Generated next = Generate(Greedy(id, "y", 8));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, Expected(weights_, Bytes("y"), 8));
  v1::DeploymentStatus status;
  for (int i = 0; i < 100; ++i) {
    v1::Job job;
    grpc::ClientContext c;
    v1::GetJobRequest get;
    get.set_job_id(id);
    ASSERT_TRUE(cluster_->jobs().GetJob(&c, get, &job).ok());
    status = job.progress().deployment();
    if (status.requests_done() >= 2 && status.running() == 0) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(status.requests_done(), 2) << status.DebugString();
  EXPECT_EQ(status.running(), 0) << status.DebugString();
  EXPECT_LT(status.tokens_generated(), 4000) << status.DebugString();

  auto expect_error = [&](const v1::GenerateRequest& r, grpc::StatusCode code,
                          const std::string& text) {
    Generated e = Generate(r);
    EXPECT_EQ(e.status.error_code(), code) << e.status.error_message();
    EXPECT_NE(e.status.error_message().find(text), std::string::npos) << e.status.error_message();
  };
  expect_error(Greedy("j-nope", "x", 3), grpc::StatusCode::NOT_FOUND, "j-nope");
  v1::GenerateRequest bad = Greedy(id, "", 3);
  bad.add_prompt(1);
  bad.add_prompt(300);
  expect_error(bad, grpc::StatusCode::INVALID_ARGUMENT, "300");
  expect_error(Greedy(id, std::string(5000, 'a'), 3), grpc::StatusCode::OUT_OF_RANGE,
               "max_context of 4096");
  v1::GenerateRequest sampling = Greedy(id, "x", 3);
  sampling.mutable_sampling()->set_temperature(-2);
  expect_error(sampling, grpc::StatusCode::INVALID_ARGUMENT, "temperature -2");

  // A checkpoint that does not exist is refused at submit, naming it.
  {
    v1::SubmitJobRequest request;
    request.set_idempotency_key("nowhere");
    request.mutable_spec()->mutable_deployment()->set_checkpoint(cluster_->dir() + "/nowhere");
    grpc::ClientContext c;
    v1::SubmitJobResponse response;
    const grpc::Status s = cluster_->jobs().SubmitJob(&c, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("nowhere"), std::string::npos) << s.error_message();
  }
  // Undeployed: CANCELLED, and no longer serving.
  {
    grpc::ClientContext c;
    v1::CancelJobRequest cancel;
    cancel.set_job_id(id);
    v1::Job job;
    ASSERT_TRUE(cluster_->jobs().CancelJob(&c, cancel, &job).ok());
  }
  v1::Job ended;
  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(30), &ended)) << cluster_->Logs();
  EXPECT_EQ(ended.state(), v1::JOB_STATE_CANCELLED);
  expect_error(Greedy(id, "x", 3), grpc::StatusCode::FAILED_PRECONDITION, "ended");
}

// kill -9 of the deployment's worker mid-request: the request in flight ends UNAVAILABLE (its
// client may retry), the deployment is placed again on the other worker, becomes ready and serves
// the same tokens as before.
TEST_F(ServingTest, ADeploymentWhoseWorkerDiesIsPlacedAgainAndServesTheSame) {
  StartCluster(2, ClusterOptions{});
  checkpoint_ = SaveModel(cluster_->dir() + "/model", &weights_);
  const std::string id = Deploy(checkpoint_, /*max_batch=*/4, /*max_context=*/200000);
  const std::vector<int32_t> before = Generate(Greedy(id, "abc", 30)).tokens;
  ASSERT_EQ(before, Expected(weights_, Bytes("abc"), 30, 200000));

  v1::Job job;
  {
    grpc::ClientContext c;
    v1::GetJobRequest get;
    get.set_job_id(id);
    ASSERT_TRUE(cluster_->jobs().GetJob(&c, get, &job).ok());
  }
  ASSERT_EQ(job.worker_ids_size(), 1);
  const int victim = cluster_->WorkerIndex(cluster_->WorkerName(job.worker_ids(0)));
  ASSERT_GE(victim, 0);
  // A request long enough to be in flight when its worker dies.
  const Generated in_flight = KillMidRequest(id, victim);
  EXPECT_EQ(in_flight.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << in_flight.status.error_message();
  EXPECT_NE(in_flight.status.error_message().find("retry"), std::string::npos)
      << in_flight.status.error_message();

  // Placed again (on the surviving worker), ready, and the same model.
  job = WaitJob(id, [](const v1::Job& j) {
    return j.attempt() >= 2 && j.state() == v1::JOB_STATE_RUNNING &&
           j.progress().deployment().ready();
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.DebugString() << cluster_->Logs();
  EXPECT_GE(job.attempt(), 2);
  Generated after = Generate(Greedy(id, "abc", 30));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, before);
}

// A deployment on a ring of both workers: rank 0 serves and rank 1 follows it, the cache split
// between them. Generate (alone and two at once) and Score are the model's; kill -9 of the worker
// that follows ends the request in flight UNAVAILABLE (retryable) and puts the deployment back in
// the queue (one worker is left: it waits there for a second).
TEST_F(ServingTest, ADeploymentOnARingOfTwoWorkersServesTheModel) {
  StartCluster(2, ClusterOptions{});
  checkpoint_ = SaveModel(cluster_->dir() + "/model", &weights_);
  const std::string id = Deploy(checkpoint_, /*max_batch=*/4, /*max_context=*/200000, /*ranks=*/2);
  v1::Job job = WaitJob(id, [](const v1::Job&) { return true; });
  ASSERT_EQ(job.worker_ids_size(), 2) << job.DebugString();
  EXPECT_EQ(job.progress().deployment().ranks(), 2);
  Generated g = Generate(Greedy(id, "In the beginning", 40));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << cluster_->Logs();
  EXPECT_EQ(g.tokens, Expected(weights_, Bytes("In the beginning"), 40, 200000));
  v1::ScoreResponse scored;
  ASSERT_NO_FATAL_FAILURE(
      ExpectScoreOfModel(id, weights_, "And God said, Let there be light", &scored));
  std::vector<Generated> together(2);
  {
    std::thread other([&] { together[1] = Generate(Greedy(id, "Let there", 25)); });
    together[0] = Generate(Greedy(id, "a", 25));
    other.join();
  }
  EXPECT_EQ(together[0].tokens, Expected(weights_, Bytes("a"), 25, 200000));
  EXPECT_EQ(together[1].tokens, Expected(weights_, Bytes("Let there"), 25, 200000));

  // The follower (rank 1) dies mid-request.
  const int victim = cluster_->WorkerIndex(cluster_->WorkerName(job.worker_ids(1)));
  ASSERT_GE(victim, 0);
  const Generated in_flight = KillMidRequest(id, victim);
  EXPECT_EQ(in_flight.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << in_flight.status.error_message();
  EXPECT_LT(in_flight.tokens.size(), 190000u);
  job = WaitJob(
      id, [](const v1::Job& j) { return j.attempt() >= 2 && j.state() == v1::JOB_STATE_QUEUED; });
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.DebugString() << cluster_->Logs();
  EXPECT_GE(job.attempt(), 2);
}

// The same ring with rank 0 (the worker that serves) killed mid-request: the request ends
// UNAVAILABLE, the deployment goes back to the queue, and the follower's rank ends (cancelled by
// the coordinator, or its ring breaking): its worker then serves a deployment of one rank.
TEST_F(ServingTest, ARingDeploymentWhoseServingWorkerDiesIsRequeued) {
  StartCluster(2, ClusterOptions{});
  checkpoint_ = SaveModel(cluster_->dir() + "/model", &weights_);
  const std::string id = Deploy(checkpoint_, /*max_batch=*/4, /*max_context=*/200000, /*ranks=*/2);
  v1::Job job = WaitJob(id, [](const v1::Job&) { return true; });
  ASSERT_EQ(job.worker_ids_size(), 2) << job.DebugString();
  const int leader = cluster_->WorkerIndex(cluster_->WorkerName(job.worker_ids(0)));
  ASSERT_GE(leader, 0);
  const Generated in_flight = KillMidRequest(id, leader);
  EXPECT_EQ(in_flight.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << in_flight.status.error_message();
  job = WaitJob(
      id, [](const v1::Job& j) { return j.attempt() >= 2 && j.state() == v1::JOB_STATE_QUEUED; });
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.DebugString() << cluster_->Logs();
  std::vector<float> other_weights;
  const std::string other = SaveModel(cluster_->dir() + "/model-two", &other_weights);
  const std::string single = Deploy(other);  // Waits until it serves (30 s at most).
  Generated g = Generate(Greedy(single, "abc", 10));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << cluster_->Logs();
  EXPECT_EQ(g.tokens, Expected(other_weights, Bytes("abc"), 10));
}

// The CLI: dattn deploy --wait, dattn generate (bytes to stdout as they come), dattn score, and
// its usage errors; dattn cancel undeploys.
TEST_F(ServingTest, TheCliDeploysGeneratesScoresAndUndeploys) {
  SetUpServing();
  ProcessResult deployed = cluster_->Cli(
      {"deploy", "--checkpoint", checkpoint_, "--max-context", "512", "--wait", "30"});
  ASSERT_EQ(deployed.exit_code, 0) << deployed.out << deployed.err << cluster_->Logs();
  EXPECT_NE(deployed.out.find("serves the checkpoint of step 7"), std::string::npos)
      << deployed.out;
  const std::string id = JobIdFrom(deployed.out);
  ASSERT_FALSE(id.empty()) << deployed.out;

  ProcessResult generated =
      cluster_->Cli({"generate", id, "--prompt", "Let there be", "--max-tokens", "24"});
  ASSERT_EQ(generated.exit_code, 0) << generated.out << generated.err;
  std::string expected;
  for (int32_t t : Expected(weights_, Bytes("Let there be"), 24, 512)) {
    expected.push_back(static_cast<char>(t));
  }
  EXPECT_EQ(generated.out, expected + "\n");
  EXPECT_NE(generated.err.find("24 tokens after a prompt of 12 (finish: length)"),
            std::string::npos)
      << generated.err;

  ProcessResult scored = cluster_->Cli({"score", id, "--text", "light"});
  ASSERT_EQ(scored.exit_code, 0) << scored.out << scored.err;
  EXPECT_NE(scored.out.find("over 4 tokens"), std::string::npos) << scored.out;

  ProcessResult usage = cluster_->Cli({"generate", id, "--prompt", "a", "--prompt-tokens", "1"});
  EXPECT_EQ(usage.exit_code, 2) << usage.err;
  EXPECT_NE(usage.err.find("one of them"), std::string::npos) << usage.err;
  // --step picks a training job's saved step; alone, or of a job that is not training, refused.
  ProcessResult step_alone = cluster_->Cli({"deploy", "--checkpoint", checkpoint_, "--step", "7"});
  EXPECT_EQ(step_alone.exit_code, 2) << step_alone.err;
  EXPECT_NE(step_alone.err.find("--step: only with --from-job"), std::string::npos)
      << step_alone.err;
  ProcessResult not_training = cluster_->Cli({"deploy", "--from-job", id, "--step", "7"});
  EXPECT_EQ(not_training.exit_code, 4) << not_training.err;
  EXPECT_NE(not_training.err.find("job " + id + " is not a training job"), std::string::npos)
      << not_training.err;
  ProcessResult too_long = cluster_->Cli({"generate", id, "--prompt", std::string(600, 'a')});
  EXPECT_EQ(too_long.exit_code, 4) << too_long.err;
  EXPECT_NE(too_long.err.find("max_context of 512"), std::string::npos) << too_long.err;

  ProcessResult undeployed = cluster_->Cli({"cancel", id});
  ASSERT_EQ(undeployed.exit_code, 0) << undeployed.err;
  v1::Job ended;
  ASSERT_TRUE(cluster_->WaitForJobEnd(id, seconds(30), &ended)) << cluster_->Logs();
  EXPECT_EQ(ended.state(), v1::JOB_STATE_CANCELLED);
}

// A model from elsewhere: config.json and BF16 safetensors, no manifest (model/model_folder.h).
// `dattn deploy` serves it, says what it serves, and its tokens and log-probabilities are those
// of the bf16-rounded weights, not of the fp32 ones they were rounded from.
TEST_F(ServingTest, AnImportedModelServesItsOwnWeights) {
  SetUpServing();
  const std::string dir = cluster_->dir() + "/imported";
  std::vector<float> served;
  ASSERT_TRUE(
      model::testing::SaveTestImport(dir, ByteModel(), weights_, model::SafeDtype::kBF16, &served)
          .ok());
  ASSERT_NE(served, weights_);
  ProcessResult deployed =
      cluster_->Cli({"deploy", "--checkpoint", dir, "--max-context", "512", "--wait", "30"});
  ASSERT_EQ(deployed.exit_code, 0) << deployed.out << deployed.err << cluster_->Logs();
  EXPECT_NE(deployed.out.find("serves the imported model (model.safetensors, BF16)"),
            std::string::npos)
      << deployed.out;
  const std::string id = JobIdFrom(deployed.out);
  ASSERT_FALSE(id.empty()) << deployed.out;

  Generated g = Generate(Greedy(id, "In the beginning", 32));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << cluster_->Logs();
  EXPECT_EQ(g.tokens, Expected(served, Bytes("In the beginning"), 32, 512));

  v1::ScoreRequest score;
  v1::ScoreResponse scored;
  ASSERT_NO_FATAL_FAILURE(Score(id, "And God said, Let there be light", &score, &scored));
  const std::vector<double> of_served = LogProbs(served, score.text());
  const std::vector<double> of_fp32 = LogProbs(weights_, score.text());
  ASSERT_EQ(scored.logprobs_size(), static_cast<int>(of_served.size()));
  double off_fp32 = 0;
  for (size_t i = 0; i < of_served.size(); ++i) {
    EXPECT_NEAR(scored.logprobs(static_cast<int>(i)), of_served[i], 1e-4) << i;
    off_fp32 = std::max(off_fp32, std::abs(scored.logprobs(static_cast<int>(i)) - of_fp32[i]));
  }
  EXPECT_GT(off_fp32, 1e-3) << "the bf16 rounding should show in the log-probabilities";

  // A folder that is neither a checkpoint nor a model is refused at submit, naming it.
  ProcessResult refused = cluster_->Cli({"deploy", "--checkpoint", cluster_->dir()});
  EXPECT_EQ(refused.exit_code, 4) << refused.err;
  EXPECT_NE(refused.err.find("is neither a checkpoint (no MANIFEST.json) nor an imported model"),
            std::string::npos)
      << refused.err;
  ASSERT_EQ(cluster_->Cli({"cancel", id}).exit_code, 0);
}

}  // namespace
}  // namespace dattn::testing
