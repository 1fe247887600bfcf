#include "server/attend_relay.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "api/attend_tensors.h"
#include "api/limits.h"

namespace dattn {
namespace server {

namespace {

v1::AttendTensor InputTensor(int index) {
  return static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_Q + index);
}
v1::AttendTensor OutputTensor(int index) {
  return static_cast<v1::AttendTensor>(v1::ATTEND_TENSOR_OUT + index);
}

}  // namespace

AttendSession::AttendSession(const AttendShape& shape)
    : shape_(shape),
      inputs_(static_cast<size_t>(shape.num_ranks)),
      input_readers_(static_cast<size_t>(shape.num_ranks), false),
      input_sent_(static_cast<size_t>(shape.num_ranks), 0),
      output_tensor_(static_cast<size_t>(shape.num_ranks), 0),
      output_offset_(static_cast<size_t>(shape.num_ranks), 0),
      outputs_(static_cast<size_t>(shape.num_ranks)) {
  if (shape.shared_memory) {
    input_tensor_ = shape.num_inputs();
    taken_ = shape.tensor_bytes() * shape.num_outputs();
    output_tensor_.assign(output_tensor_.size(), shape.num_outputs());
  }
}

absl::Status AttendSession::WaitLocked(const std::function<bool()>& ready,
                                       const std::function<bool()>& cancelled,
                                       absl::Time deadline) {
  for (;;) {
    if (!status_.ok()) return status_;
    if (ready()) return absl::OkStatus();
    if (cancelled && cancelled()) return absl::CancelledError("the call was cancelled");
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("nothing arrived in time");
    cv_.WaitWithDeadline(&mu_, std::min(deadline, now + kPollInterval));
  }
}

bool AttendSession::AdmitsLocked(const RankQueue& queue, int64_t total, int64_t bytes) const {
  return queue.bytes == 0 || total + bytes <= kBufferBytes;
}

absl::Status AttendSession::PushInput(const v1::AttendChunk& chunk,
                                      const std::function<bool()>& cancelled) {
  const int64_t size = static_cast<int64_t>(chunk.data().size());
  const int64_t tensor_bytes = shape_.tensor_bytes();
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  if (input_tensor_ >= shape_.num_inputs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", AttendTensorName(chunk.tensor()), " at offset ", chunk.offset(),
                     ": every input was complete already (", shape_.num_inputs(), " tensors of ",
                     tensor_bytes, " bytes)"));
  }
  const v1::AttendTensor expected = InputTensor(input_tensor_);
  if (chunk.tensor() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.tensor: expected ", AttendTensorName(expected), " (inputs come in the order q, k, v",
        shape_.backward ? ", dout" : "", "; ", AttendTensorName(expected), " has ", input_offset_,
        " of its ", tensor_bytes, " bytes), got ", AttendTensorName(chunk.tensor())));
  }
  const char* name = AttendTensorName(expected);
  if (chunk.offset() != input_offset_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk of ", name, ": offset ", chunk.offset(),
                                                   ", expected ", input_offset_,
                                                   " (chunks come in order, without gaps)"));
  }
  if (size == 0 || size > api::kMaxOutputChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk of ", name, " at offset ", chunk.offset(),
                                                   ": ", size, " bytes; a chunk has 1 .. ",
                                                   api::kMaxOutputChunkBytes));
  }
  if (chunk.offset() + size > tensor_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", name, " at offset ", chunk.offset(), " with ", size,
                     " bytes ends past the ", "tensor's ", tensor_bytes, " bytes (", shape_.batch,
                     " x ", shape_.seq_len, " x ", shape_.num_heads, " x ", shape_.head_dim,
                     " elements of ", shape_.element_bytes, " bytes)"));
  }
  // Cut at rank boundaries: position n of batch row b belongs to rank n / (N/P).
  const int64_t batch_bytes = shape_.seq_len * shape_.row_bytes();
  const int64_t slab = shape_.slab_bytes();
  int64_t done = 0;
  while (done < size) {
    const int64_t at = chunk.offset() + done;
    const int64_t b = at / batch_bytes;
    const int64_t within = at % batch_bytes;
    const int rank = static_cast<int>(within / slab);
    const int64_t into = within % slab;
    const int64_t length = std::min(size - done, slab - into);
    RankQueue& queue = inputs_[static_cast<size_t>(rank)];
    absl::Status admitted =
        WaitLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                       mu_) { return AdmitsLocked(queue, input_bytes_, length); },
                   cancelled, absl::InfiniteFuture());
    if (!admitted.ok()) return admitted;
    Piece piece;
    piece.tensor = expected;
    piece.offset = b * slab + into;
    piece.data = chunk.data().substr(static_cast<size_t>(done), static_cast<size_t>(length));
    queue.bytes += length;
    input_bytes_ += length;
    peak_ = std::max(peak_, input_bytes_ + output_bytes_);
    queue.pieces.push_back(std::move(piece));
    done += length;
    cv_.SignalAll();
  }
  input_offset_ += size;
  if (input_offset_ == tensor_bytes) {
    ++input_tensor_;
    input_offset_ = 0;
  }
  return absl::OkStatus();
}

absl::Status AttendSession::FinishInputs() {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  if (input_tensor_ < shape_.num_inputs()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the stream ended with ", AttendTensorName(InputTensor(input_tensor_)),
        " incomplete: ", input_offset_, " of its ", shape_.tensor_bytes(),
        " bytes came (the call needs q, k, v", shape_.backward ? ", dout" : "", ", each whole)"));
  }
  return absl::OkStatus();
}

bool AttendSession::InputsComplete() const {
  absl::MutexLock lock(&mu_);
  return input_tensor_ >= shape_.num_inputs();
}

absl::Status AttendSession::ReadInput(int rank,
                                      const std::function<bool(const v1::AttendChunk&)>& send,
                                      const std::function<bool()>& cancelled) {
  if (rank < 0 || rank >= shape_.num_ranks) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " is not one of the call's ", shape_.num_ranks));
  }
  if (shape_.shared_memory) {
    return absl::FailedPreconditionError(
        "the call's tensors are in shared memory: a rank reads its inputs from the region");
  }
  const size_t r = static_cast<size_t>(rank);
  const int64_t total = shape_.shard_bytes() * shape_.num_inputs();
  absl::MutexLock lock(&mu_);
  if (input_readers_[r]) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, "'s inputs are being read or were read already"));
  }
  input_readers_[r] = true;
  while (input_sent_[r] < total) {
    absl::Status ready =
        WaitLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !inputs_[r].pieces.empty(); },
                   cancelled, absl::InfiniteFuture());
    if (!ready.ok()) return ready;
    Piece piece = std::move(inputs_[r].pieces.front());
    inputs_[r].pieces.pop_front();
    const int64_t length = static_cast<int64_t>(piece.data.size());
    inputs_[r].bytes -= length;
    input_bytes_ -= length;
    input_sent_[r] += length;
    cv_.SignalAll();
    v1::AttendChunk chunk;
    chunk.set_tensor(piece.tensor);
    chunk.set_offset(piece.offset);
    *chunk.mutable_data() = std::move(piece.data);
    mu_.Unlock();
    const bool sent = send(chunk);
    mu_.Lock();
    if (!sent) return absl::CancelledError(absl::StrCat("rank ", rank, "'s worker went away"));
  }
  return absl::OkStatus();
}

absl::Status AttendSession::PushOutput(int rank, v1::AttendTensor tensor, int64_t offset,
                                       std::string data, const std::function<bool()>& cancelled) {
  if (rank < 0 || rank >= shape_.num_ranks) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " is not one of the call's ", shape_.num_ranks));
  }
  if (shape_.shared_memory) {
    return absl::FailedPreconditionError(
        "the call's tensors are in shared memory: a rank writes its outputs into the region");
  }
  const size_t r = static_cast<size_t>(rank);
  const int64_t length = static_cast<int64_t>(data.size());
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  if (output_tensor_[r] >= shape_.num_outputs()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " sent ",
                                                   AttendTensorName(tensor), " at offset ", offset,
                                                   " after its last output"));
  }
  const v1::AttendTensor expected = OutputTensor(output_tensor_[r]);
  if (tensor != expected || offset != output_offset_[r]) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " sent ", AttendTensorName(tensor), " at offset ", offset,
                     "; expected ", AttendTensorName(expected), " at offset ", output_offset_[r]));
  }
  if (length > api::kMaxOutputChunkBytes || offset + length > shape_.shard_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, "'s ", AttendTensorName(tensor), " chunk at offset ", offset, " of ", length,
        " bytes is over 4 MiB or past its shard's ", shape_.shard_bytes(), " bytes"));
  }
  if (length == 0) return absl::OkStatus();
  RankQueue& queue = outputs_[r];
  absl::Status admitted = WaitLocked(
      [&]()
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return AdmitsLocked(queue, output_bytes_, length); },
      cancelled, absl::InfiniteFuture());
  if (!admitted.ok()) return admitted;
  Piece piece;
  piece.tensor = tensor;
  piece.offset = offset;
  piece.data = std::move(data);
  queue.bytes += length;
  output_bytes_ += length;
  peak_ = std::max(peak_, input_bytes_ + output_bytes_);
  queue.pieces.push_back(std::move(piece));
  output_offset_[r] += length;
  if (output_offset_[r] == shape_.shard_bytes()) {
    ++output_tensor_[r];
    output_offset_[r] = 0;
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::Status AttendSession::NextOutput(v1::AttendChunk* chunk, absl::Time deadline,
                                       const std::function<bool()>& cancelled) {
  const int64_t tensor_bytes = shape_.tensor_bytes();
  const int64_t batch_bytes = shape_.seq_len * shape_.row_bytes();
  const int64_t slab = shape_.slab_bytes();
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  if (taken_ >= tensor_bytes * shape_.num_outputs()) {
    return absl::NotFoundError("every output was taken");
  }
  const int t = static_cast<int>(taken_ / tensor_bytes);
  const int64_t within = taken_ % tensor_bytes;
  const int64_t b = within / batch_bytes;
  const int64_t rest = within % batch_bytes;
  const int rank = static_cast<int>(rest / slab);
  const int64_t into = rest % slab;
  RankQueue& queue = outputs_[static_cast<size_t>(rank)];
  absl::Status ready =
      WaitLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue.pieces.empty(); },
                 cancelled, deadline);
  if (!ready.ok()) return ready;
  Piece& front = queue.pieces.front();
  // The rank's pieces come in its own order, which is the caller's order restricted to the rank.
  const int64_t want = b * slab + into;
  if (front.tensor != OutputTensor(t) || front.offset != want) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, "'s next output is ", AttendTensorName(front.tensor), " at ",
                     front.offset, ", expected ", AttendTensorName(OutputTensor(t)), " at ", want));
  }
  const int64_t available = static_cast<int64_t>(front.data.size());
  const int64_t length = std::min({available, slab - into, api::kMaxOutputChunkBytes});
  chunk->set_tensor(OutputTensor(t));
  chunk->set_offset(within);
  if (length == available) {
    *chunk->mutable_data() = std::move(front.data);
    queue.pieces.pop_front();
  } else {
    chunk->set_data(front.data.substr(0, static_cast<size_t>(length)));
    front.data.erase(0, static_cast<size_t>(length));
    front.offset += length;
  }
  queue.bytes -= length;
  output_bytes_ -= length;
  taken_ += length;
  cv_.SignalAll();
  return absl::OkStatus();
}

bool AttendSession::OutputsDone() const {
  absl::MutexLock lock(&mu_);
  return taken_ >= shape_.tensor_bytes() * shape_.num_outputs();
}

void AttendSession::Close(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return;
  status_ = status.ok() ? absl::CancelledError("the call ended") : std::move(status);
  for (RankQueue& queue : inputs_) queue = RankQueue();
  for (RankQueue& queue : outputs_) queue = RankQueue();
  input_bytes_ = 0;
  output_bytes_ = 0;
  cv_.SignalAll();
}

absl::Status AttendSession::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

int64_t AttendSession::buffered_bytes() const {
  absl::MutexLock lock(&mu_);
  return input_bytes_ + output_bytes_;
}

int64_t AttendSession::peak_buffered_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

void AttendRelay::Add(const std::string& job_id, std::shared_ptr<AttendSession> session) {
  absl::MutexLock lock(&mu_);
  sessions_[job_id] = std::move(session);
}

std::shared_ptr<AttendSession> AttendRelay::Find(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(job_id);
  return it == sessions_.end() ? nullptr : it->second;
}

void AttendRelay::Remove(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(job_id);
}

int64_t AttendRelay::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}

}  // namespace server
}  // namespace dattn
