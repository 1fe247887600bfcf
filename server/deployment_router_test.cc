// The router between Generate/Score calls and a deployment rank's Serve stream, with the stream
// played in memory: updates reach their call in order and a final one ends it OK; the rank's
// error ends it with its code; a stream that ends with a request in flight (even with its last
// tokens still to hand over) ends it UNAVAILABLE; a caller that goes away sends the rank a cancel;
// no stream is FAILED_PRECONDITION; a newer stream replaces an older one, which is ended.
#include "server/deployment_router.h"

#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dattn {
namespace server {
namespace {

// One rank's stream: what the router writes (work) and what the test makes the rank send.
class FakeStream {
 public:
  bool Read(v1::ServeUpdate* update) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](FakeStream* s)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->updates_.empty() || s->ended_; },
        this));
    if (updates_.empty()) return false;
    *update = updates_.front();
    updates_.pop_front();
    return true;
  }
  bool Write(const v1::ServeWork& work) {
    absl::MutexLock lock(&mu_);
    work_.push_back(work);
    return true;
  }
  void Send(v1::ServeUpdate update) {
    absl::MutexLock lock(&mu_);
    updates_.push_back(std::move(update));
  }
  // Ends the stream after what was sent has been read.
  void End() {
    absl::MutexLock lock(&mu_);
    ended_ = true;
  }
  // Waits (5 s at most) for the n-th work item written.
  v1::ServeWork Work(size_t n) {
    absl::MutexLock lock(&mu_);
    auto written = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return work_.size() > n; };
    mu_.AwaitWithTimeout(absl::Condition(&written), absl::Seconds(5));
    return work_.size() > n ? work_[n] : v1::ServeWork();
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::ServeUpdate> updates_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ServeWork> work_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

v1::ServeUpdate Token(int64_t id, int32_t token) {
  v1::ServeUpdate u;
  u.set_request_id(id);
  u.mutable_token()->set_token(token);
  return u;
}

struct Serving {
  FakeStream stream;
  std::atomic<bool> ended_by_router{false};
  std::thread thread;
  void Start(DeploymentRouter* router, const std::string& job) {
    thread = std::thread([this, router, job] {
      EXPECT_TRUE(router
                      ->Serve(
                          job, [this](v1::ServeUpdate* u) { return stream.Read(u); },
                          [this](const v1::ServeWork& w) { return stream.Write(w); },
                          [] { return false; },
                          [this] {
                            ended_by_router = true;
                            stream.End();
                          })
                      .ok());
    });
    for (int i = 0; i < 500 && !router->Serving(job); ++i) absl::SleepFor(absl::Milliseconds(2));
  }
  ~Serving() {
    stream.End();
    if (thread.joinable()) thread.join();
  }
};

v1::ServeWork GenerateWork() {
  v1::ServeWork w;
  w.mutable_generate()->add_prompt(1);
  return w;
}

TEST(DeploymentRouterTest, UpdatesReachTheirCallAndAFinalOneEndsIt) {
  DeploymentRouter router;
  Serving rank;
  rank.Start(&router, "j-1");
  ASSERT_TRUE(router.Serving("j-1"));
  std::vector<int32_t> tokens;
  int64_t queued_id = 0;
  std::thread rank_side([&] {
    const v1::ServeWork w = rank.stream.Work(0);
    ASSERT_TRUE(w.has_generate());
    rank.stream.Send(Token(w.request_id(), 7));
    rank.stream.Send(Token(w.request_id() + 100, 9));  // Another request's: not this call's.
    rank.stream.Send(Token(w.request_id(), 8));
    v1::ServeUpdate done;
    done.set_request_id(w.request_id());
    done.mutable_done()->set_finish_reason("length");
    rank.stream.Send(done);
  });
  absl::Status s = router.Call(
      "j-1", GenerateWork(),
      [&](const v1::ServeUpdate& u) {
        if (u.has_token()) tokens.push_back(u.token().token());
        return true;
      },
      [] { return false; },
      [&](int64_t id) {
        queued_id = id;
        return true;
      });
  rank_side.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(tokens, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(queued_id, 1);

  // The rank's error, with its code.
  std::thread failing([&] {
    const v1::ServeWork w = rank.stream.Work(1);
    v1::ServeUpdate error;
    error.set_request_id(w.request_id());
    error.set_error("prompt token 1 is 999");
    error.set_error_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    rank.stream.Send(error);
  });
  s = router.Call(
      "j-1", GenerateWork(), [](const v1::ServeUpdate&) { return true; }, [] { return false; });
  failing.join();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(), "prompt token 1 is 999");
}

TEST(DeploymentRouterTest, AStreamThatEndsMidRequestEndsItUnavailableEvenWithTokensLeft) {
  DeploymentRouter router;
  Serving rank;
  rank.Start(&router, "j-2");
  std::thread rank_side([&] {
    const v1::ServeWork w = rank.stream.Work(0);
    // Tokens and the end together: the call must hand the tokens over, then say UNAVAILABLE.
    rank.stream.Send(Token(w.request_id(), 1));
    rank.stream.Send(Token(w.request_id(), 2));
    rank.stream.End();
  });
  std::vector<int32_t> tokens;
  absl::Status s = router.Call(
      "j-2", GenerateWork(),
      [&](const v1::ServeUpdate& u) {
        tokens.push_back(u.token().token());
        return true;
      },
      [] { return false; });
  rank_side.join();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find("retry"), absl::string_view::npos) << s;
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 2}));
  rank.thread.join();
  EXPECT_FALSE(router.Serving("j-2"));
  s = router.Call(
      "j-2", GenerateWork(), [](const v1::ServeUpdate&) { return true; }, [] { return false; });
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
}

TEST(DeploymentRouterTest, ACallerThatGoesAwaySendsTheRankACancel) {
  DeploymentRouter router;
  Serving rank;
  rank.Start(&router, "j-3");
  std::thread rank_side([&] {
    const v1::ServeWork w = rank.stream.Work(0);
    rank.stream.Send(Token(w.request_id(), 5));
  });
  // The caller takes one token and goes away.
  absl::Status s = router.Call(
      "j-3", GenerateWork(), [](const v1::ServeUpdate&) { return false; }, [] { return false; });
  rank_side.join();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  const v1::ServeWork cancel = rank.stream.Work(1);
  EXPECT_TRUE(cancel.cancel());
  EXPECT_EQ(cancel.request_id(), 1);
  // is_cancelled does the same while nothing comes.
  std::atomic<bool> cancelled{false};
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(50));
    cancelled = true;
  });
  s = router.Call(
      "j-3", GenerateWork(), [](const v1::ServeUpdate&) { return true; },
      [&] { return cancelled.load(); });
  canceller.join();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_TRUE(rank.stream.Work(3).cancel());
}

TEST(DeploymentRouterTest, ANewerStreamReplacesAnOlderOne) {
  DeploymentRouter router;
  Serving first, second;
  first.Start(&router, "j-4");
  std::atomic<bool> done{false};
  absl::Status old_call;
  std::thread caller([&] {
    old_call = router.Call(
        "j-4", GenerateWork(), [](const v1::ServeUpdate&) { return true; }, [] { return false; });
    done = true;
  });
  first.stream.Work(0);  // The call is in flight on the first stream.
  second.Start(&router, "j-4");
  caller.join();
  EXPECT_TRUE(absl::IsUnavailable(old_call)) << old_call;
  EXPECT_TRUE(first.ended_by_router.load());
  EXPECT_TRUE(router.Serving("j-4"));
  router.Shutdown();
  EXPECT_FALSE(router.Serving("j-4"));
  EXPECT_TRUE(second.ended_by_router.load());
}

}  // namespace
}  // namespace server
}  // namespace dattn
