#include "client/watch.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/exit_codes.h"
#include "client/format.h"
#include "grpcpp/client_context.h"

namespace dattn {
namespace client {
namespace {

constexpr int kBarWidth = 30;
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(2);
// A stream that stayed open this long had been working when it broke, even without events.
constexpr absl::Duration kHealthyStream = absl::Seconds(2);

grpc::Status ReadJob(v1::JobService::StubInterface* stub, const std::string& job_id,
                     absl::Duration timeout, v1::Job* job) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return stub->GetJob(&context, request, job);
}

// Failures of the stream, rather than answers about the job: worth reconnecting after.
bool IsTransient(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
      return true;
    default:
      return false;
  }
}

// A training job's figures on the live line: the last step's loss and rate, the last validation
// loss.
struct TrainingLine {
  double loss = 0;
  double tokens_per_second = 0;
  std::optional<double> validation_loss;
};

TrainingLine TrainingLineOf(const v1::TrainingProgress& progress) {
  TrainingLine line;
  line.loss = progress.loss();
  line.tokens_per_second = progress.tokens_per_second();
  if (progress.has_last_evaluation() && progress.last_evaluation().has_validation()) {
    line.validation_loss = progress.last_evaluation().validation_loss();
  }
  return line;
}

// The steps of `progress`: the job's count, else (a training job's progress that carries only its
// own) the trainer's.
std::pair<int64_t, int64_t> StepsOf(const v1::JobProgress& progress) {
  if (progress.steps_total() <= 0 && progress.has_training()) {
    return {progress.training().step(), progress.training().steps_total()};
  }
  return {progress.steps_done(), progress.steps_total()};
}

// The live progress line of kTty mode. Events update it from the watching thread; a ticker thread
// redraws it so that the elapsed time moves while no event arrives.
class ProgressLine {
 public:
  ProgressLine(std::ostream& out, const v1::Job& job, absl::Duration redraw_every)
      : out_(out), job_id_(job.job_id()), state_(job.state()) {
    std::tie(done_, total_) = StepsOf(job.progress());
    if (job.progress().has_training()) training_ = TrainingLineOf(job.progress().training());
    const absl::Time created = ToTime(job.create_time());
    start_ = created == absl::InfinitePast() ? absl::Now() : created;
    {
      absl::MutexLock lock(&mu_);
      RedrawLocked();
    }
    ticker_ = std::thread([this, redraw_every] {
      while (!stop_.WaitForNotificationWithTimeout(redraw_every)) {
        absl::MutexLock lock(&mu_);
        RedrawLocked();
      }
    });
  }

  ~ProgressLine() { Finish(nullptr); }

  void OnEvent(const v1::JobEvent& event) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    state_ = event.state();
    if (event.has_progress()) {
      const auto [done, total] = StepsOf(event.progress());
      if (total > 0) {
        done_ = done;
        total_ = total;
      }
      if (event.progress().has_training()) {
        training_ = TrainingLineOf(event.progress().training());
      }
    }
    if (event.kind() != "progress") out_ << "\r\x1b[2K" << EventLine(event) << '\n';
    RedrawLocked();
  }

  // Ends the line where it stands, so that a notice written to another stream of the same terminal
  // starts on a line of its own; the next redraw starts a new line.
  void Interrupt() {
    absl::MutexLock lock(&mu_);
    if (!finished_) out_ << '\n' << std::flush;
  }

  // Stops the ticker and draws the last line: with `final_job` (a job that ended) its end state,
  // end time and progress; a SUCCEEDED job's bar full. FAILED and CANCELLED jobs end on a line
  // without a bar, saying where they stopped. Idempotent.
  void Finish(const v1::Job* final_job) {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (ticker_.joinable()) ticker_.join();
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    if (final_job != nullptr) {
      state_ = final_job->state();
      const auto [done, total] = StepsOf(final_job->progress());
      if (total > 0) {
        done_ = done;
        total_ = total;
      }
      if (final_job->progress().has_training()) {
        training_ = TrainingLineOf(final_job->progress().training());
      }
      if (final_job->result().has_training()) {
        // The run's own end: its last step's loss, its rate, its final evaluation.
        const v1::TrainingJobResult& result = final_job->result().training();
        TrainingLine line;
        line.loss = result.final_loss();
        line.tokens_per_second = result.tokens_per_second();
        if (result.has_final_evaluation() && result.final_evaluation().has_validation()) {
          line.validation_loss = result.final_evaluation().validation_loss();
        } else if (training_.has_value()) {
          line.validation_loss = training_->validation_loss;
        }
        training_ = line;
      }
      const absl::Time ended = ToTime(final_job->end_time());
      if (ended != absl::InfinitePast()) end_ = ended;
      if (state_ == v1::JOB_STATE_SUCCEEDED) {
        complete_ = true;
        if (total_ > 0) done_ = total_;
      }
    }
    RedrawLocked();
    out_ << '\n' << std::flush;
  }

 private:
  void RedrawLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string line = absl::StrCat("\r\x1b[2K", Printable(job_id_), "  ", StateName(state_), "  ");
    const bool stopped = state_ == v1::JOB_STATE_FAILED || state_ == v1::JOB_STATE_CANCELLED;
    if (stopped) {
      // No bar: a job that did not finish its steps is not partly done.
      if (total_ > 0) absl::StrAppend(&line, "at step ", done_, " of ", total_, "  ");
    } else if (complete_ && total_ <= 0) {
      absl::StrAppend(&line, ProgressBar(1, 1, kBarWidth), "  100%  ");
    } else {
      absl::StrAppend(&line, ProgressBar(done_, total_, kBarWidth), "  ");
      if (total_ > 0) {
        absl::StrAppend(&line, done_, "/", total_, " steps  ",
                        std::min<int64_t>(done_ * 100 / total_, 100), "%  ");
      }
    }
    if (training_.has_value()) {
      absl::StrAppend(&line, absl::StrFormat("loss %.4f  ", training_->loss));
      if (!stopped) absl::StrAppend(&line, FormatCount(training_->tokens_per_second), " tok/s  ");
      if (training_->validation_loss.has_value()) {
        absl::StrAppend(&line, absl::StrFormat("val %.4f  ", *training_->validation_loss));
      }
    }
    const absl::Time until = end_.value_or(absl::Now());
    absl::StrAppend(&line, "elapsed ", HumanDuration(until - start_));
    out_ << line << std::flush;
  }

  absl::Mutex mu_;
  std::ostream& out_ ABSL_GUARDED_BY(mu_);
  const std::string job_id_;
  v1::JobState state_ ABSL_GUARDED_BY(mu_);
  int64_t done_ ABSL_GUARDED_BY(mu_);
  int64_t total_ ABSL_GUARDED_BY(mu_);
  // A training job's figures, once it has some.
  std::optional<TrainingLine> training_ ABSL_GUARDED_BY(mu_);
  bool complete_ ABSL_GUARDED_BY(mu_) = false;  // Ended SUCCEEDED: the bar is full.
  std::optional<absl::Time> end_ ABSL_GUARDED_BY(mu_);
  absl::Time start_;  // Fixed after construction.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread ticker_;
};

}  // namespace

WatchResult WatchJob(v1::JobService::StubInterface* stub, const std::string& job_id,
                     const WatchOptions& options, std::ostream& out, std::ostream& err) {
  WatchResult result;
  v1::Job job;
  result.status = ReadJob(stub, job_id, options.rpc_timeout, &job);
  if (!result.status.ok()) return result;

  std::unique_ptr<ProgressLine> line;
  if (options.display == WatchOptions::Display::kTty) {
    line = std::make_unique<ProgressLine>(out, job, options.redraw_every);
  }
  auto render = [&](const v1::JobEvent& event) {
    switch (options.display) {
      case WatchOptions::Display::kTty:
        line->OnEvent(event);
        break;
      case WatchOptions::Display::kLines:
        out << EventLine(event) << '\n' << std::flush;
        break;
      case WatchOptions::Display::kJson:
        out << ToJson(event, /*pretty=*/false) << '\n' << std::flush;
        break;
      case WatchOptions::Display::kQuiet:
        break;
    }
  };

  int64_t last_seq = 0;
  // The reconnect budget counts from when the stream broke after being healthy (it delivered an
  // event, or stayed open kHealthyStream): a stream may stay quiet for long (a queued job, a long
  // step), and one that fails at once is part of the same outage.
  std::optional<absl::Time> broken_since;
  // The outage being reported: one notice when it starts, one when the coordinator answers again,
  // however many attempts fail in between. After that answer, streams that fail at once stay
  // silent until one proves healthy.
  std::optional<absl::Time> outage_since;
  bool quiet_until_healthy = false;
  absl::Duration backoff = kFirstBackoff;
  bool ended = false;
  bool have_final_job = false;
  v1::JobEvent final_event;
  auto end_outage = [&] {
    if (!outage_since.has_value()) return;
    if (line) line->Interrupt();
    err << "dattn: reconnected to the event stream of " << Printable(job_id) << " after "
        << HumanDuration(absl::Now() - *outage_since) << "; resuming after event #" << last_seq
        << '\n'
        << std::flush;
    outage_since.reset();
    quiet_until_healthy = true;
  };
  while (!ended) {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_seq(last_seq);
    const absl::Time opened = absl::Now();
    bool delivered = false;
    std::unique_ptr<grpc::ClientReaderInterface<v1::JobEvent>> reader =
        stub->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      delivered = true;
      broken_since.reset();
      end_outage();
      quiet_until_healthy = false;
      backoff = kFirstBackoff;
      if (event.seq() <= last_seq) continue;  // Replayed by a server that ignored after_seq.
      last_seq = event.seq();
      render(event);
      if (IsTerminal(event.state())) {
        ended = true;
        final_event = event;
        context.TryCancel();  // Nothing more to read; don't wait for the server to close.
        break;
      }
    }
    grpc::Status status = reader->Finish();
    if (ended) break;
    if (status.ok()) {
      // The stream closed without an end event; the job itself says whether it is over.
      grpc::Status read = ReadJob(stub, job_id, options.rpc_timeout, &job);
      if (read.ok() && IsTerminal(job.state())) {
        ended = true;
        have_final_job = true;
        break;
      }
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the event stream closed before the job ended");
    } else if (!IsTransient(status.error_code())) {
      if (line) line->Finish(nullptr);
      result.status = status;
      return result;
    }
    if (delivered || absl::Now() - opened >= kHealthyStream) {
      broken_since = absl::Now();
      quiet_until_healthy = false;
    } else if (!broken_since.has_value()) {
      broken_since = absl::Now();
    }
    if (!outage_since.has_value() && !quiet_until_healthy) {
      outage_since = absl::Now();
      if (line) line->Interrupt();
      err << "dattn: lost the event stream of " << Printable(job_id) << " after event #" << last_seq
          << " (" << RpcCodeName(status.error_code()) << ": " << Printable(status.error_message())
          << "); reconnecting for up to " << HumanDuration(options.reconnect_for) << '\n'
          << std::flush;
    }
    // Wait, then ask the coordinator for the job: its answer ends the outage (a job that ended
    // meanwhile has its last events replayed by the next stream). Then open a new stream.
    bool answered = false;
    while (!answered) {
      if (absl::Now() - *broken_since >= options.reconnect_for) {
        if (line) line->Finish(nullptr);
        result.status = grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            absl::StrCat("lost the event stream of job ", job_id, " and could not reconnect for ",
                         absl::FormatDuration(options.reconnect_for), " (last error ",
                         RpcCodeName(status.error_code()), ": ", status.error_message(),
                         "); run `dattn watch ", job_id, "` to resume"));
        return result;
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, kMaxBackoff);
      v1::Job probe;
      const grpc::Status read = ReadJob(stub, job_id, options.rpc_timeout, &probe);
      if (read.ok()) {
        answered = true;
        end_outage();
      } else if (!IsTransient(read.error_code())) {
        if (line) line->Finish(nullptr);
        result.status = read;
        return result;
      } else {
        status = read;
      }
    }
  }

  if (!have_final_job) {
    grpc::Status read = ReadJob(stub, job_id, options.rpc_timeout, &job);
    if (!read.ok() || !IsTerminal(job.state())) {
      // The end event is authoritative; the re-read only adds the result.
      job.Clear();
      job.set_job_id(job_id);
      job.set_state(final_event.state());
      job.set_state_reason(final_event.message());
      *job.mutable_end_time() = final_event.time();
    }
  }
  if (line) line->Finish(&job);
  result.status = grpc::Status::OK;
  result.job = std::move(job);
  return result;
}

}  // namespace client
}  // namespace dattn
