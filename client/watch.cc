#include "client/watch.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
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

// The live progress line of kTty mode. Events update it from the watching thread; a ticker thread
// redraws it so that the elapsed time moves while no event arrives.
class ProgressLine {
 public:
  ProgressLine(std::ostream& out, const v1::Job& job, absl::Duration redraw_every)
      : out_(out),
        job_id_(job.job_id()),
        state_(job.state()),
        done_(job.progress().steps_done()),
        total_(job.progress().steps_total()) {
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

  ~ProgressLine() { Finish(); }

  void OnEvent(const v1::JobEvent& event) {
    absl::MutexLock lock(&mu_);
    state_ = event.state();
    if (event.has_progress() && event.progress().steps_total() > 0) {
      done_ = event.progress().steps_done();
      total_ = event.progress().steps_total();
    }
    if (event.kind() != "progress") out_ << "\r\x1b[2K" << EventLine(event) << '\n';
    RedrawLocked();
  }

  // Stops the ticker and leaves the last line in place. Idempotent.
  void Finish() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (ticker_.joinable()) ticker_.join();
    absl::MutexLock lock(&mu_);
    if (!finished_) {
      RedrawLocked();
      out_ << '\n' << std::flush;
      finished_ = true;
    }
  }

 private:
  void RedrawLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string line = absl::StrCat("\r\x1b[2K", Printable(job_id_), "  ", StateName(state_), "  ",
                                    ProgressBar(done_, total_, kBarWidth));
    if (total_ > 0) {
      absl::StrAppend(&line, "  ", done_, "/", total_, " steps  ",
                      std::min<int64_t>(done_ * 100 / total_, 100), "%");
    }
    absl::StrAppend(&line, "  elapsed ", HumanDuration(absl::Now() - start_));
    out_ << line << std::flush;
  }

  absl::Mutex mu_;
  std::ostream& out_ ABSL_GUARDED_BY(mu_);
  const std::string job_id_;
  v1::JobState state_ ABSL_GUARDED_BY(mu_);
  int64_t done_ ABSL_GUARDED_BY(mu_);
  int64_t total_ ABSL_GUARDED_BY(mu_);
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
  // When the stream last broke after being healthy: a stream may stay quiet for long (a queued job,
  // a long step), so the reconnect budget counts from the break, not from the last event.
  std::optional<absl::Time> broken_since;
  absl::Duration backoff = kFirstBackoff;
  bool ended = false;
  bool have_final_job = false;
  v1::JobEvent final_event;
  while (!ended) {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_seq(last_seq);
    std::unique_ptr<grpc::ClientReaderInterface<v1::JobEvent>> reader =
        stub->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      broken_since.reset();
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
      if (line) line->Finish();
      result.status = status;
      return result;
    }
    if (!broken_since.has_value()) broken_since = absl::Now();
    if (absl::Now() - *broken_since >= options.reconnect_for) {
      if (line) line->Finish();
      result.status = grpc::Status(
          grpc::StatusCode::UNAVAILABLE,
          absl::StrCat("lost the event stream of job ", job_id, " and could not reconnect for ",
                       absl::FormatDuration(options.reconnect_for), " (last error ",
                       RpcCodeName(status.error_code()), ": ", status.error_message(),
                       "); run `dattn watch ", job_id, "` to resume"));
      return result;
    }
    err << "dattn: the event stream of " << Printable(job_id) << " broke ("
        << RpcCodeName(status.error_code()) << ": " << Printable(status.error_message())
        << "); reconnecting after event #" << last_seq << '\n'
        << std::flush;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  if (line) line->Finish();

  if (!have_final_job) {
    grpc::Status read = ReadJob(stub, job_id, options.rpc_timeout, &job);
    if (!read.ok() || !IsTerminal(job.state())) {
      // The end event is authoritative; the re-read only adds the result.
      job.Clear();
      job.set_job_id(job_id);
      job.set_state(final_event.state());
      job.set_state_reason(final_event.message());
    }
  }
  result.status = grpc::Status::OK;
  result.job = std::move(job);
  return result;
}

}  // namespace client
}  // namespace dattn
