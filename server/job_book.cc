#include "server/job_book.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/job_state.h"
#include "server/log.h"
#include "server/proto_time.h"

namespace dattn {
namespace server {
namespace {

bool IsActiveRun(v1::JobState state) {
  return state == v1::JOB_STATE_PLACED || state == v1::JOB_STATE_RUNNING;
}

}  // namespace

JobRun* JobBook::Add(const StoredJob& stored, const WorkKind* kind,
                     std::shared_ptr<const JobAnalysis> analysis) {
  auto run = std::make_unique<JobRun>();
  run->job = stored.job;
  run->durable = stored.job;
  run->submit_seq = stored.submit_seq;
  run->kind = kind;
  run->analysis = std::move(analysis);
  JobRun* raw = run.get();
  runs_[stored.job.job_id()] = std::move(run);
  return raw;
}

JobRun* JobBook::Find(const std::string& job_id) {
  auto it = runs_.find(job_id);
  return it == runs_.end() ? nullptr : it->second.get();
}

std::vector<JobRun*> JobBook::Runs() {
  std::vector<JobRun*> out;
  out.reserve(runs_.size());
  for (auto& [id, run] : runs_) out.push_back(run.get());
  return out;
}

bool JobBook::AnyActiveRun() const {
  for (const auto& [id, run] : runs_) {
    const bool resident = run->analysis != nullptr && run->analysis->resident;
    if (!run->terminal && IsActiveRun(run->job.state()) && !resident) return true;
  }
  return false;
}

Ticket JobBook::Queue(JobRun* run, v1::JobEvent event, absl::Time now) {
  event.set_job_id(run->job.job_id());
  event.set_state(run->job.state());
  if (!event.has_time()) *event.mutable_time() = ToTimestamp(now);
  PendingWrite write;
  write.job = run->job;
  write.job.clear_events();
  write.job.set_queue_position(0);
  write.event = std::move(event);
  run->writes->pending.push_back(std::move(write));
  return {run->writes, ++run->writes->enqueued};
}

Ticket JobBook::Transition(JobRun* run, v1::JobState state, const std::string& kind,
                           const std::string& message, absl::Time now) {
  const v1::JobState from = run->job.state();
  if (absl::Status s = CheckTransition(from, state); !s.ok()) {
    // Every caller checks the state first; reaching this is a coordinator bug, not a user error.
    Log(absl::StrCat("internal error: job ", run->job.job_id(), " event ", kind, ": ",
                     s.message()));
    return {};
  }
  run->job.set_state(state);
  if (from != state) run->job.set_state_reason(message);
  const char* kind_name = run->kind->name();
  if (IsTerminal(state)) {
    run->terminal = true;
    *run->job.mutable_end_time() = ToTimestamp(now);
    if (run->job.has_start_time()) {
      metrics_->ObserveJobDuration(
          kind_name, absl::ToDoubleSeconds(now - FromTimestamp(run->job.start_time())));
    }
  }
  metrics_->JobTransition(kind_name, from, state);
  v1::JobEvent event;
  event.set_kind(kind);
  event.set_message(message);
  *event.mutable_time() = ToTimestamp(now);
  return Queue(run, std::move(event), now);
}

Ticket JobBook::Append(JobRun* run, v1::JobEvent event, absl::Time now) {
  return Queue(run, std::move(event), now);
}

bool JobBook::NextWrite(const Ticket& ticket, PendingWrite* write, absl::Status* done) {
  WriteQueue& queue = *ticket.queue;
  if (queue.durable >= ticket.seq) {
    *done = absl::OkStatus();
    return false;
  }
  if (!queue.error.ok()) {
    *done = queue.error;
    return false;
  }
  *write = std::move(queue.pending.front());
  queue.pending.pop_front();
  return true;
}

void JobBook::WriteCommitted(const Ticket& ticket, PendingWrite write, int64_t seq) {
  WriteQueue& queue = *ticket.queue;
  ++queue.durable;
  write.event.set_seq(seq);
  auto range = watchers_.equal_range(write.event.job_id());
  for (auto it = range.first; it != range.second; ++it) {
    it->second->events.push_back(write.event);
    it->second->cv.Signal();
  }
  auto it = runs_.find(write.job.job_id());
  if (it != runs_.end() && it->second->writes == ticket.queue) {
    it->second->durable = std::move(write.job);
    if (it->second->terminal && queue.pending.empty()) {
      runs_.erase(it);  // Its terminal event is durable: the store answers for it from now on.
    }
  }
}

absl::Status JobBook::WriteFailed(const Ticket& ticket, PendingWrite write,
                                  const absl::Status& error) {
  WriteQueue& queue = *ticket.queue;
  absl::Status failed = absl::UnavailableError(
      absl::StrCat("cannot record job ", write.job.job_id(), ": ", error.message()));
  if (absl::IsUnavailable(error)) {
    // Transient, or the store cannot be written now: the write stays first in line (nothing
    // decided is lost) and is tried again by the next flush of this job and by the monitor.
    queue.pending.push_front(std::move(write));
    if (!queue.stalled) {
      queue.stalled = true;
      stalled_.push_back(ticket.queue);
    }
  } else {
    queue.error = error;
    Log(absl::StrCat("internal error: store rejected an update of job ", write.job.job_id(), " (",
                     write.event.kind(), "): ", error.message()));
  }
  return failed;
}

std::vector<Ticket> JobBook::Stalled() const {
  std::vector<Ticket> out;
  for (const std::shared_ptr<WriteQueue>& queue : stalled_) out.push_back({queue, queue->enqueued});
  return out;
}

void JobBook::Unstall(const Ticket& ticket) {
  ticket.queue->stalled = false;
  stalled_.erase(std::remove(stalled_.begin(), stalled_.end(), ticket.queue), stalled_.end());
}

std::string JobBook::FirstPendingJob(const Ticket& ticket) const {
  return ticket.queue->pending.empty() ? "" : ticket.queue->pending.front().job.job_id();
}

v1::Job JobBook::Public(const JobRun& run) const {
  // The committed state, so that a reader never sees a state that a crash could take back, nor a
  // state whose event is not yet in the history; progress is the live figure (its writes are rate
  // limited) while the attempt is the committed one.
  v1::Job out = run.durable;
  out.clear_events();
  out.set_queue_position(0);
  if (out.state() == run.job.state() && out.attempt() == run.job.attempt()) {
    *out.mutable_progress() = run.job.progress();
  }
  return out;
}

void JobBook::Subscribe(const std::string& job_id, Watcher* watcher) {
  watchers_.emplace(job_id, watcher);
}

void JobBook::Unsubscribe(const std::string& job_id, Watcher* watcher) {
  auto range = watchers_.equal_range(job_id);
  for (auto it = range.first; it != range.second; ++it) {
    if (it->second == watcher) {
      watchers_.erase(it);
      return;
    }
  }
}

std::deque<v1::JobEvent> JobBook::TakeEvents(Watcher* watcher) {
  std::deque<v1::JobEvent> events;
  events.swap(watcher->events);
  return events;
}

void JobBook::WakeWatchers() {
  for (auto& [id, watcher] : watchers_) watcher->cv.SignalAll();
}

}  // namespace server
}  // namespace dattn
