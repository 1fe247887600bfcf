#include "worker/worker.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "api/limits.h"
#include "engine/comm/abort_all.h"
#include "engine/memory_plan.h"
#include "worker/attention_task.h"
#include "worker/cpu_device.h"
#include "worker/deployment_task.h"
#include "worker/host_info.h"
#include "worker/log.h"
#include "worker/ring_join.h"
#include "worker/training_task.h"

namespace dattn {
namespace worker {

const char kWorkerVersion[] = "dattn-worker/0.1.0";

namespace {

// Task ids remembered after they finish, so a re-sent assignment is not run twice.
constexpr size_t kFinishedMemory = 4096;
// Non-retryable rejections of a final report before it is dropped (one heartbeat apart, so that a
// re-registration racing with the report gets a chance to complete first).
constexpr int kMaxRejections = 3;

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// A unary call waits for the channel to connect (up to its deadline) instead of failing at once
// while the channel is in reconnect backoff. Besides riding out short coordinator restarts, this
// makes the calling thread drive the reconnection: with fail-fast calls nothing in an otherwise
// idle process would, except gRPC's 5 s backup poller.
void PrepareUnary(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  context->set_wait_for_ready(true);
}

// Codes under which the same report may succeed later without anything changing on this side.
bool IsRetryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::CANCELLED:
      return true;
    default:
      return false;
  }
}

const char* StateName(v1::TaskState state) {
  switch (state) {
    case v1::TASK_STATE_STARTED:
      return "STARTED";
    case v1::TASK_STATE_PROGRESS:
      return "PROGRESS";
    case v1::TASK_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::TASK_STATE_FAILED:
      return "FAILED";
    case v1::TASK_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

std::string Describe(const v1::TaskAssignment& task) {
  if (task.spec().has_training()) {
    const v1::TrainingRankPlan& p = task.training_plan();
    return absl::StrCat(
        "training rank ", p.rank(), " of ", p.data_parallel(), " x ", p.sequence_parallel(), ", ",
        p.memory_plan().empty() ? "" : "memory ", p.memory_plan(),
        p.checkpoint_dir().empty() ? ", no checkpoints"
                                   : absl::StrCat(", checkpoints in ", p.checkpoint_dir()));
  }
  if (!task.spec().has_attention()) return "no attention work";
  const v1::AttentionJobSpec& job = task.spec().attention();
  const v1::TensorShape& s = job.shape();
  return absl::StrCat(v1::DType_Name(job.dtype()), " B=", s.batch(), " N=", s.seq_len(),
                      " H=", s.num_heads(), " D=", s.head_dim(), " w=[",
                      absl::StrJoin(job.attention().segment_lengths(), ","), "] r=[",
                      absl::StrJoin(job.attention().dilation_rates(), ","), "] ",
                      v1::Pass_Name(job.pass()), " x", std::max(1, job.iterations()));
}

WorkerOptions WithDefaults(WorkerOptions options) {
  if (!options.credentials) options.credentials = grpc::InsecureChannelCredentials();
  return options;
}

}  // namespace

struct Worker::Task {
  v1::TaskAssignment assignment;
  int64_t steps_total = 1;
  int64_t reserved_bytes = 0;  // Planned bytes counted in reserved_bytes_.
  int64_t budget_bytes = -1;   // Passed to RunAttentionTask; -1: what the device has free.
  // claimed_bytes and done are guarded by Worker::mu_, which ABSL_GUARDED_BY cannot say here: on a
  // member of Task, clang's analysis takes Worker::mu_ for a mutex of the task itself and matches
  // it against no lock the worker holds. Every use is in a Worker method holding mu_.
  // Without a memory budget: from admission until the task finishes, its plan less the tensors
  // allocated so far (worker.h, Memory); 0 otherwise.
  int64_t claimed_bytes = 0;
  std::atomic<bool> cancel{false};
  std::atomic<bool> silent{false};  // Report nothing more (the coordinator has given up on it).
  // Cancelled because this worker is stopping, not by the coordinator: its CANCELLED report hands
  // the rank back (TaskReport.handed_back).
  std::atomic<bool> handed_back{false};
  std::atomic<int64_t> steps_done{0};
  std::atomic<int> phase{v1::RANK_PHASE_PREPARING};
  std::atomic<double> ring_formation_seconds{0};
  // An attention task's ring communicator while it has one; a cancel aborts it so that a step
  // waiting for peers ends at once. Set and cleared by the task thread. Never locked together with
  // mu_.
  absl::Mutex comm_mu;
  comm::Communicator* comm ABSL_GUARDED_BY(comm_mu) = nullptr;
  // A training task's communicators (the world's and its sequence group's): aborted only by a
  // cancel that says so (CancelTask.abort: its attempt failed, its peers are gone); any other
  // cancel lets the ranks stop together at a step boundary and save a checkpoint
  // (worker/training_task.h, which aborts them itself when that takes longer than its grace).
  std::vector<comm::Communicator*> training_comms ABSL_GUARDED_BY(comm_mu);
  // A streamed attention task's ReadInput or UploadOutput call while one is open: a cancel ends
  // it (TryCancel), so that a rank waiting for its caller's next chunk stops at once.
  grpc::ClientContext* stream_call ABSL_GUARDED_BY(comm_mu) = nullptr;
  std::atomic<bool> abort{false};
  // A training task's figures as last reported (task thread only): every report of rank 0 carries
  // them.
  v1::TrainingProgress training;
  bool reports_training = false;
  // A deployment's status as last reported (task thread only): its reports carry it.
  v1::DeploymentStatus deployment;
  std::thread thread;
  bool done = false;  // Guarded by Worker::mu_ (see above): the thread has finished; join it.
};

// Registers a unary call's context for the duration of the call, so that Stop() can cancel it.
class Worker::ActiveCall {
 public:
  ActiveCall(Worker* worker, grpc::ClientContext* context) : worker_(worker), context_(context) {
    absl::MutexLock lock(&worker_->mu_);
    worker_->unary_contexts_.insert(context_);
    if (worker_->cancel_unary_) context_->TryCancel();
  }
  ~ActiveCall() {
    absl::MutexLock lock(&worker_->mu_);
    worker_->unary_contexts_.erase(context_);
  }

 private:
  Worker* const worker_;
  grpc::ClientContext* const context_;
};

// A streamed task's open ReadInput or UploadOutput call, registered for cancels
// (Task::stream_call) while it lives: a cancel of the task ends the call (AbortComms); one that
// came before the call opened, at once.
class Worker::StreamCall {
 public:
  StreamCall(Task& task, grpc::ClientContext* context) : task_(task) {
    absl::MutexLock lock(&task_.comm_mu);
    task_.stream_call = context;
    if (task_.cancel.load()) context->TryCancel();
  }
  ~StreamCall() {
    absl::MutexLock lock(&task_.comm_mu);
    task_.stream_call = nullptr;
  }
  StreamCall(const StreamCall&) = delete;
  StreamCall& operator=(const StreamCall&) = delete;

 private:
  Task& task_;
};

// A deployment task's Serve stream (deployment_task.h's ServeChannel): registered as an active
// call (Stop cancels it) and as the task's stream call (a cancel of the task ends it at once).
class Worker::ServeStream final : public ServeChannel {
 public:
  ServeStream(Worker* worker, Task& task)
      : context_(std::make_unique<grpc::ClientContext>()),
        active_(worker, context_.get()),
        registered_(task, context_.get()),
        stream_(worker->stub_->Serve(context_.get())) {}
  ~ServeStream() override {
    (void)Close();
    (void)stream_->Finish();  // The reader has seen the end (deployment_task.h joins it first).
  }
  bool Read(v1::ServeWork* work) override { return stream_->Read(work); }
  bool Write(const v1::ServeUpdate& update) override { return stream_->Write(update); }
  absl::Status Close() override {
    if (!closed_.exchange(true)) {
      stream_->WritesDone();
      context_->TryCancel();
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  ActiveCall active_;
  StreamCall registered_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ServeUpdate, v1::ServeWork>> stream_;
  std::atomic<bool> closed_{false};
};

Worker::Worker(WorkerOptions options)
    : options_(WithDefaults(std::move(options))),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {}

Worker::~Worker() { Stop(); }

absl::Status Worker::Start() {
  const WorkerOptions& o = options_;
  if (o.coordinator_address.empty()) {
    return absl::InvalidArgumentError("worker: coordinator address is empty");
  }
  if (o.name.empty()) return absl::InvalidArgumentError("worker: name is empty");
  if (o.max_ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("worker: max_ranks ", o.max_ranks, " < 1"));
  }
  if (o.threads_per_task < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker: threads_per_task ", o.threads_per_task, " < 0"));
  }
  if (o.memory_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker: memory_bytes ", o.memory_bytes, " < 0"));
  }
  if (o.heartbeat_interval < absl::ZeroDuration() || o.rpc_timeout <= absl::ZeroDuration() ||
      o.backoff_initial <= absl::ZeroDuration() || o.backoff_max < o.backoff_initial ||
      o.progress_interval < absl::ZeroDuration() ||
      o.shutdown_report_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker: bad durations: heartbeat ", absl::FormatDuration(o.heartbeat_interval),
        ", rpc timeout ", absl::FormatDuration(o.rpc_timeout), ", backoff ",
        absl::FormatDuration(o.backoff_initial), "..", absl::FormatDuration(o.backoff_max),
        ", progress ", absl::FormatDuration(o.progress_interval), ", shutdown ",
        absl::FormatDuration(o.shutdown_report_deadline)));
  }
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("worker: Start() called twice");
  }

  device_ = o.device;
  if (device_ == nullptr) {
    CpuDeviceOptions cpu;
    cpu.ring_address = o.ring_address;
    absl::StatusOr<std::unique_ptr<TaskDevice>> host = NewCpuDevice(cpu);
    if (!host.ok()) return host.status();
    device_ = std::move(*host);
  }
  const BackendCaps& caps = device_->caps();
  const bool gpu = caps.device == Device::kCuda;
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  threads_per_task_ =
      o.threads_per_task > 0 ? o.threads_per_task : std::max(1, hardware / o.max_ranks);

  const int64_t total_memory = o.memory_bytes > 0 ? o.memory_bytes : device_->total_memory_bytes();
  capabilities_.set_is_gpu(gpu);
  capabilities_.set_device_name(device_->device_name());
  capabilities_.set_device_index(device_->device_index());
  capabilities_.set_total_memory_bytes(total_memory);
  for (DType dtype : caps.dtypes) capabilities_.add_dtypes(ToApiDType(dtype));
  capabilities_.set_max_ranks(o.max_ranks);
  capabilities_.set_num_threads(gpu ? 0 : threads_per_task_);
  for (int64_t d : caps.head_dims) capabilities_.add_head_dims(d);
  for (const std::string& backend : device_->ring_backends())
    capabilities_.add_ring_backends(backend);

  grpc::ChannelArguments args;
  // A vanished coordinator host (no RST) ends the held-open stream within ~80 s; heartbeats carry
  // data far more often than 60 s, so servers' default ping policy is never tripped.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  // gRPC's own reconnect backoff would otherwise grow to 120 s and hide a restarted coordinator.
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at its default: it is also the connect (handshake)
  // timeout, and a short one makes a slow or TLS coordinator unreachable.
  const int initial_ms = static_cast<int>(absl::ToInt64Milliseconds(o.backoff_initial));
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(o.backoff_max));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(1, initial_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(1, max_ms));
  // A streamed rank's input chunks (ReadInput) carry up to 4 MiB of data each, plus framing.
  args.SetMaxReceiveMessageSize(api::kMaxMessageBytes);
  channel_ = grpc::CreateCustomChannel(o.coordinator_address, o.credentials, args);
  stub_ = v1::WorkerRegistry::NewStub(channel_);

  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("worker: Start() called twice");
    started_ = true;
    jitter_state_ = std::hash<std::string>()(o.name) ^
                    static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^ 0x9E3779B97F4A7C15ull;
    if (o.heartbeat_interval > absl::ZeroDuration()) heartbeat_interval_ = o.heartbeat_interval;
  }
  LogEvent("starting worker ", o.name, ": coordinator ", o.coordinator_address, ", ",
           gpu ? absl::StrCat("GPU ", device_->device_index(), " ") : std::string("CPU "),
           capabilities_.device_name(), ", ", FormatBytes(total_memory), ", ", o.max_ranks,
           " slot(s) x ",
           gpu ? std::string("1 GPU") : absl::StrCat(threads_per_task_, " thread(s)"), ", rings: ",
           capabilities_.ring_backends().empty()
               ? std::string("none")
               : absl::StrJoin(capabilities_.ring_backends(), ","));
  session_thread_ = std::thread(&Worker::SessionLoop, this);
  stream_thread_ = std::thread(&Worker::StreamLoop, this);
  reporter_thread_ = std::thread(&Worker::ReporterLoop, this);
  return absl::OkStatus();
}

void Worker::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  std::vector<std::shared_ptr<Task>> to_abort;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopped_) return;
    stopping_ = true;
    UpdateReadyLocked();
    if (stream_context_ != nullptr) stream_context_->TryCancel();
    for (auto& entry : tasks_) {
      if (!entry.second->done && !entry.second->cancel.load()) entry.second->handed_back = true;
    }
    CancelAllLocked(/*silent=*/false, "worker shutting down", &to_abort);
    cv_.SignalAll();
  }
  AbortComms(to_abort, "worker shutting down");
  NotifyReady();
  LogEvent("stopping: no new work, running tasks cancelled");
  stream_thread_.join();

  std::vector<std::thread> tasks;
  {
    absl::MutexLock lock(&mu_);
    for (auto& entry : tasks_) tasks.push_back(std::move(entry.second->thread));
    tasks_.clear();
  }
  for (std::thread& t : tasks) t.join();

  size_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = clock_->Now() + options_.shutdown_report_deadline;
    while ((!reports_.empty() || report_in_flight_) && !clock_->WaitUntil(&cv_, &mu_, deadline)) {
    }
    for (const PendingReport& p : reports_) dropped += p.final ? 1 : 0;
    stop_reporter_ = true;
    stop_session_ = true;
    // A registration, heartbeat or report waiting for an unreachable coordinator ends now.
    cancel_unary_ = true;
    for (grpc::ClientContext* context : unary_contexts_) context->TryCancel();
    cv_.SignalAll();
  }
  if (dropped > 0) {
    LogEvent("shutdown: ", dropped, " final report(s) could not be delivered within ",
             absl::FormatDuration(options_.shutdown_report_deadline), " and are dropped");
  }
  reporter_thread_.join();
  session_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  LogEvent("stopped");
}

std::string Worker::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

bool Worker::registered() const {
  absl::MutexLock lock(&mu_);
  return !worker_id_.empty();
}

bool Worker::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

int64_t Worker::registrations() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

int Worker::running_tasks() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& entry : tasks_) n += entry.second->done ? 0 : 1;
  return n;
}

// ---------------------------------------------------------------------------------------------------
// Session: registration and heartbeats.

void Worker::SessionLoop() {
  int attempt = 0;
  std::string last_error;
  mu_.Lock();
  while (!stop_session_) {
    if (worker_id_.empty() || reregister_) {
      if (reregister_) {
        const char* why = "coordinator asked this worker to re-register";
        std::vector<std::shared_ptr<Task>> to_abort;
        CancelAllLocked(/*silent=*/true, why, &to_abort);
        worker_id_.clear();
        reregister_ = false;
        draining_ = false;
        UpdateReadyLocked();
        if (stream_context_ != nullptr) stream_context_->TryCancel();
        cv_.SignalAll();
        mu_.Unlock();
        AbortComms(to_abort, why);
        mu_.Lock();
        // A cancelled task stops only after its current engine step. Registering before it has
        // would advertise a slot that is still busy, and the coordinator's next assignment would
        // bounce off it; so the new registration waits until every slot is really free.
        auto busy = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          for (const auto& entry : tasks_) {
            if (!entry.second->done) return true;
          }
          return false;
        };
        if (busy()) LogEvent("waiting for cancelled tasks to stop before registering again");
        while (!stop_session_ && busy()) {
          SleepLocked(absl::Milliseconds(20),
                      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_session_; });
        }
      }
      mu_.Unlock();
      NotifyReady();
      absl::Status status = Register();
      NotifyReady();
      mu_.Lock();
      if (!status.ok()) {
        const std::string error = status.ToString();
        if (attempt == 0 || error != last_error) {
          LogEvent("registration with ", options_.coordinator_address, " failed: ", error,
                   "; retrying with backoff");
          last_error = error;
        }
        const absl::Duration wait = Backoff(attempt++);
        SleepLocked(wait, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_session_; });
        continue;
      }
      attempt = 0;
      last_error.clear();
    }
    const int64_t generation = generation_;
    SleepLocked(heartbeat_interval_, [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_session_ || reregister_ || generation_ != generation || heartbeat_now_;
    });
    heartbeat_now_ = false;
    if (stop_session_) break;
    if (reregister_ || worker_id_.empty()) continue;
    std::vector<std::thread> finished;
    ReapLocked(&finished);
    mu_.Unlock();
    for (std::thread& t : finished) t.join();
    Heartbeat();
    NotifyReady();
    mu_.Lock();
  }
  mu_.Unlock();
}

absl::Status Worker::Register() {
  v1::RegisterWorkerRequest request;
  request.set_name(options_.name);
  request.set_address(options_.address);
  *request.mutable_capabilities() = capabilities_;
  request.set_version(kWorkerVersion);
  v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  PrepareUnary(&context, options_.rpc_timeout);
  ActiveCall active(this, &context);
  grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  if (response.worker_id().empty()) {
    return absl::InternalError("coordinator answered RegisterWorker with an empty worker_id");
  }
  absl::Duration interval = absl::Milliseconds(response.heartbeat_interval_ms());
  if (response.heartbeat_interval_ms() <= 0) {
    interval = options_.heartbeat_interval > absl::ZeroDuration() ? options_.heartbeat_interval
                                                                  : absl::Seconds(2);
  } else if (options_.heartbeat_interval > absl::ZeroDuration()) {
    interval = std::min(interval, options_.heartbeat_interval);
  }
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = response.worker_id();
    generation = ++generation_;
    heartbeat_interval_ = interval;
    draining_ = false;
    UpdateReadyLocked();
    // A stream still open belongs to the previous registration.
    if (stream_context_ != nullptr) stream_context_->TryCancel();
    cv_.SignalAll();
  }
  LogEvent("registered with ", options_.coordinator_address, " as worker ", response.worker_id(),
           " (registration ", generation, ", heartbeat every ", absl::FormatDuration(interval),
           ")");
  return absl::OkStatus();
}

void Worker::Heartbeat() {
  v1::HeartbeatRequest request;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    request.set_worker_id(worker_id_);
    request.set_draining(leaving_);
    generation = generation_;
    std::map<std::string, int64_t> listed = unreported_;
    for (const auto& entry : tasks_) {
      // A task whose outcome is known is listed through unreported_ until the coordinator has it.
      if (!entry.second->silent && finished_.count(entry.first) == 0) {
        listed[entry.first] = entry.second->steps_done.load();
      }
    }
    for (const auto& entry : listed) {
      v1::RunningTask* task = request.add_tasks();
      task->set_task_id(entry.first);
      task->set_steps_done(entry.second);
      auto running = tasks_.find(entry.first);
      task->set_phase(running != tasks_.end() && !running->second->done
                          ? static_cast<v1::RankPhase>(running->second->phase.load())
                          : v1::RANK_PHASE_FINISHED);
    }
  }
  request.set_free_memory_bytes(FreeMemoryBytes());
  // A failed device is reported in every heartbeat (the coordinator then places nothing here) and
  // makes the worker not ready; a GPU's sticky error lasts until the process restarts.
  const absl::Status health = device_->Health();
  if (!health.ok()) request.set_device_error(health.ToString());
  {
    absl::MutexLock lock(&mu_);
    if (request.device_error() != device_error_) {
      if (request.device_error().empty()) {
        LogEvent("device works again (it had failed: ", device_error_, ")");
      } else {
        LogEvent("device failed: ", request.device_error(),
                 "; no new tasks until it works again (a GPU's sticky error needs a restart of the "
                 "worker)");
      }
      device_error_ = request.device_error();
      UpdateReadyLocked();
    }
  }
  NotifyReady();
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  PrepareUnary(&context, options_.rpc_timeout);
  ActiveCall active(this, &context);
  grpc::Status status = stub_->Heartbeat(&context, request, &response);

  absl::MutexLock lock(&mu_);
  // Answer about a registration that no longer exists, or that is being replaced right now (the
  // session loop clears worker_id_ before it registers again, and bumps generation_ only after).
  if (generation != generation_ || request.worker_id() != worker_id_) return;
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      LogEvent("heartbeat: coordinator does not know worker ", request.worker_id(), " (",
               status.error_message(), "); registering again");
      reregister_ = true;
      cv_.SignalAll();
      return;
    }
    const std::string error = FromGrpc(status).ToString();
    if (error != heartbeat_error_) {
      LogEvent("heartbeat failed: ", error);
      heartbeat_error_ = error;
    }
    return;
  }
  if (!heartbeat_error_.empty()) {
    LogEvent("heartbeat delivered again");
    heartbeat_error_.clear();
  }
  if (response.reregister()) {
    LogEvent("heartbeat: coordinator asks worker ", request.worker_id(),
             " to register again; cancelling its tasks");
    reregister_ = true;
  }
  if (response.drain() != draining_) {
    draining_ = response.drain();
    LogEvent(draining_ ? "draining: the coordinator places no new work here; running tasks finish"
                       : "drain lifted: the coordinator places work here again");
    // A drained, idle worker's assignment stream is closed by the coordinator and reopened with
    // backoff (up to backoff_max): reopen it now rather than after the backoff.
    if (!draining_) reopen_stream_now_ = true;
  }
  UpdateReadyLocked();
  cv_.SignalAll();
}

// ---------------------------------------------------------------------------------------------------
// The assignment stream.

void Worker::StreamLoop() {
  int attempt = 0;
  std::string last_error;
  mu_.Lock();
  while (true) {
    while (!stopping_ && !stop_session_ && worker_id_.empty()) cv_.Wait(&mu_);
    if (stopping_ || stop_session_) break;
    const std::string worker_id = worker_id_;
    const int64_t generation = generation_;
    grpc::ClientContext context;
    // Waits for the coordinator rather than failing at once while it is down; Stop() and a new
    // registration end the wait through TryCancel.
    context.set_wait_for_ready(true);
    stream_context_ = &context;
    reopen_stream_now_ = false;  // This is the reopening.
    mu_.Unlock();

    v1::StreamAssignmentsRequest request;
    request.set_worker_id(worker_id);
    std::unique_ptr<grpc::ClientReader<v1::WorkerCommand>> reader =
        stub_->StreamAssignments(&context, request);
    v1::WorkerCommand command;
    while (reader->Read(&command)) {
      if (attempt > 0 || !last_error.empty()) {
        LogEvent("assignment stream for worker ", worker_id, " is up again");
        last_error.clear();
      }
      attempt = 0;
      switch (command.command_case()) {
        case v1::WorkerCommand::kAssign:
          HandleAssign(command.assign());
          break;
        case v1::WorkerCommand::kCancel:
          HandleCancel(command.cancel());
          break;
        default:
          LogEvent("ignoring an empty or unknown WorkerCommand");
          break;
      }
    }
    grpc::Status status = reader->Finish();

    mu_.Lock();
    stream_context_ = nullptr;
    if (stopping_ || stop_session_) break;
    if (generation != generation_) continue;  // Re-registered: open the new registration's stream.
    // A registration is under way (worker_id_ cleared, generation_ not yet bumped): this stream's
    // NOT_FOUND is about the old registration and must not ask for yet another one.
    if (worker_id_ != worker_id) continue;
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      LogEvent("assignment stream: coordinator does not know worker ", worker_id, " (",
               status.error_message(), "); registering again");
      reregister_ = true;
      cv_.SignalAll();
    } else {
      const std::string error =
          status.ok() ? "closed by the coordinator" : FromGrpc(status).ToString();
      if (error != last_error) {
        LogEvent("assignment stream for worker ", worker_id, " ended: ", error, "; reopening");
        last_error = error;
      }
    }
    const absl::Duration wait = Backoff(attempt++);
    SleepLocked(wait, [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || stop_session_ || generation_ != generation || reopen_stream_now_;
    });
    if (reopen_stream_now_) {
      reopen_stream_now_ = false;
      attempt = 0;
    }
  }
  mu_.Unlock();
}

void Worker::HandleAssign(const v1::TaskAssignment& assign) {
  const std::string& id = assign.task_id();
  std::vector<std::thread> finished;
  absl::Status refusal;
  {
    absl::MutexLock lock(&mu_);
    ReapLocked(&finished);
    int running = 0;
    for (const auto& entry : tasks_) running += entry.second->done ? 0 : 1;
    if (id.empty()) {
      LogEvent("ignoring an assignment without a task_id");
    } else if (tasks_.count(id) > 0 || finished_.count(id) > 0 || unreported_.count(id) > 0) {
      LogEvent("task ", id, " assigned again; it already ran or runs here, ignoring the copy");
    } else if (stopping_) {
      refusal = absl::UnavailableError(absl::StrCat("worker ", options_.name, " is shutting down"));
    } else if (!device_error_.empty()) {
      // Sent before the coordinator heard of the failure: placed elsewhere, no attempt spent.
      refusal = absl::UnavailableError(
          absl::StrCat("worker ", options_.name, "'s device failed: ", device_error_));
    } else if (running >= options_.max_ranks) {
      // UNAVAILABLE, not RESOURCE_EXHAUSTED: the coordinator reads the latter as "out of memory"
      // and fails the job, while a busy slot only means "place this elsewhere or later".
      refusal = absl::UnavailableError(
          absl::StrCat("worker ", options_.name, " has all ", options_.max_ranks, " slot(s) busy"));
    } else {
      auto task = std::make_shared<Task>();
      task->assignment = assign;
      if (assign.spec().has_deployment()) {
        task->steps_total = 1;
        task->reserved_bytes = assign.deployment_plan().memory_bytes();
      } else if (assign.spec().has_training()) {
        // A task whose plan is unusable fails in RunTrainingTask with the same error.
        absl::StatusOr<TrainingTaskPlan> plan = PlanTrainingTask(assign, device_->caps());
        task->steps_total = plan.ok() ? std::max<int64_t>(1, plan->config.steps) : 1;
        task->reserved_bytes = plan.ok() ? plan->memory_bytes : 0;
        task->reports_training = plan.ok() && plan->rank == 0;
      } else {
        task->steps_total = std::max(1, assign.spec().attention().iterations());
        absl::StatusOr<AttentionTaskPlan> plan = PlanAttentionTask(assign, device_->caps());
        // A task whose plan is unusable fails in RunAttentionTask with the same error.
        task->reserved_bytes = plan.ok() ? plan->memory_bytes : 0;
      }
      if (options_.memory_bytes > 0) {
        task->budget_bytes = std::max<int64_t>(0, options_.memory_bytes - reserved_bytes_);
      }
      reserved_bytes_ += task->reserved_bytes;
      tasks_[id] = task;
      silenced_.erase(id);
      LogEvent("task ", id, " assigned (job ", assign.job_id(), " attempt ", assign.attempt(),
               " rank ", assign.rank(), "): ", Describe(assign));
      task->thread = std::thread(&Worker::RunTask, this, task);
    }
  }
  for (std::thread& t : finished) t.join();
  if (!refusal.ok()) RefuseTask(assign, refusal);
}

void Worker::HandleCancel(const v1::CancelTask& cancel) {
  const std::string why = cancel.reason().empty() ? "no reason given" : cancel.reason();
  std::shared_ptr<Task> task;
  {
    absl::MutexLock lock(&mu_);
    auto it = tasks_.find(cancel.task_id());
    if (it == tasks_.end() || it->second->done) {
      LogEvent("cancel for task ", cancel.task_id(), " which is not running here; ignored");
      return;
    }
    task = it->second;
    if (cancel.abort()) task->abort = true;
    task->cancel = true;
  }
  LogEvent("task ", cancel.task_id(),
           cancel.abort() ? " cancelled at once: " : " cancel requested: ", why);
  AbortComms({task}, why);
}

void Worker::AbortComms(const std::vector<std::shared_ptr<Task>>& tasks, const std::string& why) {
  for (const std::shared_ptr<Task>& task : tasks) {
    // The task thread clears `comm` under comm_mu before destroying it, so it lives until here.
    absl::MutexLock lock(&task->comm_mu);
    if (task->comm != nullptr) task->comm->Abort(absl::StrCat("the task was cancelled: ", why));
    if (task->stream_call != nullptr && task->cancel.load()) task->stream_call->TryCancel();
    if (task->abort.load()) {
      // Together, not one after another (engine/comm/abort_all.h).
      comm::AbortAll(task->training_comms, absl::StrCat("the task was cancelled at once: ", why));
    }
  }
}

absl::StatusOr<int64_t> Worker::ReserveMemory(Task* task, int64_t planned_bytes) {
  // The device is read under mu_: a figure read before another task's admission or allocations
  // were accounted would let both count the same bytes.
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> free_bytes = device_->FreeMemoryBytes();
  if (!free_bytes.ok()) return free_bytes.status();
  int64_t claimed = 0;
  for (const auto& entry : tasks_) {
    if (entry.second.get() != task) claimed += entry.second->claimed_bytes;
  }
  const int64_t available = std::max<int64_t>(0, *free_bytes - claimed);
  if (planned_bytes <= available) task->claimed_bytes = planned_bytes;
  return available;
}

void Worker::RefuseTask(const v1::TaskAssignment& assign, absl::Status why) {
  const std::string& task_id = assign.task_id();
  LogEvent("task ", task_id, " refused: ", why.ToString());
  v1::TaskReport report;
  report.set_task_id(task_id);
  report.set_state(v1::TASK_STATE_FAILED);
  report.set_error(std::string(why.message()));
  report.set_error_code(static_cast<int>(why.code()));
  report.set_refused(true);
  if (options_.on_task_end) options_.on_task_end(assign, report, v1::RANK_PHASE_UNSPECIFIED);
  Enqueue(std::move(report), /*final=*/true);
}

void Worker::CancelAllLocked(bool silent, const char* why,
                             std::vector<std::shared_ptr<Task>>* to_abort) {
  for (auto& entry : tasks_) {
    Task& task = *entry.second;
    if (task.done) continue;
    task.cancel = true;
    to_abort->push_back(entry.second);
    LogEvent("task ", entry.first, " cancelled: ", why);
    if (silent) {
      task.silent = true;
      silenced_.insert(entry.first);
    }
  }
  if (silent) {
    // Tasks already finished keep their final reports: the coordinator may still want them.
    for (auto it = reports_.begin(); it != reports_.end();) {
      it = silenced_.count(it->report.task_id()) > 0 ? reports_.erase(it) : std::next(it);
    }
    for (const std::string& id : silenced_) unreported_.erase(id);
  }
}

void Worker::ReapLocked(std::vector<std::thread>* to_join) {
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    if (it->second->done) {
      to_join->push_back(std::move(it->second->thread));
      it = tasks_.erase(it);
    } else {
      ++it;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Task threads.

void Worker::RunTask(std::shared_ptr<Task> task) {
  const std::string id = task->assignment.task_id();
  const int64_t total = task->steps_total;
  auto make_report = [&](v1::TaskState state) {
    v1::TaskReport report;
    report.set_task_id(id);
    report.set_state(state);
    report.mutable_progress()->set_steps_done(task->steps_done.load());
    report.mutable_progress()->set_steps_total(total);
    // Before the task reported any figures (it is still preparing) there is nothing to say.
    if (task->reports_training && task->training.steps_total() > 0) {
      *report.mutable_progress()->mutable_training() = task->training;
    }
    if (task->assignment.spec().has_deployment()) {
      *report.mutable_progress()->mutable_deployment() = task->deployment;
    }
    report.set_ring_formation_seconds(task->ring_formation_seconds.load());
    return report;
  };

  absl::Time last_progress = absl::InfinitePast();
  auto progressed = [&](int64_t done, bool force) {
    task->steps_done = done;
    const absl::Time now = clock_->Now();
    if ((force || (done < total && now - last_progress >= options_.progress_interval)) &&
        !task->silent) {
      last_progress = now;
      Enqueue(make_report(v1::TASK_STATE_PROGRESS), /*final=*/false);
    }
  };
  auto reserve = [this, &task](int64_t planned_bytes) {
    return ReserveMemory(task.get(), planned_bytes);
  };
  auto on_phase = [&](v1::RankPhase phase) { task->phase = phase; };
  auto on_started = [&]() {
    if (!task->silent) Enqueue(make_report(v1::TASK_STATE_STARTED), /*final=*/false);
  };
  auto is_cancelled = [&]() { return task->cancel.load(); };
  auto on_oom_retry = [&](const OomRetry& retry) {
    LogEvent("task ", task->assignment.task_id(), ": out of memory (", retry.first_error,
             "); released the device's caches (", FormatBytes(retry.released_bytes),
             " given back) and retried: ", retry.recovered ? "it fit" : "out of memory again");
    if (options_.on_out_of_memory_retry) options_.on_out_of_memory_retry(retry.recovered);
  };
  const std::string member_name = absl::StrCat(options_.name, " (", worker_id(), ")");

  // The outcome, whatever the kind: SUCCEEDED with its result, or the error.
  absl::Status failure = absl::OkStatus();
  v1::TaskReport success;
  bool has_output = false;
  v1::Tensor output;
  if (task->assignment.spec().has_deployment()) {
    DeploymentTaskOptions run_options;
    run_options.num_threads = threads_per_task_;
    run_options.is_cancelled = is_cancelled;
    // The model on this worker's device: fp32 on the CPU, bf16 on a GPU.
    run_options.new_serving_model = [this](const model::LongNetConfig& config,
                                           absl::Span<const float> params, int64_t max_context,
                                           int64_t max_batch, comm::Communicator* ring) {
      return device_->NewServingModel(config, params, max_context, max_batch, threads_per_task_,
                                      ring);
    };
    run_options.open_channel =
        [this, &task, &on_started](
            const v1::DeploymentStatus& ready) -> absl::StatusOr<std::unique_ptr<ServeChannel>> {
      task->phase = v1::RANK_PHASE_RUNNING;
      task->deployment = ready;
      on_started();
      auto stream = std::make_unique<ServeStream>(this, *task);
      v1::ServeUpdate hello;
      hello.set_worker_id(worker_id());
      hello.set_task_id(task->assignment.task_id());
      *hello.mutable_status() = ready;
      if (!stream->Write(hello)) {
        return absl::UnavailableError("the coordinator refused the Serve stream");
      }
      LogEvent("task ", task->assignment.task_id(), " serves ",
               task->assignment.deployment_plan().checkpoint(), " (loaded in ",
               ready.load_seconds(), " s)");
      return std::unique_ptr<ServeChannel>(std::move(stream));
    };
    run_options.on_status = [&](const v1::DeploymentStatus& status) {
      task->deployment = status;
      progressed(0, /*force=*/true);
    };
    // A deployment on a ring: the communicator lives here until the task returns, registered so
    // that a cancel aborts it (a follower waiting for rank 0 stops at once).
    RingMembership membership;
    run_options.join_ring = [&]() -> absl::StatusOr<comm::Communicator*> {
      on_phase(v1::RANK_PHASE_FORMING_RING);
      RingJoinOptions join;
      join.member_name = member_name;
      join.default_comm_timeout = options_.default_comm_timeout;
      join.store_tls = options_.store_tls;
      join.is_cancelled = is_cancelled;
      absl::StatusOr<RingMembership> joined =
          JoinRing(task->assignment.ring(), device_.get(), join);
      if (!joined.ok()) return joined.status();
      membership = *std::move(joined);
      task->ring_formation_seconds = membership.formation_seconds;
      absl::MutexLock lock(&task->comm_mu);
      task->comm = membership.comm.get();
      if (task->cancel.load()) task->comm->Abort("the task was cancelled");
      return membership.comm.get();
    };
    run_options.on_following = [&]() {
      task->phase = v1::RANK_PHASE_RUNNING;
      on_started();
    };
    failure = RunDeploymentTask(task->assignment, run_options);
    {
      absl::MutexLock lock(&task->comm_mu);
      task->comm = nullptr;
    }
    // A deployment never succeeds: it serves until it is stopped.
    if (failure.ok()) failure = absl::CancelledError("the deployment stopped serving");
  } else if (task->assignment.spec().has_training()) {
    TrainingTaskOptions run_options;
    run_options.num_threads = threads_per_task_;
    if (task->budget_bytes < 0) {
      run_options.reserve_memory = reserve;
    } else {
      const int64_t budget = task->budget_bytes;
      run_options.reserve_memory = [budget](int64_t) -> absl::StatusOr<int64_t> { return budget; };
    }
    run_options.member_name = member_name;
    run_options.default_comm_timeout = options_.default_comm_timeout;
    run_options.store_tls = options_.store_tls;
    run_options.on_phase = on_phase;
    run_options.on_out_of_memory_retry = on_oom_retry;
    run_options.on_communicators = [&](const std::vector<comm::Communicator*>& comms,
                                       double formation_seconds) {
      task->ring_formation_seconds = formation_seconds;
      absl::MutexLock lock(&task->comm_mu);
      task->training_comms = comms;
      // An abort that came while the ring was forming finds the communicators here.
      if (task->abort.load()) comm::AbortAll(comms, "the task's attempt failed");
    };
    run_options.on_started = on_started;
    run_options.on_progress = [&](const v1::TrainingProgress& progress) {
      // A new checkpoint or evaluation is news worth a report at once; a step waits its turn.
      auto newest = [](const v1::TrainingProgress& p) -> int64_t {
        return p.checkpoints_size() > 0 ? p.checkpoints(p.checkpoints_size() - 1).step() : -1;
      };
      auto evaluated = [](const v1::TrainingProgress& p) -> int64_t {
        return p.has_last_evaluation() ? p.last_evaluation().step() : -1;
      };
      const bool news = newest(progress) != newest(task->training) ||
                        evaluated(progress) != evaluated(task->training);
      task->training = progress;
      progressed(progress.step(), news && task->reports_training);
    };
    run_options.is_cancelled = is_cancelled;
    absl::StatusOr<TrainingTaskResult> result =
        RunTrainingTask(task->assignment, device_.get(), run_options);
    if (result.ok()) {
      task->steps_done = result->steps_done;
      success = make_report(v1::TASK_STATE_SUCCEEDED);
      *success.mutable_training_result() = result->result;
      LogEvent("task ", id, " succeeded: ", result->steps_done, " training step(s), loss ",
               result->result.final_loss());
    } else {
      failure = result.status();
    }
  } else {
    AttentionTaskOptions run_options;
    run_options.num_threads = threads_per_task_;
    run_options.available_memory_bytes = task->budget_bytes;
    if (task->budget_bytes < 0) {
      run_options.reserve_memory = reserve;
      run_options.on_allocated = [this, &task](int64_t bytes) {
        absl::MutexLock lock(&mu_);
        task->claimed_bytes = std::max<int64_t>(0, task->claimed_bytes - bytes);
      };
    }
    run_options.member_name = member_name;
    run_options.default_comm_timeout = options_.default_comm_timeout;
    run_options.store_tls = options_.store_tls;
    run_options.on_phase = on_phase;
    run_options.on_out_of_memory_retry = on_oom_retry;
    run_options.on_communicator = [&](comm::Communicator* comm, double formation_seconds) {
      task->ring_formation_seconds = formation_seconds;
      absl::MutexLock lock(&task->comm_mu);
      task->comm = comm;
      // A cancel that came while the ring was forming finds the communicator here.
      if (comm != nullptr && task->cancel.load()) comm->Abort("the task was cancelled");
    };
    run_options.on_started = on_started;
    run_options.on_progress = [&](int64_t done, int64_t) { progressed(done, false); };
    run_options.is_cancelled = is_cancelled;
    if (task->assignment.spec().attention().streamed()) {
      run_options.read_inputs = [this, &task](const AttentionTaskOptions::ChunkWriter& write) {
        return ReadInputs(*task, write);
      };
      run_options.upload_output = [this, &task](v1::AttendTensor tensor,
                                                const v1::TensorHeader& header,
                                                const AttentionTaskOptions::ShardReader& read) {
        return UploadStreamed(*task, tensor, header, read);
      };
    }
    absl::StatusOr<AttentionTaskResult> result =
        RunAttentionTask(task->assignment, device_.get(), run_options);
    if (result.ok()) {
      task->steps_done = result->steps_done;
      success = make_report(v1::TASK_STATE_SUCCEEDED);
      *success.mutable_rank_result() = result->rank_result;
      has_output = result->has_output;
      if (has_output) output = std::move(result->output);
      LogEvent("task ", id, " succeeded: ", result->steps_done, " step(s), ",
               result->rank_result.seconds_per_step() * 1e3, " ms/step, ",
               result->rank_result.tflops(), " TFLOP/s (", result->timeline, ")");
    } else {
      failure = result.status();
    }
  }
  const auto last_phase = static_cast<v1::RankPhase>(task->phase.load());
  task->phase = v1::RANK_PHASE_FINISHED;

  // A kept output goes up before the report that says the rank succeeded.
  absl::Status uploaded = absl::OkStatus();
  if (failure.ok() && has_output) {
    uploaded = UploadOutput(*task, output);
    output.Clear();
  }
  v1::TaskReport report;
  if (failure.ok() && !uploaded.ok()) {
    report = make_report(v1::TASK_STATE_FAILED);
    report.set_error(absl::StrCat("the output shard could not be uploaded: ", uploaded.message()));
    report.set_error_code(static_cast<int>(uploaded.code()));
    LogEvent("task ", id, " failed: ", report.error());
  } else if (failure.ok()) {
    report = std::move(success);
  } else if (failure.code() == absl::StatusCode::kCancelled && task->cancel.load()) {
    report = make_report(v1::TASK_STATE_CANCELLED);
    report.set_handed_back(task->handed_back.load());
    LogEvent("task ", id, " cancelled: ", failure.message());
  } else {
    report = make_report(v1::TASK_STATE_FAILED);
    report.set_error(std::string(failure.message()));
    report.set_error_code(static_cast<int>(failure.code()));
    LogEvent("task ", id, " failed: ", failure.ToString());
  }
  if (options_.on_task_end) options_.on_task_end(task->assignment, report, last_phase);

  // The slot is free (done) before the final report is queued, in one step under the lock: the
  // coordinator frees the slot when the report arrives and may place the next rank here at once,
  // and that assignment must not find the slot still taken (it would be refused as "busy").
  absl::MutexLock lock(&mu_);
  reserved_bytes_ -= task->reserved_bytes;
  task->claimed_bytes = 0;
  if (!task->silent) unreported_[id] = task->steps_done.load();
  finished_.insert(id);
  finished_order_.push_back(id);
  while (finished_order_.size() > kFinishedMemory) {
    finished_.erase(finished_order_.front());
    silenced_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
  task->done = true;
  if (!task->silent) {
    EnqueueLocked(std::move(report), /*final=*/true);
  } else {
    LogEvent("task ", id, ": the coordinator no longer wants it; its outcome is not reported");
  }
  cv_.SignalAll();
}

absl::Status Worker::ReadInputs(Task& task, const AttentionTaskOptions::ChunkWriter& write) {
  const std::string& id = task.assignment.task_id();
  const v1::AttentionJobSpec& job = task.assignment.spec().attention();
  // The caller sends as fast as it can; the bound is for a caller that stalls (8 MiB/s at the
  // least, as for uploads, on top of the longest wait for a ring peer).
  const int64_t bytes = job.shape().batch() * job.shape().seq_len() * job.shape().num_heads() *
                        job.shape().head_dim() * 8 *
                        (job.pass() == v1::PASS_FORWARD_BACKWARD ? 4 : 3) /
                        std::max(1, job.num_ranks());
  grpc::ClientContext context;
  PrepareUnary(&context, options_.rpc_timeout + options_.default_comm_timeout +
                             absl::Seconds(bytes / (int64_t{8} << 20)));
  ActiveCall active(this, &context);
  StreamCall registered(task, &context);
  v1::ReadInputRequest request;
  request.set_worker_id(worker_id());
  request.set_task_id(id);
  std::unique_ptr<grpc::ClientReader<v1::AttendChunk>> reader = stub_->ReadInput(&context, request);
  v1::AttendChunk chunk;
  absl::Status written = absl::OkStatus();
  while (written.ok() && reader->Read(&chunk)) {
    if (task.cancel.load()) {
      written = absl::CancelledError(absl::StrCat("task ", id, " cancelled while reading inputs"));
    } else {
      written = write(chunk);
    }
    if (!written.ok()) context.TryCancel();
  }
  const grpc::Status status = reader->Finish();
  if (!written.ok()) return written;
  if (!status.ok()) {
    const absl::Status error = FromGrpc(status);
    return absl::Status(error.code(),
                        absl::StrCat("task ", id, ": reading its inputs: ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status Worker::UploadStreamed(Task& task, v1::AttendTensor tensor,
                                    const v1::TensorHeader& header,
                                    const AttentionTaskOptions::ShardReader& read) {
  const std::string& id = task.assignment.task_id();
  const int64_t total = header.total_bytes();
  // Not retried: the coordinator passes each chunk on to the caller as it comes.
  grpc::ClientContext context;
  PrepareUnary(&context, options_.rpc_timeout + options_.default_comm_timeout +
                             absl::Seconds(total / (int64_t{8} << 20)));
  ActiveCall active(this, &context);
  StreamCall registered(task, &context);
  v1::UploadOutputResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::UploadOutputRequest>> writer =
      stub_->UploadOutput(&context, &response);
  v1::UploadOutputRequest first;
  first.set_worker_id(worker_id());
  first.set_task_id(id);
  first.set_tensor(tensor);
  *first.mutable_chunk()->mutable_header() = header;
  bool written = writer->Write(first);
  absl::Status copied = absl::OkStatus();
  std::string buffer;
  for (int64_t offset = 0; written && offset < total; offset += api::kMaxOutputChunkBytes) {
    const int64_t length = std::min(api::kMaxOutputChunkBytes, total - offset);
    buffer.resize(static_cast<size_t>(length));
    copied = read(offset, length, buffer.data());
    if (!copied.ok()) break;
    v1::UploadOutputRequest chunk;
    chunk.mutable_chunk()->set_offset(offset);
    chunk.mutable_chunk()->set_data(buffer);
    written = writer->Write(chunk);
  }
  if (!copied.ok()) {
    context.TryCancel();
    (void)writer->Finish();
    return copied;
  }
  if (written) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) {
    const absl::Status error = FromGrpc(status);
    return absl::Status(error.code(),
                        absl::StrCat("task ", id, ": sending its output: ", error.message()));
  }
  if (response.stop()) {
    return absl::CancelledError(absl::StrCat("task ", id, ": its Attend call ended"));
  }
  return absl::OkStatus();
}

absl::Status Worker::UploadOutput(Task& task, const v1::Tensor& output) {
  const std::string& id = task.assignment.task_id();
  const int64_t total = static_cast<int64_t>(output.data().size());
  int attempt = 0;
  std::string last_error;
  for (;;) {
    std::string worker_id;
    {
      absl::MutexLock lock(&mu_);
      if (stop_reporter_) return absl::CancelledError("the worker is stopping");
      if (task.silent) return absl::CancelledError("the coordinator no longer wants the task");
      worker_id = worker_id_;
    }
    grpc::Status status;
    v1::UploadOutputResponse response;
    if (!worker_id.empty()) {
      grpc::ClientContext context;
      // A large shard gets time to travel (8 MiB/s at the least).
      PrepareUnary(&context, options_.rpc_timeout + absl::Seconds(total / (int64_t{8} << 20)));
      ActiveCall active(this, &context);
      std::unique_ptr<grpc::ClientWriter<v1::UploadOutputRequest>> writer =
          stub_->UploadOutput(&context, &response);
      v1::UploadOutputRequest first;
      first.set_worker_id(worker_id);
      first.set_task_id(id);
      v1::TensorHeader* header = first.mutable_chunk()->mutable_header();
      header->set_dtype(output.dtype());
      *header->mutable_shape() = output.shape();
      header->set_total_bytes(total);
      bool written = writer->Write(first);
      for (int64_t offset = 0; written && offset < total; offset += api::kMaxOutputChunkBytes) {
        v1::UploadOutputRequest chunk;
        chunk.mutable_chunk()->set_offset(offset);
        chunk.mutable_chunk()->set_data(output.data().substr(
            static_cast<size_t>(offset), static_cast<size_t>(api::kMaxOutputChunkBytes)));
        written = writer->Write(chunk);
      }
      if (written) writer->WritesDone();
      status = writer->Finish();
    } else {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "not registered yet");
    }
    if (status.ok()) {
      if (!response.stop()) {
        LogEvent("task ", id, ": output shard of ", FormatBytes(total), " uploaded");
        return absl::OkStatus();
      }
      absl::MutexLock lock(&mu_);
      task.silent = true;
      silenced_.insert(id);
      return absl::CancelledError("the coordinator no longer wants the task");
    }
    if (!IsRetryable(status.error_code())) return FromGrpc(status);
    const std::string error = FromGrpc(status).ToString();
    if (error != last_error) {
      LogEvent("task ", id, ": output upload failed: ", error, "; retrying with backoff");
      last_error = error;
    }
    absl::MutexLock lock(&mu_);
    SleepLocked(Backoff(attempt++),
                [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_reporter_; });
  }
}

// ---------------------------------------------------------------------------------------------------
// Reports.

void Worker::Enqueue(v1::TaskReport report, bool final) {
  absl::MutexLock lock(&mu_);
  EnqueueLocked(std::move(report), final);
}

void Worker::EnqueueLocked(v1::TaskReport report, bool final) {
  const int64_t nanos = absl::ToUnixNanos(clock_->Now());
  report.mutable_time()->set_seconds(nanos / 1000000000);
  report.mutable_time()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
  if (silenced_.count(report.task_id()) > 0) return;
  if (report.state() == v1::TASK_STATE_PROGRESS) {
    for (PendingReport& queued : reports_) {
      if (queued.report.task_id() == report.task_id() &&
          queued.report.state() == v1::TASK_STATE_PROGRESS) {
        queued.report = std::move(report);
        return;
      }
    }
  }
  PendingReport pending;
  pending.report = std::move(report);
  pending.final = final;
  reports_.push_back(std::move(pending));
  cv_.SignalAll();
}

void Worker::ReporterLoop() {
  int attempt = 0;
  std::string last_error;
  mu_.Lock();
  while (true) {
    while (!stop_reporter_ && (reports_.empty() || worker_id_.empty())) cv_.Wait(&mu_);
    if (stop_reporter_) break;
    PendingReport pending = std::move(reports_.front());
    reports_.pop_front();
    const std::string id = pending.report.task_id();
    if (silenced_.count(id) > 0) continue;
    pending.report.set_worker_id(worker_id_);
    if (pending.report.has_rank_result())
      pending.report.mutable_rank_result()->set_worker_id(worker_id_);
    const int64_t generation = generation_;
    report_in_flight_ = true;
    mu_.Unlock();

    // A report carrying an output (up to 64 MiB) gets time to travel.
    const int64_t payload = static_cast<int64_t>(pending.report.output().data().size());
    grpc::ClientContext context;
    PrepareUnary(&context, options_.rpc_timeout + absl::Seconds(payload / (int64_t{8} << 20)));
    v1::ReportTaskResponse response;
    grpc::Status status;
    {
      ActiveCall active(this, &context);
      status = stub_->ReportTask(&context, pending.report, &response);
    }
    const char* state = StateName(pending.report.state());

    mu_.Lock();
    report_in_flight_ = false;
    cv_.SignalAll();
    if (status.ok()) {
      if (!last_error.empty()) {
        LogEvent("reports delivered again");
        last_error.clear();
      }
      attempt = 0;
      if (pending.final) unreported_.erase(id);
      if (response.stop()) {
        LogEvent("task ", id, ": coordinator answered the ", state,
                 " report with stop; stopping it and reporting it no more");
        silenced_.insert(id);
        unreported_.erase(id);
        std::shared_ptr<Task> task;
        auto it = tasks_.find(id);
        if (it != tasks_.end() && !it->second->done) {
          task = it->second;
          task->silent = true;
          task->cancel = true;
        }
        for (auto r = reports_.begin(); r != reports_.end();) {
          r = r->report.task_id() == id ? reports_.erase(r) : std::next(r);
        }
        if (task != nullptr) {
          mu_.Unlock();
          AbortComms({task}, "the coordinator no longer wants it");
          mu_.Lock();
        }
      } else if (pending.final) {
        LogEvent("task ", id, ": ", state, " report delivered");
      }
      continue;
    }
    const std::string error = FromGrpc(status).ToString();
    if (!pending.final) {
      // Best effort: a later report (at worst the final one) carries the same news.
      if (error != last_error) {
        LogEvent("task ", id, ": ", state, " report dropped: ", error);
        last_error = error;
      }
      continue;
    }
    if (IsRetryable(status.error_code())) {
      if (error != last_error) {
        LogEvent("task ", id, ": ", state, " report failed: ", error, "; retrying with backoff");
        last_error = error;
      }
      reports_.push_front(std::move(pending));
      const absl::Duration wait = Backoff(attempt++);
      SleepLocked(wait, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_reporter_; });
      continue;
    }
    if (++pending.rejections < kMaxRejections) {
      LogEvent("task ", id, ": ", state, " report rejected: ", error,
               "; retrying after the next heartbeat");
      reports_.push_front(std::move(pending));
      SleepLocked(heartbeat_interval_, [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_reporter_ || generation_ != generation;
      });
      continue;
    }
    LogEvent("task ", id, ": ", state, " report rejected ", kMaxRejections,
             " times, dropped: ", error);
    unreported_.erase(id);
  }
  mu_.Unlock();
}

// ---------------------------------------------------------------------------------------------------
// Helpers.

int64_t Worker::FreeMemoryBytes() const {
  if (options_.memory_bytes > 0) {
    absl::MutexLock lock(&mu_);
    return std::max<int64_t>(0, options_.memory_bytes - reserved_bytes_);
  }
  absl::StatusOr<int64_t> available = device_->FreeMemoryBytes();
  return available.ok() ? *available : 0;
}

Worker::Load Worker::load() const {
  absl::MutexLock lock(&mu_);
  Load load;
  for (const auto& entry : tasks_) {
    if (entry.second->done) continue;
    switch (entry.second->phase.load()) {
      case v1::RANK_PHASE_PREPARING:
        ++load.preparing;
        break;
      case v1::RANK_PHASE_FORMING_RING:
        ++load.forming_ring;
        break;
      case v1::RANK_PHASE_RUNNING:
        ++load.running;
        break;
      default:  // FINISHED: uploading its output; its report follows.
        ++load.finished;
        break;
    }
  }
  load.finished += static_cast<int>(unreported_.size());
  load.reserved_bytes = reserved_bytes_;
  load.ready = ready_;
  load.draining = draining_;
  load.registrations = generation_;
  return load;
}

void Worker::SleepLocked(absl::Duration d, const std::function<bool()>& wake) {
  const absl::Time deadline = clock_->Now() + d;
  while (!wake() && !clock_->WaitUntil(&cv_, &mu_, deadline)) {
  }
}

absl::Duration Worker::Backoff(int attempt) {
  absl::Duration d = options_.backoff_initial;
  for (int i = 0; i < attempt && d < options_.backoff_max; ++i) d *= 2;
  d = std::min(d, options_.backoff_max);
  // xorshift64: jitter keeps a fleet of workers from reconnecting in lockstep.
  jitter_state_ ^= jitter_state_ << 13;
  jitter_state_ ^= jitter_state_ >> 7;
  jitter_state_ ^= jitter_state_ << 17;
  const double unit = static_cast<double>(jitter_state_ >> 11) / 9007199254740992.0;
  return d * (0.8 + 0.4 * unit);
}

void Worker::UpdateReadyLocked() {
  ready_ = !worker_id_.empty() && !draining_ && !leaving_ && !stopping_ && !reregister_ &&
           device_error_.empty();
}

bool Worker::Leave(absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  {
    absl::MutexLock lock(&mu_);
    leaving_ = true;
    heartbeat_now_ = true;
    UpdateReadyLocked();
    cv_.SignalAll();
  }
  NotifyReady();
  LogEvent("leaving: asking the coordinator to drain this worker; waiting up to ",
           absl::FormatDuration(wait), " for running tasks to finish");
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Until the coordinator confirms the drain it may still place work here; one that cannot be
    // reached (not registered, heartbeats failing) places nothing, and a task it placed before is
    // recovered when this worker's heartbeats stop.
    const bool reachable = !worker_id_.empty() && heartbeat_error_.empty();
    if (!draining_ && reachable) return false;
    for (const auto& entry : tasks_) {
      if (!entry.second->done) return false;
    }
    return true;
  };
  // Task threads do not signal cv_ when they end: look again every 50 ms.
  while (!done() && !stopping_ && absl::Now() < deadline) {
    cv_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(50)));
  }
  const bool drained = done();
  LogEvent(drained ? (draining_ ? "leaving: drained and idle"
                                : "leaving: idle, and the coordinator cannot be reached")
                   : (draining_ ? "leaving: tasks still running at the deadline; cancelling them"
                                : "leaving: the coordinator did not confirm the drain in time"));
  return drained;
}

void Worker::NotifyReady() {
  absl::MutexLock notify_lock(&notify_mu_);
  bool ready;
  {
    absl::MutexLock lock(&mu_);
    ready = ready_;
  }
  if (ready == ready_notified_) return;
  ready_notified_ = ready;
  LogEvent(ready ? "ready: registered and accepting tasks" : "not ready");
  if (options_.on_ready_change) options_.on_ready_change(ready);
}

}  // namespace worker
}  // namespace dattn
