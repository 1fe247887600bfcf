#include "server/job_reader.h"

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/limits.h"
#include "server/job_state.h"
#include "server/proto_time.h"
#include "server/requests.h"

namespace dattn {
namespace server {

void StripTensors(const WorkKinds& kinds, v1::Job* job) {
  if (const WorkKind* kind = kinds.For(job->spec()); kind != nullptr) {
    kind->StripInlineOutput(job->mutable_result());
  }
}

v1::Job JobReader::Public(const JobRun& run) const {
  mu_->AssertHeld();
  v1::Job out = book_->Public(run);
  if (out.state() == v1::JOB_STATE_QUEUED && run.job.state() == v1::JOB_STATE_QUEUED) {
    std::optional<size_t> position = dispatcher_->Position(out.job_id());
    if (position.has_value()) out.set_queue_position(static_cast<int64_t>(*position));
    // Held back by its tenant's quota on running ranks: say so (after any requeue reason).
    if (std::string wait = dispatcher_->QuotaWait(out.job_id()); !wait.empty()) {
      out.set_state_reason(
          out.state_reason().empty() ? wait : absl::StrCat(out.state_reason(), "; ", wait));
    }
  }
  StripTensors(*kinds_, &out);
  return out;
}

absl::Status JobReader::Explain(const absl::Status& status) const {
  if (!absl::IsNotFound(status) || options_.retention == absl::InfiniteDuration()) return status;
  return absl::NotFoundError(absl::StrCat(status.message(), " (finished jobs are deleted ",
                                          absl::FormatDuration(options_.retention),
                                          " after they end)"));
}

void JobReader::SetExpireTime(v1::Job* job) const {
  if (IsTerminal(job->state()) && job->has_end_time() &&
      options_.retention != absl::InfiniteDuration()) {
    *job->mutable_expire_time() = ToTimestamp(FromTimestamp(job->end_time()) + options_.retention);
  }
}

void JobReader::Close() {
  mu_->AssertHeld();
  closed_ = true;
  book_->WakeWatchers();
}

absl::StatusOr<v1::Job> JobReader::GetJob(const v1::GetJobRequest& request) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.max_events() < 0 || request.max_events() > api::kMaxEvents) {
    return absl::InvalidArgumentError(absl::StrCat("max_events: must be 0 (the default, ",
                                                   api::kDefaultMaxEvents, ") to ", api::kMaxEvents,
                                                   ", got ", request.max_events()));
  }
  std::optional<v1::Job> job;
  {
    absl::MutexLock lock(mu_);
    if (const JobRun* run = book_->Find(request.job_id()); run != nullptr) job = Public(*run);
  }
  if (!job.has_value()) {
    absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
    if (!stored.ok()) return Explain(stored.status());
    job = std::move(stored->job);
    StripTensors(*kinds_, &*job);
    SetExpireTime(&*job);
  }
  if (request.include_events()) {
    const int limit = request.max_events() == 0 ? api::kDefaultMaxEvents : request.max_events();
    absl::StatusOr<std::vector<v1::JobEvent>> events =
        store_->LatestEvents(request.job_id(), limit);
    if (!events.ok()) return events.status();
    // Sequence numbers count a job's events from 1 without gaps.
    if (!events->empty()) job->set_events_omitted(events->front().seq() - 1);
    for (v1::JobEvent& e : *events) *job->add_events() = std::move(e);
  }
  return *std::move(job);
}

absl::StatusOr<v1::ListJobsResponse> JobReader::ListJobs(const v1::ListJobsRequest& request) {
  if (absl::Status s = ValidateListJobsRequest(request, *kinds_); !s.ok()) return s;
  ListFilter filter;
  for (int state : request.states()) filter.states.push_back(static_cast<v1::JobState>(state));
  filter.tenant = request.tenant();
  filter.kind = request.kind();
  absl::StatusOr<ListPage> page = store_->List(filter, request.page_size(), request.page_token());
  if (!page.ok()) return page.status();
  v1::ListJobsResponse response;
  absl::MutexLock lock(mu_);
  for (StoredJob& stored : page->jobs) {
    v1::Job* out = response.add_jobs();
    if (const JobRun* run = book_->Find(stored.job.job_id()); run != nullptr) {
      *out = Public(*run);
      continue;
    }
    *out = std::move(stored.job);
    StripTensors(*kinds_, out);
    SetExpireTime(out);
  }
  response.set_next_page_token(page->next_page_token);
  return response;
}

absl::Status JobReader::WatchJob(const v1::WatchJobRequest& request, const JobEventSink& emit,
                                 const CancelledFn& cancelled) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  if (request.after_seq() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("after_seq: must be >= 0, got ", request.after_seq()));
  }
  const absl::Status closed = absl::UnavailableError(
      "the coordinator is shutting down; watch again (with after_seq) once it is back");
  Watcher watcher;
  {
    absl::MutexLock lock(mu_);
    if (closed_) return closed;
    if (static_cast<int>(book_->watchers()) >= options_.max_watch_streams) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the coordinator serves at most ", options_.max_watch_streams,
                       " WatchJob streams at once (--max-watch-streams); retry later or poll "
                       "GetJob"));
    }
    book_->Subscribe(request.job_id(), &watcher);
  }
  struct Unsubscribe {
    JobReader* self;
    const std::string& id;
    Watcher* watcher;
    ~Unsubscribe() {
      absl::MutexLock lock(self->mu_);
      self->book_->Unsubscribe(id, watcher);
    }
  } unsubscribe{this, request.job_id(), &watcher};

  absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
  if (!stored.ok()) return Explain(stored.status());
  int64_t last = request.after_seq();
  for (;;) {
    absl::StatusOr<std::vector<v1::JobEvent>> page =
        store_->Events(request.job_id(), last, kWatchHistoryPage);
    if (!page.ok()) return page.status();
    for (const v1::JobEvent& event : *page) {
      if (!emit(event)) return absl::CancelledError("the watcher went away");
      last = event.seq();
      if (IsTerminal(event.state())) return absl::OkStatus();
    }
    if (static_cast<int>(page->size()) < kWatchHistoryPage) break;
    if (cancelled && cancelled()) return absl::CancelledError("the watcher cancelled");
  }
  if (IsTerminal(stored->job.state())) return absl::OkStatus();  // Its end is before after_seq.

  for (;;) {
    std::deque<v1::JobEvent> events;
    {
      absl::MutexLock lock(mu_);
      for (;;) {
        events = book_->TakeEvents(&watcher);
        if (!events.empty()) break;
        if (closed_) return closed;
        if (cancelled && cancelled()) return absl::CancelledError("the watcher cancelled");
        watcher.cv.WaitWithTimeout(mu_, options_.stream_poll_interval);
      }
    }
    for (const v1::JobEvent& event : events) {
      if (event.seq() <= last) continue;
      if (!emit(event)) return absl::CancelledError("the watcher went away");
      last = event.seq();
      if (IsTerminal(event.state())) return absl::OkStatus();
    }
  }
}

absl::Status JobReader::ReadOutput(const v1::ReadOutputRequest& request,
                                   const TensorChunkSink& emit) {
  if (absl::Status s = ValidateJobId(request.job_id()); !s.ok()) return s;
  absl::StatusOr<StoredJob> stored = store_->GetJob(request.job_id());
  if (!stored.ok()) return Explain(stored.status());
  const v1::Job& job = stored->job;
  if (job.state() != v1::JOB_STATE_SUCCEEDED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.job_id(), " is ", StateName(job.state()),
                     "; only a succeeded job has an output to read"));
  }
  const WorkKind* kind = kinds_->For(job.spec());
  if (kind == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.job_id(), " is of a kind this coordinator does not run (",
                     JobKind(job.spec()), "; it runs ", kinds_->Names(), ")"));
  }
  if (const v1::Tensor* inline_output = kind->InlineOutput(job.result());
      inline_output != nullptr) {
    // Stored before outputs moved out of the job's record: the tensor is in the row itself.
    v1::TensorChunk head;
    head.mutable_header()->set_dtype(inline_output->dtype());
    *head.mutable_header()->mutable_shape() = inline_output->shape();
    head.mutable_header()->set_total_bytes(static_cast<int64_t>(inline_output->data().size()));
    if (!emit(head)) return absl::CancelledError("the reader went away");
    const std::string& data = inline_output->data();
    for (size_t offset = 0; offset < data.size(); offset += api::kMaxOutputChunkBytes) {
      v1::TensorChunk chunk;
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(data.substr(offset, api::kMaxOutputChunkBytes));
      if (!emit(chunk)) return absl::CancelledError("the reader went away");
    }
    return absl::OkStatus();
  }
  if (!kind->KeepsStoredOutput(job.result())) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job.job_id(), " kept no output (it was submitted without return_output)"));
  }
  absl::StatusOr<AnalyzedSpec> spec = AnalyzeJobSpec(job.spec(), *kinds_);
  if (!spec.ok()) return spec.status();
  return outputs_->Read(job.job_id(), job.attempt(), spec->kind->Output(*spec->analysis),
                        api::kMaxOutputChunkBytes, emit);
}

}  // namespace server
}  // namespace dattn
