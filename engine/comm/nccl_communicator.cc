#include "engine/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace dattn {
namespace comm {
namespace {

// Host polling period of every wait (a stream, a non-blocking call): short, since a ring call
// waits about twice per call and each wait overshoots by up to one period.
constexpr absl::Duration kPollInterval = absl::Microseconds(20);

absl::Status CudaError(cudaError_t e, const char* call) {
  return absl::InternalError(
      absl::StrCat(call, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// An NCCL result as a Status. ncclRemoteError and ncclSystemError mean a peer or the transport is
// gone; the library's own last-error text goes into the message.
absl::Status NcclError(ncclResult_t r, const std::string& what, ncclComm_t comm) {
  const std::string text =
      absl::StrCat(what, ": ", ncclGetErrorString(r), " (code ", int(r), ")",
                   comm != nullptr ? absl::StrCat(": ", ncclGetLastError(comm)) : std::string());
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(text);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(text);
    default:
      return absl::InternalError(text);
  }
}

absl::StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
  }
  return absl::InvalidArgumentError("unknown dtype");
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

class NcclCommunicator;

class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* comm, cudaEvent_t done) : comm_(comm), done_(done) {}
  ~NcclWork() override;
  absl::Status Wait(Stream consumer) override;

 private:
  NcclCommunicator* const comm_;
  cudaEvent_t done_;
  bool waited_ = false;
  absl::Status result_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Store> store, NcclOptions options, int rank, int size,
                   ncclComm_t comm, cudaStream_t stream, float* scratch)
      : store_(std::move(store)),
        options_(std::move(options)),
        rank_(rank),
        size_(size),
        comm_(comm),
        stream_(stream),
        scratch_(scratch) {
    absl::MutexLock lock(&mu_);
    stats_.p2p_bytes_sent_to.assign(size, 0);
    stats_.p2p_bytes_received_from.assign(size, 0);
  }

  ~NcclCommunicator() override {
    cudaSetDevice(options_.device);
    ncclComm_t comm = nullptr;
    bool broken = false;
    {
      absl::MutexLock lock(&mu_);
      comm = comm_;
      comm_ = nullptr;
      broken = !error_.ok();
    }
    if (comm != nullptr) {
      bool clean = false;
      if (!broken && ncclCommFinalize(comm) == ncclSuccess) {
        // Flush what is queued, within the timeout; a comm that does not finish is aborted.
        const absl::Time deadline = absl::Now() + options_.timeout;
        ncclResult_t state = ncclInProgress;
        while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
               absl::Now() < deadline) {
          absl::SleepFor(kPollInterval);
        }
        clean = state == ncclSuccess;
      }
      if (clean) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    cudaStreamDestroy(stream_);
    cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "nccl"; }
  absl::Duration timeout() const override { return options_.timeout; }

  absl::StatusOr<std::unique_ptr<Work>> StartGroup(absl::Span<const P2POp> ops,
                                                   Stream after) override {
    if (absl::Status s = ValidateP2POps(ops, rank_, size_); !s.ok()) return s;
    for (const P2POp& op : ops) {
      if (!NcclType(op.dtype).ok()) return absl::InvalidArgumentError("unknown dtype in op");
    }
    if (absl::Status s = Enter(); !s.ok()) return s;
    // Our stream starts after the work queued on `after`.
    cudaEvent_t ready = nullptr, done = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ready, static_cast<cudaStream_t>(after.handle));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, ready, 0);
    if (ready != nullptr) cudaEventDestroy(ready);
    if (e != cudaSuccess) {
      if (done != nullptr) cudaEventDestroy(done);
      return Break(CudaError(e, "ordering the communication stream"));
    }
    const absl::Time deadline = absl::Now() + options_.timeout;
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) {
        cudaEventDestroy(done);
        return error_;
      }
      ncclResult_t r = ncclGroupStart();
      for (const P2POp& op : ops) {
        if (r != ncclSuccess) break;
        const ncclDataType_t type = *NcclType(op.dtype);
        r = op.kind == P2POp::Kind::kSend
                ? ncclSend(op.data, static_cast<size_t>(op.count), type, op.peer, comm_, stream_)
                : ncclRecv(op.data, static_cast<size_t>(op.count), type, op.peer, comm_, stream_);
      }
      const ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess) r = end;
      if (r != ncclSuccess && r != ncclInProgress) {
        cudaEventDestroy(done);
        return BreakLocked(NcclError(r, GroupName(ops), comm_));
      }
      for (const P2POp& op : ops) {
        const bool send = op.kind == P2POp::Kind::kSend;
        ++stats_.p2p_ops;
        (send ? stats_.p2p_bytes_sent : stats_.p2p_bytes_received) += op.bytes();
        (send ? stats_.p2p_bytes_sent_to : stats_.p2p_bytes_received_from)[op.peer] += op.bytes();
      }
    }
    // A non-blocking group end may still be enqueueing: wait for that (not for the transfers).
    if (absl::Status s = AwaitReady(deadline, GroupName(ops)); !s.ok()) {
      cudaEventDestroy(done);
      return s;
    }
    e = cudaEventRecord(done, stream_);
    if (e != cudaSuccess) {
      cudaEventDestroy(done);
      return Break(CudaError(e, "recording a completion event"));
    }
    return std::unique_ptr<Work>(std::make_unique<NcclWork>(this, done));
  }

  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype,
                         Stream stream) override {
    absl::StatusOr<ncclDataType_t> type = NcclType(dtype);
    if (!type.ok()) return type.status();
    if (count < 0) return absl::InvalidArgumentError(absl::StrCat("AllGather count ", count));
    if (absl::Status s = Enter(); !s.ok()) return s;
    const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) return error_;
      const ncclResult_t r = ncclAllGather(send, recv, static_cast<size_t>(count), *type, comm_,
                                           static_cast<cudaStream_t>(stream.handle));
      if (r != ncclSuccess && r != ncclInProgress) {
        return BreakLocked(NcclError(r, "ncclAllGather", comm_));
      }
      ++stats_.collective_calls;
      stats_.collective_bytes_sent += (size_ - 1) * bytes;
      stats_.collective_bytes_received += (size_ - 1) * bytes;
    }
    return AwaitReady(absl::Now() + options_.timeout, "ncclAllGather");
  }

  absl::Status AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                         Stream stream) override {
    absl::StatusOr<ncclDataType_t> type = NcclType(dtype);
    if (!type.ok()) return type.status();
    if (count < 0) return absl::InvalidArgumentError(absl::StrCat("AllReduce count ", count));
    if (absl::Status s = Enter(); !s.ok()) return s;
    const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) return error_;
      const ncclResult_t r =
          ncclAllReduce(send, recv, static_cast<size_t>(count), *type, NcclOp(op), comm_,
                        static_cast<cudaStream_t>(stream.handle));
      if (r != ncclSuccess && r != ncclInProgress) {
        return BreakLocked(NcclError(r, "ncclAllReduce", comm_));
      }
      ++stats_.collective_calls;
      stats_.collective_bytes_sent += 2 * (size_ - 1) * bytes / size_;
      stats_.collective_bytes_received += 2 * (size_ - 1) * bytes / size_;
    }
    return AwaitReady(absl::Now() + options_.timeout, "ncclAllReduce");
  }

  absl::Status Barrier() override {
    if (absl::Status s =
            AllReduce(scratch_, scratch_, 1, DType::kFloat32, ReduceOp::kSum, Stream{stream_});
        !s.ok()) {
      return s;
    }
    return Synchronize(Stream{stream_});
  }

  absl::Status Synchronize(Stream stream) override {
    if (absl::Status s = Enter(); !s.ok()) return s;
    const absl::Time deadline = absl::Now() + options_.timeout;
    cudaStream_t st = static_cast<cudaStream_t>(stream.handle);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(st);
      if (q == cudaSuccess) return health();
      if (q != cudaErrorNotReady) return Break(CudaError(q, "cudaStreamQuery"));
      if (absl::Status s = PollAsyncError("waiting for the stream"); !s.ok()) return s;
      if (absl::Now() >= deadline) {
        return Break(absl::DeadlineExceededError(
            absl::StrCat("nccl rank ", rank_, " of ", size_, ": the stream did not drain within ",
                         absl::FormatDuration(options_.timeout),
                         " (a peer is dead or stuck; the ring must be shrunk or aborted)")));
      }
      absl::SleepFor(kPollInterval);
    }
  }

  void Abort(const std::string& reason) override {
    cudaSetDevice(options_.device);
    absl::MutexLock lock(&mu_);
    if (error_.ok()) {
      error_ =
          absl::AbortedError(absl::StrCat("nccl rank ", rank_, ": communicator aborted: ", reason));
    }
    aborted_ = true;
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }

  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return error_;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(absl::Span<const int> exclude) override;

  CommStats stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

  // Used by NcclWork.
  absl::Status Break(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    return BreakLocked(why);
  }
  int device_index() const { return options_.device; }

 private:
  absl::Status BreakLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok()) error_ = why;
    return error_;
  }

  // Sets the device on this thread and returns the sticky error, if any.
  absl::Status Enter() {
    const cudaError_t e = cudaSetDevice(options_.device);
    if (e != cudaSuccess) return CudaError(e, "cudaSetDevice");
    return health();
  }

  std::string GroupName(absl::Span<const P2POp> ops) const {
    std::vector<std::string> parts;
    for (const P2POp& op : ops) {
      parts.push_back(op.kind == P2POp::Kind::kSend ? absl::StrCat("send to rank ", op.peer)
                                                    : absl::StrCat("recv from rank ", op.peer));
    }
    return absl::StrCat("nccl rank ", rank_, ": group (", absl::StrJoin(parts, ", "), ")");
  }

  // One poll of the communicator's asynchronous state; breaks it on an error.
  absl::Status PollAsyncError(const std::string& what) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return BreakLocked(NcclError(r, "ncclCommGetAsyncError", comm_));
    if (state != ncclSuccess && state != ncclInProgress) {
      return BreakLocked(NcclError(state, absl::StrCat("nccl rank ", rank_, ": ", what), comm_));
    }
    return absl::OkStatus();
  }

  // Polls until the communicator leaves ncclInProgress (a non-blocking call finished enqueueing).
  absl::Status AwaitReady(absl::Time deadline, const std::string& what) {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (!error_.ok()) return error_;
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) return BreakLocked(NcclError(r, "ncclCommGetAsyncError", comm_));
        if (state == ncclSuccess) return absl::OkStatus();
        if (state != ncclInProgress) return BreakLocked(NcclError(state, what, comm_));
      }
      if (absl::Now() >= deadline) {
        return Break(absl::DeadlineExceededError(
            absl::StrCat(what, ": not issued within ", absl::FormatDuration(options_.timeout))));
      }
      absl::SleepFor(kPollInterval);
    }
  }

  const std::shared_ptr<Store> store_;
  const NcclOptions options_;
  const int rank_;
  const int size_;

  mutable absl::Mutex mu_;  // Serialises every NCCL call on comm_ (Abort may come from any thread).
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);  // Null once aborted.
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  CommStats stats_ ABSL_GUARDED_BY(mu_);
  cudaStream_t stream_;  // Owned; p2p traffic runs here.
  float* scratch_;       // One device float for Barrier.
};

NcclWork::~NcclWork() {
  if (!waited_) {
    (void)comm_->Break(absl::AbortedError(
        "nccl: a group of point-to-point ops was abandoned unwaited; its buffers may still be in "
        "use"));
  }
  cudaEventDestroy(done_);
}

absl::Status NcclWork::Wait(Stream consumer) {
  if (waited_) return result_;
  waited_ = true;
  cudaSetDevice(comm_->device_index());
  const cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(consumer.handle), done_, 0);
  result_ = e == cudaSuccess ? comm_->health() : comm_->Break(CudaError(e, "cudaStreamWaitEvent"));
  return result_;
}

// Joins a new communicator: allocates its stream and scratch, then wraps `comm` once it is ready.
absl::StatusOr<std::unique_ptr<Communicator>> Wrap(std::shared_ptr<Store> store,
                                                   const NcclOptions& options, int rank, int size,
                                                   ncclComm_t comm, absl::Time deadline) {
  // Wait for the non-blocking init (or shrink) to finish.
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      absl::Status s = NcclError(r != ncclSuccess ? r : state,
                                 absl::StrCat("nccl rank ", rank, " of ", size, ": joining"), comm);
      ncclCommAbort(comm);
      return s;
    }
    if (state == ncclSuccess) break;
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat(
          "nccl rank ", rank, " of ", size, ": the ring did not form within ",
          absl::FormatDuration(options.timeout), " (prefix \"", options.prefix, "\")"));
    }
    absl::SleepFor(kPollInterval);
  }
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(&scratch, sizeof(float));
  if (e != cudaSuccess) {
    ncclCommAbort(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
    return CudaError(e, "creating the communication stream");
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      std::move(store), options, rank, size, comm, stream, scratch));
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Shrink(
    absl::Span<const int> exclude) {
  absl::StatusOr<int> new_rank = ShrunkRank(exclude, rank_, size_);
  if (!new_rank.ok()) return new_rank.status();
  if (cudaSetDevice(options_.device) != cudaSuccess) {
    return absl::InternalError("cudaSetDevice failed in Shrink");
  }
  std::vector<int> excluded(exclude.begin(), exclude.end());
  std::sort(excluded.begin(), excluded.end());
  // A non-blocking shrink hands the child communicator back only when its initialisation is done:
  // NCCL's job stores it into `*slot` from its own thread (null until then). The slot lives on the
  // heap so that a job still running after a timeout writes into memory that is still ours; it is
  // released once the handle has arrived (and deliberately leaked otherwise, 8 bytes).
  ncclComm_t* slot = new ncclComm_t(nullptr);
  {
    absl::MutexLock lock(&mu_);
    if (aborted_ || comm_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "nccl rank ", rank_, ": cannot shrink an aborted communicator; build a new one"));
    }
    ncclConfig_t config = NonBlockingConfig();
    // A broken ring may have kernels waiting on the dead peer: terminate them first.
    const int flags = error_.ok() ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT;
    const ncclResult_t r = ncclCommShrink(comm_, excluded.data(), static_cast<int>(excluded.size()),
                                          slot, &config, flags);
    if (r != ncclSuccess && r != ncclInProgress) {
      const absl::Status s =
          NcclError(r, absl::StrCat("nccl rank ", rank_, ": ncclCommShrink"), comm_);
      if (__atomic_load_n(slot, __ATOMIC_ACQUIRE) == nullptr) delete slot;
      return s;
    }
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  ncclComm_t child = nullptr;
  while ((child = __atomic_load_n(slot, __ATOMIC_ACQUIRE)) == nullptr) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "nccl rank ", rank_, ": the shrunk ring (without ranks ", absl::StrJoin(excluded, ","),
          ") did not form within ", absl::FormatDuration(options_.timeout)));
    }
    absl::SleepFor(kPollInterval);
  }
  delete slot;
  NcclOptions options = options_;
  options.prefix = absl::StrCat(options_.prefix, "/shrink[", absl::StrJoin(excluded, ","), "]");
  return Wrap(store_, options, *new_rank, size_ - static_cast<int>(excluded.size()), child,
              deadline);
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(std::shared_ptr<Store> store,
                                                                     int rank, int size,
                                                                     const NcclOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("nccl communicator: null store");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl communicator: rank ", rank, " is outside [0, ", size, ")"));
  }
  const int devices = CudaDeviceCount();
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat("nccl communicator: CUDA device ",
                                                      options.device, " does not exist (", devices,
                                                      " visible)"));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return CudaError(e, "cudaSetDevice");
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::string key = absl::StrCat(options.prefix, "/unique_id");
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, "ncclGetUniqueId", nullptr);
    }
    if (absl::Status s = store->Set(key, std::string(id.internal, sizeof(id.internal))); !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> got = store->Get(key, options.timeout);
    if (!got.ok()) {
      return absl::Status(got.status().code(), absl::StrCat("nccl rank ", rank, " of ", size,
                                                            ": waiting for rank 0's unique id: ",
                                                            got.status().message()));
    }
    if (got->size() != sizeof(id.internal)) {
      return absl::InternalError(
          absl::StrCat("nccl: unique id under \"", key, "\" has ", got->size(), " bytes"));
    }
    std::memcpy(id.internal, got->data(), sizeof(id.internal));
  }
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    absl::Status s =
        NcclError(r, absl::StrCat("nccl rank ", rank, ": ncclCommInitRankConfig"), comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return s;
  }
  return Wrap(std::move(store), options, rank, size, comm, deadline);
}

}  // namespace comm
}  // namespace dattn
