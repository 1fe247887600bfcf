// Many generations at once: each request's tokens equal Generate's for it alone (greedy and
// seeded sampling, stop sequences, different prompt lengths and max_tokens, more requests than
// max_batch); one batched Step per tick; priorities order admission; deadlines and cancels end
// requests and free their caches at once; bad requests are refused before anything is queued.
#include "model/batch_generator.h"

#include <memory>
#include <string>
#include <vector>

#include "engine/testing/test_util.h"
#include "gtest/gtest.h"
#include "model/longnet.h"

namespace dattn {
namespace model {
namespace {

LongNetConfig SmallConfig() {
  LongNetConfig c;
  c.vocab_size = 13;
  c.d_model = 12;
  c.num_layers = 2;
  c.num_heads = 3;
  c.ffn_dim = 16;
  c.segment_lengths = {4, 9};
  c.dilation_rates = {1, 2};
  c.attention_mode = AttentionMode::kMixture;
  c.rope_theta = 30;
  return c;
}

struct Fixture {
  std::unique_ptr<LongNetLM<double>> model;
  std::unique_ptr<Decoder<double>> decoder;
  Fixture() {
    auto m = LongNetLM<double>::CreateCpu(SmallConfig(), {}, /*num_threads=*/1);
    EXPECT_TRUE(m.ok()) << m.status();
    model = *std::move(m);
    EXPECT_TRUE(model->InitParams(8).ok());
    std::vector<double> p(static_cast<size_t>(model->layout().total()));
    EXPECT_TRUE(model->CopyParamsToHost(p.data()).ok());
    const std::vector<double> noise = testutil::RandomValues(model->layout().total(), 8, 0.5);
    for (size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
    EXPECT_TRUE(model->CopyParamsFromHost(p.data()).ok());
    auto d = Decoder<double>::Create(model.get(), 48);
    EXPECT_TRUE(d.ok()) << d.status();
    decoder = *std::move(d);
  }
};

std::vector<int32_t> Tokens(const GenerateResult& r) {
  std::vector<int32_t> t;
  for (const GeneratedToken& g : r.tokens) t.push_back(g.token);
  return t;
}

struct Outcome {
  bool done = false;
  absl::StatusOr<GenerateResult> result = absl::UnknownError("not done");
  std::vector<int32_t> streamed;
};

GenerationRequest Request(std::vector<int32_t> prompt, GenerateOptions o, Outcome* out,
                          int priority = 0) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.options = std::move(o);
  r.priority = priority;
  r.on_token = [out](const GeneratedToken& g) {
    out->streamed.push_back(g.token);
    return true;
  };
  r.on_done = [out](absl::StatusOr<GenerateResult> result) {
    EXPECT_FALSE(out->done) << "on_done called twice";
    out->done = true;
    out->result = std::move(result);
  };
  return r;
}

// Ticks until nothing is queued or running (at most `limit` ticks).
void Drain(BatchGenerator<double>& g, absl::Time now, int limit = 200) {
  for (int i = 0; i < limit && (g.queued() > 0 || g.running() > 0); ++i) {
    ASSERT_TRUE(g.Tick(now).ok());
  }
  EXPECT_EQ(g.queued() + g.running(), 0);
}

TEST(BatchGeneratorTest, EachRequestGetsWhatItWouldAlone) {
  Fixture f;
  std::vector<std::vector<int32_t>> prompts = {
      {1, 2, 3}, {4}, {5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2}, {3, 3}, {7, 1, 7, 1, 7}, {2, 9, 4, 9}};
  std::vector<GenerateOptions> options(prompts.size());
  for (size_t i = 0; i < options.size(); ++i) {
    options[i].max_tokens = 5 + 3 * static_cast<int64_t>(i);
    options[i].sampling.temperature = i % 2 == 0 ? 0.0 : 0.9;
    options[i].sampling.top_k = i == 3 ? 4 : 0;
    options[i].sampling.seed = 100 + i;
  }
  // A stop sequence taken from request 4's own output.
  std::vector<GenerateResult> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i == 4) {
      auto free_run = Generate(*f.decoder, prompts[i], options[i], nullptr);
      ASSERT_TRUE(free_run.ok());
      options[i].stop_sequences = {{free_run->tokens[5].token, free_run->tokens[6].token}};
    }
    auto r = Generate(*f.decoder, prompts[i], options[i], nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    alone.push_back(*r);
  }
  auto g = BatchGenerator<double>::Create(f.decoder.get(), /*max_batch=*/4);
  ASSERT_TRUE(g.ok());
  std::vector<Outcome> outcomes(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE((*g)->Submit(Request(prompts[i], options[i], &outcomes[i])).ok());
  }
  EXPECT_EQ((*g)->queued(), 6);
  absl::StatusOr<TickStats> first = (*g)->Tick(absl::Now());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->admitted, 4);    // max_batch
  EXPECT_EQ(first->step_calls, 1);  // One Step for all of them.
  EXPECT_EQ(first->stepped, 4);
  EXPECT_EQ((*g)->running(), 4);
  EXPECT_EQ((*g)->cache_bytes(), 4 * f.decoder->geometry().ElementsPerSequence() * 8);
  Drain(**g, absl::Now());
  EXPECT_EQ((*g)->cache_bytes(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outcomes[i].done) << i;
    ASSERT_TRUE(outcomes[i].result.ok()) << outcomes[i].result.status();
    EXPECT_EQ(Tokens(*outcomes[i].result), Tokens(alone[i])) << "request " << i;
    EXPECT_EQ(outcomes[i].streamed, Tokens(alone[i])) << "request " << i;
    EXPECT_EQ(outcomes[i].result->finish, alone[i].finish) << "request " << i;
    EXPECT_EQ(outcomes[i].result->steps, alone[i].steps) << "request " << i;
    for (size_t k = 0; k < alone[i].tokens.size(); ++k) {
      EXPECT_NEAR(outcomes[i].result->tokens[k].logprob, alone[i].tokens[k].logprob, 1e-12);
    }
  }
  EXPECT_EQ(alone[4].finish, FinishReason::kStop);
}

TEST(BatchGeneratorTest, PriorityOrdersAdmissionThenSubmission) {
  Fixture f;
  auto g = BatchGenerator<double>::Create(f.decoder.get(), /*max_batch=*/1);
  ASSERT_TRUE(g.ok());
  std::vector<int> order;
  GenerateOptions o;
  o.max_tokens = 2;
  std::vector<Outcome> outcomes(4);
  const int priorities[] = {0, 5, 1, 5};
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = Request({1, 2}, o, &outcomes[static_cast<size_t>(i)], priorities[i]);
    auto done = r.on_done;
    r.on_done = [&order, i, done](absl::StatusOr<GenerateResult> result) {
      order.push_back(i);
      done(std::move(result));
    };
    ASSERT_TRUE((*g)->Submit(std::move(r)).ok());
  }
  Drain(**g, absl::Now());
  EXPECT_EQ(order, (std::vector<int>{1, 3, 2, 0}));
  // Each was prefilled; the last admitted waited longest in the queue.
  for (const Outcome& o : outcomes) {
    ASSERT_TRUE(o.result.ok());
    EXPECT_GT(o.result->prefill_seconds, 0);
  }
  EXPECT_GT(outcomes[0].result->queue_seconds, outcomes[1].result->queue_seconds);
}

TEST(BatchGeneratorTest, DeadlinesAndCancelsEndRequestsAndFreeTheirCaches) {
  Fixture f;
  auto g = BatchGenerator<double>::Create(f.decoder.get(), /*max_batch=*/2);
  ASSERT_TRUE(g.ok());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  GenerateOptions o;
  o.max_tokens = 30;
  Outcome early, cancelled, queued_late, survivor;
  GenerationRequest r = Request({1, 2, 3}, o, &early);
  r.deadline = t0 + absl::Seconds(1);
  ASSERT_TRUE((*g)->Submit(std::move(r)).ok());
  absl::StatusOr<int64_t> cancel_id = (*g)->Submit(Request({4, 5}, o, &cancelled));
  r = Request({6}, o, &queued_late);
  r.deadline = t0 + absl::Seconds(1);
  ASSERT_TRUE((*g)->Submit(std::move(r)).ok());
  ASSERT_TRUE((*g)->Tick(t0).ok());
  EXPECT_EQ((*g)->running(), 2);
  EXPECT_EQ((*g)->queued(), 1);
  ASSERT_TRUE((*g)->Tick(t0).ok());
  // A cancel ends the running request at once, with the tokens it had handed out.
  ASSERT_TRUE(cancel_id.ok());
  EXPECT_TRUE((*g)->Cancel(*cancel_id));
  EXPECT_FALSE((*g)->Cancel(*cancel_id));
  ASSERT_TRUE(cancelled.done);
  ASSERT_TRUE(cancelled.result.ok());
  EXPECT_EQ(cancelled.result->finish, FinishReason::kCancelled);
  EXPECT_EQ(Tokens(*cancelled.result), cancelled.streamed);
  EXPECT_EQ((*g)->running(), 1);
  EXPECT_EQ((*g)->cache_bytes(), f.decoder->geometry().ElementsPerSequence() * 8);
  ASSERT_TRUE((*g)->Submit(Request({7, 7}, o, &survivor)).ok());
  // Past the deadline: the running request and the queued one end; the survivor is admitted.
  absl::StatusOr<TickStats> late = (*g)->Tick(t0 + absl::Seconds(2));
  ASSERT_TRUE(late.ok());
  ASSERT_TRUE(early.done && queued_late.done);
  EXPECT_EQ(early.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(queued_late.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(queued_late.result.status().message().find("still queued"), std::string::npos);
  EXPECT_EQ((*g)->running(), 1);
  Drain(**g, t0 + absl::Seconds(2));
  ASSERT_TRUE(survivor.done && survivor.result.ok());
  EXPECT_EQ(survivor.result->tokens.size(), 30u);
}

TEST(BatchGeneratorTest, BadRequestsAreRefusedBeforeAnythingIsQueued) {
  Fixture f;
  auto g = BatchGenerator<double>::Create(f.decoder.get(), 2);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(BatchGenerator<double>::Create(f.decoder.get(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  Outcome o;
  auto code = [&](std::vector<int32_t> prompt, GenerateOptions options) {
    return (*g)->Submit(Request(std::move(prompt), std::move(options), &o)).status();
  };
  absl::Status s = code({}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = code({1, 13}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt token 1 is 13"), std::string::npos) << s;
  s = code(std::vector<int32_t>(49, 1), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("max_context of 48"), std::string::npos) << s;
  GenerateOptions bad;
  bad.sampling.top_p = 2;
  s = code({1}, bad);
  EXPECT_NE(s.message().find("top_p 2"), std::string::npos) << s;
  EXPECT_EQ((*g)->queued(), 0);
  EXPECT_FALSE(o.done);
}

}  // namespace
}  // namespace model
}  // namespace dattn
