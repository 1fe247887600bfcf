#include "server/job_recorder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/job_state.h"
#include "server/log.h"

namespace dattn {
namespace server {

bool JobRecorder::KeepsOutput(const v1::Job& job) const {
  const WorkKind* kind = kinds_->For(job.spec());
  return kind != nullptr && kind->KeepsStoredOutput(job.result());
}

absl::Status JobRecorder::Flush(const Tickets& tickets) {
  absl::Status first;
  for (const Ticket& ticket : tickets) {
    absl::Status s = FlushOne(ticket);
    if (first.ok()) first = s;
  }
  return first;
}

absl::Status JobRecorder::FlushOne(const Ticket& ticket) {
  if (ticket.queue == nullptr) return absl::OkStatus();
  absl::MutexLock flush_lock(&ticket.queue->flush_mu);
  for (;;) {
    PendingWrite write;
    {
      absl::MutexLock lock(mu_);
      absl::Status done;
      if (!book_->NextWrite(ticket, &write, &done)) return done;
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<int64_t> seq = store_->Update(write.job, write.event);
    metrics_->ObserveStoreCommit(absl::ToDoubleSeconds(absl::Now() - start));
    if (seq.ok() && IsTerminal(write.job.state())) {
      // The job's end is durable: of its stored shards only a succeeded job's output stays.
      const bool kept = write.job.state() == v1::JOB_STATE_SUCCEEDED && KeepsOutput(write.job);
      outputs_->Discard(write.job.job_id(), kept ? write.job.attempt() : -1);
    }
    absl::MutexLock lock(mu_);
    if (!seq.ok()) {
      NoteWriteFailure(seq.status());
      return book_->WriteFailed(ticket, std::move(write), seq.status());
    }
    book_->WriteCommitted(ticket, std::move(write), *seq);
  }
}

void JobRecorder::RetryStalled() {
  std::vector<std::pair<Ticket, std::string>> stalled;  // With the job's id, for the log.
  {
    absl::MutexLock lock(mu_);
    for (const Ticket& ticket : book_->Stalled()) {
      stalled.push_back({ticket, book_->FirstPendingJob(ticket)});
    }
  }
  for (const auto& [ticket, job_id] : stalled) {
    absl::Status s = FlushOne(ticket);
    absl::MutexLock lock(mu_);
    if (s.ok() || !absl::IsUnavailable(s)) {
      book_->Unstall(ticket);
      if (s.ok()) Log(absl::StrCat("job ", job_id, ": the writes that had failed are recorded"));
    } else {
      // Still failing: the others most likely would too, and each try can wait the store's busy
      // timeout; the next pass goes on.
      break;
    }
  }
}

bool JobRecorder::CheckStore() {
  const absl::Time now = clock_->Now();
  const bool unhealthy = !store_->Health().ok();
  {
    absl::MutexLock lock(mu_);
    // The store's own commit time is real time; the probe interval is counted on both clocks.
    if (!unhealthy && (absl::Now() - store_->Stats().last_commit < options_.probe_interval ||
                       now - last_probe_ < options_.probe_interval)) {
      return false;
    }
    last_probe_ = now;
  }
  store_->Probe().IgnoreError();  // Its outcome is what Health() now says.
  const absl::Status health = store_->Health();
  bool recovered = false;
  {
    absl::MutexLock lock(mu_);
    if (health.ok() && !store_error_.ok()) {
      Log(absl::StrCat("the job store takes writes again (it failed with: ", store_error_.message(),
                       "); resuming"));
      store_error_ = absl::OkStatus();
      recovered = true;
    } else if (!health.ok() && store_error_.ok()) {
      store_error_ = health;
      Log(absl::StrCat("not ready: the job store cannot be written: ", health.message()));
    }
  }
  // Writes decided while the store failed are committed now, in order, before anything new.
  if (recovered) RetryStalled();
  return recovered;
}

std::vector<StoredJob> JobRecorder::QueuedNotInBook() {
  std::vector<StoredJob> out;
  absl::StatusOr<std::vector<StoredJob>> active = store_->LoadActive();
  if (!active.ok()) return out;
  absl::MutexLock lock(mu_);
  for (StoredJob& stored : *active) {
    if (stored.job.state() == v1::JOB_STATE_QUEUED && book_->Find(stored.job.job_id()) == nullptr) {
      out.push_back(std::move(stored));
    }
  }
  return out;
}

void JobRecorder::Expire() {
  if (options_.retention == absl::InfiniteDuration()) return;
  {
    absl::MutexLock lock(mu_);
    if (!store_error_.ok()) return;
  }
  absl::StatusOr<std::vector<std::string>> expired =
      store_->ListExpired(clock_->Now() - options_.retention, options_.expire_batch);
  if (!expired.ok()) return;
  for (const std::string& job_id : *expired) {
    absl::StatusOr<v1::Job> deleted = store_->Delete(job_id);
    if (!deleted.ok()) continue;
    outputs_->Discard(job_id, -1);
    metrics_->JobDeleted(JobKind(deleted->spec()), deleted->state());
  }
}

void JobRecorder::CollectOutputs() {
  // An attempt's shards outlive the attempt only as a succeeded job's output.
  for (const std::string& job_id : outputs_->Jobs()) {
    absl::StatusOr<StoredJob> stored = store_->GetJob(job_id);
    if (!stored.ok()) {
      if (absl::IsNotFound(stored.status())) outputs_->Discard(job_id, -1);
      continue;
    }
    const bool kept = stored->job.state() == v1::JOB_STATE_SUCCEEDED && KeepsOutput(stored->job);
    outputs_->Discard(job_id, kept ? stored->job.attempt() : -1);
  }
}

absl::Status JobRecorder::store_error() const {
  mu_->AssertHeld();
  return store_error_;
}

void JobRecorder::NoteWriteFailure(const absl::Status& error) {
  mu_->AssertHeld();
  // Unready while the store itself says it cannot be written (a lock held by another process past
  // the busy timeout is UNAVAILABLE too, and leaves the store healthy).
  if (absl::IsUnavailable(error) && store_error_.ok() && !store_->Health().ok()) {
    store_error_ = error;
  }
}

absl::Status JobRecorder::Health() {
  {
    absl::MutexLock lock(mu_);
    if (!store_error_.ok()) return store_error_;
  }
  return store_->Health();
}

}  // namespace server
}  // namespace dattn
