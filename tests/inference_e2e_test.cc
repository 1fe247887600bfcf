// The Open Inference Protocol v2 (inference.GRPCInferenceService) end to end: a coordinator and CPU
// workers from the real binaries, ModelInfer of the "dilated-attention" model through a generated
// client stub, as a KServe or Triton client calls it: raw and typed contents against the float64
// oracle at 1, 2 and 4 ranks, both modes, forward and backward; health and metadata; every
// malformed request INVALID_ARGUMENT naming the tensor or parameter; another model NOT_FOUND; the
// dattn_inference_* metrics.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/attention_spec.h"
#include "engine/testing/oracle.h"
#include "engine/testing/test_util.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/attend_client.h"
#include "tests/cluster_fixture.h"
#include "tests/http_client.h"

namespace dattn::testing {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;
using ::testing::HasSubstr;

constexpr int64_t kB = 2, kN = 32, kH = 4, kD = 8;

class InferenceTest : public ClusterTest {
 protected:
  void SetUp() override {
    StartCluster(4);
    stub_ = inference::GRPCInferenceService::NewStub(
        cluster_->ChannelWithToken(cluster_->token(kAlice)));
  }

  grpc::Status Infer(const ModelInferRequest& request, ModelInferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    return stub_->ModelInfer(&context, request, response);
  }

  // A request of the model on `inputs` (q, k, v, dout) as raw contents, or typed when `typed`.
  ModelInferRequest Request(const std::vector<std::vector<double>>& inputs, const char* datatype,
                            bool typed = false) {
    ModelInferRequest r;
    r.set_model_name("dilated-attention");
    r.set_id("req-1");
    const char* names[] = {"q", "k", "v", "dout"};
    const v1::DType dtype = std::string(datatype) == "FP64" ? v1::DTYPE_FP64 : v1::DTYPE_FP32;
    for (size_t t = 0; t < inputs.size(); ++t) {
      auto* in = r.add_inputs();
      in->set_name(names[t]);
      in->set_datatype(datatype);
      for (int64_t d : {kB, kN, kH, kD}) in->add_shape(d);
      if (typed) {
        for (double x : inputs[t]) {
          if (dtype == v1::DTYPE_FP64) {
            in->mutable_contents()->add_fp64_contents(x);
          } else {
            in->mutable_contents()->add_fp32_contents(static_cast<float>(x));
          }
        }
      } else {
        r.add_raw_input_contents(EncodeElements(inputs[t], dtype));
      }
    }
    (*r.mutable_parameters())["segment_lengths"].set_string_param("8,16");
    (*r.mutable_parameters())["dilation_rates"].set_string_param("1,2");
    (*r.mutable_parameters())["device"].set_string_param("cpu");
    return r;
  }

  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(InferenceTest, ModelInferAgainstTheOracle) {
  const oracle::Shape shape{kB, kN, kH, kD};
  const int64_t n = shape.NumElements();
  uint64_t seed = 100;
  struct Case {
    int ranks;
    bool mixture, causal, backward, typed;
    const char* datatype;
  };
  const Case cases[] = {
      {1, false, true, true, false, "FP64"},  {2, true, false, true, true, "FP64"},
      {4, false, false, false, true, "FP32"}, {2, false, true, false, false, "FP32"},
      {4, true, true, true, false, "FP64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.ranks, " ranks ", c.mixture ? "mixture " : "grouped ",
                              c.causal ? "causal " : "", c.backward ? "backward " : "",
                              c.typed ? "typed " : "raw ", c.datatype));
    const v1::DType dtype = std::string(c.datatype) == "FP64" ? v1::DTYPE_FP64 : v1::DTYPE_FP32;
    std::vector<std::vector<double>> in;
    for (int t = 0; t < (c.backward ? 4 : 3); ++t) {
      in.push_back(DecodeElements(EncodeElements(testutil::RandomValues(n, seed++), dtype), dtype));
    }
    ModelInferRequest request = Request(in, c.datatype, c.typed);
    (*request.mutable_parameters())["num_ranks"].set_int64_param(c.ranks);
    (*request.mutable_parameters())["mode"].set_string_param(c.mixture ? "mixture" : "grouped");
    (*request.mutable_parameters())["causal"].set_bool_param(c.causal);
    ModelInferResponse response;
    grpc::Status s = Infer(request, &response);
    ASSERT_TRUE(s.ok()) << s.error_code() << " " << s.error_message() << cluster_->Logs();
    EXPECT_EQ(response.id(), "req-1");
    EXPECT_EQ(response.model_name(), "dilated-attention");
    EXPECT_EQ(response.parameters().at("num_ranks").int64_param(), c.ranks);
    EXPECT_THAT(response.parameters().at("job_id").string_param(), HasSubstr("j-"));
    AttentionSpec spec;
    spec.segment_lengths = {8, 16};
    spec.dilation_rates = {1, 2};
    spec.causal = c.causal;
    spec.mode = c.mixture ? AttentionMode::kMixture : AttentionMode::kGrouped;
    auto fwd = oracle::Forward(spec, shape, in[0], in[1], in[2]);
    ASSERT_TRUE(fwd.ok());
    std::vector<std::vector<double>> want = {fwd->out};
    if (c.backward) {
      auto g = oracle::Backward(spec, shape, in[0], in[1], in[2], in[3]);
      ASSERT_TRUE(g.ok());
      want.insert(want.end(), {g->dq, g->dk, g->dv});
    }
    ASSERT_EQ(response.outputs_size(), static_cast<int>(want.size()));
    ASSERT_EQ(response.raw_output_contents_size(), static_cast<int>(want.size()));
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_EQ(response.outputs(t).name(), names[t]);
      EXPECT_EQ(response.outputs(t).datatype(), c.datatype);
      EXPECT_THAT(std::vector<int64_t>(response.outputs(t).shape().begin(),
                                       response.outputs(t).shape().end()),
                  ::testing::ElementsAre(kB, kN, kH, kD));
      const std::vector<double> got = DecodeElements(response.raw_output_contents(t), dtype);
      const double tol = dtype == v1::DTYPE_FP64 ? 1e-12 : 1e-5;
      EXPECT_LE(testutil::RelativeError(got, want[t]), tol) << names[t];
    }
  }
  // Only the outputs asked for, in the order asked.
  std::vector<std::vector<double>> in;
  for (int t = 0; t < 4; ++t) in.push_back(testutil::RandomValues(n, seed++));
  ModelInferRequest request = Request(in, "FP64");
  request.add_outputs()->set_name("dv");
  request.add_outputs()->set_name("out");
  ModelInferResponse response;
  ASSERT_TRUE(Infer(request, &response).ok());
  ASSERT_EQ(response.outputs_size(), 2);
  EXPECT_EQ(response.outputs(0).name(), "dv");
  EXPECT_EQ(response.outputs(1).name(), "out");

  // Every call is counted by model, tenant and code.
  HttpResult metrics = HttpGet(cluster_->metrics_address(), "/metrics");
  EXPECT_THAT(metrics.body,
              HasSubstr("dattn_inference_requests_total{code=\"OK\",model=\"dilated-attention\","
                        "tenant=\"alice\"} 6"));
  EXPECT_THAT(metrics.body, HasSubstr("dattn_inference_request_seconds_count{model=\"dilated-"
                                      "attention\"} 6"));
}

TEST_F(InferenceTest, HealthAndMetadata) {
  grpc::ClientContext c1, c2, c3, c4, c5, c6;
  inference::ServerLiveResponse live;
  ASSERT_TRUE(stub_->ServerLive(&c1, {}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(stub_->ServerReady(&c2, {}, &ready).ok());
  EXPECT_TRUE(ready.ready());
  inference::ModelReadyRequest model;
  model.set_name("dilated-attention");
  inference::ModelReadyResponse model_ready;
  ASSERT_TRUE(stub_->ModelReady(&c3, model, &model_ready).ok());
  EXPECT_TRUE(model_ready.ready());
  inference::ServerMetadataResponse server;
  ASSERT_TRUE(stub_->ServerMetadata(&c4, {}, &server).ok());
  EXPECT_EQ(server.name(), "dattn");
  inference::ModelMetadataRequest meta_request;
  meta_request.set_name("dilated-attention");
  inference::ModelMetadataResponse meta;
  ASSERT_TRUE(stub_->ModelMetadata(&c5, meta_request, &meta).ok());
  EXPECT_EQ(meta.versions(0), "1");
  ASSERT_EQ(meta.inputs_size(), 4);
  EXPECT_EQ(meta.inputs(3).name(), "dout");
  EXPECT_THAT(meta.properties().at("parameters"), HasSubstr("segment_lengths"));
  model.set_name("llama");
  grpc::Status other = stub_->ModelReady(&c6, model, &model_ready);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(other.error_message(), HasSubstr("\"llama\" not found"));
}

TEST_F(InferenceTest, MalformedRequestsNameTheTensorOrParameter) {
  const int64_t n = kB * kN * kH * kD;
  std::vector<std::vector<double>> in;
  for (int t = 0; t < 3; ++t) in.push_back(testutil::RandomValues(n, 7 + t));
  struct Case {
    const char* what;
    std::function<void(ModelInferRequest*)> spoil;
    grpc::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"wrong byte length",
       [](ModelInferRequest* r) { r->mutable_raw_input_contents(1)->resize(100); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "input \"k\": 100 bytes of raw contents, expected 16384"},
      {"shape", [](ModelInferRequest* r) { r->mutable_inputs(2)->set_shape(1, 16); },
       grpc::StatusCode::INVALID_ARGUMENT, "input \"v\": shape [2, 16, 4, 8] is not q's"},
      {"datatype",
       [](ModelInferRequest* r) {
         for (auto& i : *r->mutable_inputs()) i.set_datatype("INT8");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "datatype \"INT8\" is not FP32, FP64, FP16 or BF16"},
      {"missing tensor",
       [](ModelInferRequest* r) {
         r->mutable_inputs()->RemoveLast();
         r->mutable_raw_input_contents()->RemoveLast();
       },
       grpc::StatusCode::INVALID_ARGUMENT, "input \"v\": required"},
      {"unknown input", [](ModelInferRequest* r) { r->mutable_inputs(0)->set_name("query"); },
       grpc::StatusCode::INVALID_ARGUMENT, "unknown input \"query\""},
      {"raw count", [](ModelInferRequest* r) { r->mutable_raw_input_contents()->RemoveLast(); },
       grpc::StatusCode::INVALID_ARGUMENT, "raw_input_contents: 2 entries for 3 inputs"},
      {"unknown parameter",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["window"].set_int64_param(4); },
       grpc::StatusCode::INVALID_ARGUMENT, "parameters[\"window\"]: unknown"},
      {"bad parameter",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["mode"].set_string_param("dense"); },
       grpc::StatusCode::INVALID_ARGUMENT, "parameters[\"mode\"]: \"dense\" is not"},
      {"parameter type",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["causal"].set_int64_param(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "parameters[\"causal\"]: a bool"},
      {"no segments",
       [](ModelInferRequest* r) { r->mutable_parameters()->erase("segment_lengths"); },
       grpc::StatusCode::INVALID_ARGUMENT, "parameters[\"segment_lengths\"]: required"},
      {"gradient without dout", [](ModelInferRequest* r) { r->add_outputs()->set_name("dq"); },
       grpc::StatusCode::INVALID_ARGUMENT, "dq needs the input dout"},
      {"the attention's own rules",
       [](ModelInferRequest* r) { (*r->mutable_parameters())["num_ranks"].set_int64_param(3); },
       grpc::StatusCode::INVALID_ARGUMENT, "start.num_ranks"},
      {"another model", [](ModelInferRequest* r) { r->set_model_name("resnet"); },
       grpc::StatusCode::NOT_FOUND, "model \"resnet\" not found"},
      {"another version", [](ModelInferRequest* r) { r->set_model_version("2"); },
       grpc::StatusCode::NOT_FOUND, "has no version \"2\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ModelInferRequest request = Request(in, "FP64");
    c.spoil(&request);
    ModelInferResponse response;
    grpc::Status s = Infer(request, &response);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  // Typed contents of the wrong count, and FP16 typed.
  ModelInferRequest typed = Request(in, "FP32", /*typed=*/true);
  typed.mutable_inputs(0)->mutable_contents()->mutable_fp32_contents()->RemoveLast();
  ModelInferResponse response;
  grpc::Status s = Infer(typed, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("input \"q\": contents hold 2047 fp32"));
  HttpResult metrics = HttpGet(cluster_->metrics_address(), "/metrics");
  EXPECT_THAT(metrics.body,
              HasSubstr("dattn_inference_requests_total{code=\"INVALID_ARGUMENT\",model=\"dilated-"
                        "attention\",tenant=\"alice\"} 13"));
}

}  // namespace
}  // namespace dattn::testing
