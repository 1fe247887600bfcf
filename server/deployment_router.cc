#include "server/deployment_router.h"

#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace dattn {
namespace server {

namespace {
constexpr absl::Duration kPoll = absl::Milliseconds(100);
}  // namespace

struct DeploymentRouter::Pending {
  std::deque<v1::ServeUpdate> updates;
  bool ended = false;  // The stream ended before a final update.
};

struct DeploymentRouter::Channel {
  absl::Mutex mu;
  std::deque<v1::ServeWork> outbox ABSL_GUARDED_BY(mu);
  std::map<int64_t, std::shared_ptr<Pending>> pending ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
  int64_t next_id ABSL_GUARDED_BY(mu) = 1;
  std::function<void()> end_stream;  // Set before the channel is shared; immutable after.

  // Ends the channel: every pending call learns it.
  void CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    closed = true;
    for (auto& [id, p] : pending) p->ended = true;
  }

  // Ends the channel from outside its stream (Close, Shutdown, a newer stream): the stream is
  // told to end first, so that by the time a call on it returns UNAVAILABLE its stream's read
  // has already been made to return.
  void End() ABSL_LOCKS_EXCLUDED(mu) {
    if (end_stream) end_stream();
    absl::MutexLock lock(&mu);
    CloseLocked();
  }
};

DeploymentRouter::~DeploymentRouter() { Shutdown(); }

std::shared_ptr<DeploymentRouter::Channel> DeploymentRouter::Find(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(job_id);
  return it == channels_.end() ? nullptr : it->second;
}

absl::Status DeploymentRouter::Serve(const std::string& job_id, const ReadFn& read,
                                     const WriteFn& write, const CancelledFn& is_cancelled,
                                     const std::function<void()>& end_stream) {
  auto channel = std::make_shared<Channel>();
  channel->end_stream = end_stream;
  std::shared_ptr<Channel> replaced;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return absl::UnavailableError("the coordinator is shutting down");
    auto it = channels_.find(job_id);
    if (it != channels_.end()) replaced = it->second;
    channels_[job_id] = channel;
  }
  if (replaced != nullptr) replaced->End();
  Channel* ch = channel.get();
  std::thread writer([ch, &write, &is_cancelled] {
    while (true) {
      v1::ServeWork work;
      {
        absl::MutexLock lock(&ch->mu);
        auto ready = [ch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ch->mu) {
          return !ch->outbox.empty() || ch->closed;
        };
        ch->mu.AwaitWithTimeout(absl::Condition(&ready), kPoll);
        if (ch->closed) return;
        if (ch->outbox.empty()) {
          if (is_cancelled()) {
            ch->CloseLocked();
            return;
          }
          continue;
        }
        work = std::move(ch->outbox.front());
        ch->outbox.pop_front();
      }
      if (!write(work)) {
        absl::MutexLock lock(&ch->mu);
        ch->CloseLocked();
        return;
      }
    }
  });
  v1::ServeUpdate update;
  while (read(&update)) {
    if (update.has_status()) continue;
    absl::MutexLock lock(&ch->mu);
    auto it = ch->pending.find(update.request_id());
    if (it != ch->pending.end()) it->second->updates.push_back(std::move(update));
    update = v1::ServeUpdate();
  }
  {
    absl::MutexLock lock(&ch->mu);
    ch->CloseLocked();
  }
  writer.join();
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(job_id);
  if (it != channels_.end() && it->second == channel) channels_.erase(it);
  return absl::OkStatus();
}

bool DeploymentRouter::Serving(const std::string& job_id) const {
  std::shared_ptr<Channel> ch = Find(job_id);
  if (ch == nullptr) return false;
  absl::MutexLock lock(&ch->mu);
  return !ch->closed;
}

absl::Status DeploymentRouter::Call(const std::string& job_id, v1::ServeWork work,
                                    const UpdateFn& on_update, const CancelledFn& is_cancelled,
                                    const std::function<bool(int64_t)>& on_queued) {
  std::shared_ptr<Channel> ch = Find(job_id);
  auto pending = std::make_shared<Pending>();
  int64_t id = 0;
  {
    if (ch == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("deployment ", job_id, " is not serving (loading, queued or ended)"));
    }
    absl::MutexLock lock(&ch->mu);
    if (ch->closed) {
      return absl::FailedPreconditionError(
          absl::StrCat("deployment ", job_id, " is not serving (its rank's stream ended)"));
    }
    id = ch->next_id++;
    work.set_request_id(id);
    ch->pending[id] = pending;
    ch->outbox.push_back(std::move(work));
  }
  auto forget = [&] {
    absl::MutexLock lock(&ch->mu);
    ch->pending.erase(id);
  };
  // The caller went away (its emit failed, or is_cancelled): the rank is told to stop the request.
  bool caller_gone = on_queued && !on_queued(id);
  while (true) {
    std::deque<v1::ServeUpdate> updates;
    bool stream_ended = false;  // No update can come any more.
    if (!caller_gone) {
      absl::MutexLock lock(&ch->mu);
      auto ready = [&pending]() { return !pending->updates.empty() || pending->ended; };
      ch->mu.AwaitWithTimeout(absl::Condition(&ready), kPoll);
      updates = std::exchange(pending->updates, {});
      stream_ended = pending->ended;
    }
    for (const v1::ServeUpdate& u : updates) {
      if (!u.error().empty()) {
        forget();
        return absl::Status(static_cast<absl::StatusCode>(u.error_code()), u.error());
      }
      const bool final_update = u.has_done() || u.has_score();
      if (!on_update(u)) {
        if (final_update) {
          forget();
          return absl::CancelledError("the caller went away");
        }
        caller_gone = true;
        break;
      }
      if (final_update) {
        forget();
        return absl::OkStatus();
      }
    }
    if (caller_gone || is_cancelled()) {
      absl::MutexLock lock(&ch->mu);
      ch->pending.erase(id);
      if (!ch->closed) {
        v1::ServeWork cancel;
        cancel.set_request_id(id);
        cancel.set_cancel(true);
        ch->outbox.push_back(std::move(cancel));
      }
      return absl::CancelledError("the caller went away; the request was cancelled");
    }
    if (stream_ended) {
      forget();
      return absl::UnavailableError(absl::StrCat(
          "deployment ", job_id,
          "'s rank stopped serving mid-request (undeployed, or its worker went away: it is "
          "placed again); retry"));
    }
  }
}

void DeploymentRouter::Close(const std::string& job_id) {
  std::shared_ptr<Channel> ch = Find(job_id);
  if (ch == nullptr) return;
  ch->End();
}

void DeploymentRouter::Shutdown() {
  std::vector<std::shared_ptr<Channel>> all;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [id, ch] : channels_) all.push_back(ch);
  }
  for (auto& ch : all) ch->End();
}

}  // namespace server
}  // namespace dattn
