// The relay of JobService.Attend calls: the caller's input chunks to the ranks that own them, and
// the ranks' output chunks back to the caller, in order, through bounded queues.
//
// One AttendSession per call (per streamed attention job). Three parties use it, each from its own
// thread:
//   - the caller's reader (Coordinator::Attend's input thread) pushes the chunks of q, k, v (and
//     dout) as the client sends them (PushInput): each chunk is checked (tensor order, offset,
//     length) and cut at rank boundaries into pieces for the ranks that own its positions (rank r
//     of P holds positions [r N/P, (r+1) N/P) of every batch row), and Finish() says the client
//     has sent everything (INVALID_ARGUMENT naming what is missing if not);
//   - each rank's worker pulls its pieces (ReadInput, with offsets within its (B, N/P, H, D) shard)
//     and pushes its outputs, out then (backward) dq, dk, dv, each in order (PushOutput);
//   - the caller's writer (Coordinator::Attend) takes the outputs in the caller's order
//     (NextOutput: for each output, for each batch row, each rank's rows in rank order) and sends
//     them on.
// Memory: the pieces waiting in a session's queues are at most kBufferBytes per direction, except
// that a rank whose queue is empty always takes its next piece (at most one chunk, 4 MiB), so that
// every party can make progress whatever order the others run in: the session never holds a
// tensor, only what is in flight.
//
// Ending: Close(status) ends the session for everyone: every blocked call returns that status (the
// caller went away, the job ended or was cancelled), and later calls return it at once. Every wait
// is bounded: blocked calls wake at least every kPollInterval to poll their caller's `cancelled`,
// and return when it says so.
//
// Thread-safety: every method may be called from any thread; one mutex per session. The relay
// (AttendRelay) maps job ids to sessions under its own mutex, independent of the coordinator's.
#ifndef DATTN_SERVER_ATTEND_RELAY_H_
#define DATTN_SERVER_ATTEND_RELAY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/attend_tensors.h"
#include "dattn/v1/attention.pb.h"

namespace dattn {
namespace server {

// The problem a session carries: every tensor is (batch, seq_len, num_heads, head_dim) elements of
// element_bytes bytes, split over num_ranks ranks.
struct AttendShape {
  int64_t batch = 1;
  int64_t seq_len = 1;
  int64_t num_heads = 1;
  int64_t head_dim = 1;
  int64_t element_bytes = 4;
  int num_ranks = 1;
  bool backward = false;
  // The tensors are in a shared-memory region (AttendStart.shared_memory), not on the streams:
  // the session relays nothing (its inputs are complete and its outputs taken from the start, and
  // ReadInput and PushOutput are refused); it still ends the call's waits on Close.
  bool shared_memory = false;

  int64_t row_bytes() const { return num_heads * head_dim * element_bytes; }
  int64_t tensor_bytes() const { return batch * seq_len * row_bytes(); }
  // One rank's rows of one batch row: (N/P) rows.
  int64_t slab_bytes() const { return seq_len / num_ranks * row_bytes(); }
  int64_t shard_bytes() const { return batch * slab_bytes(); }
  int num_inputs() const { return backward ? 4 : 3; }
  int num_outputs() const { return backward ? 4 : 1; }
};

class AttendSession {
 public:
  // Most bytes waiting in one direction (inputs, outputs) beyond one piece per rank.
  static constexpr int64_t kBufferBytes = int64_t{16} << 20;
  // Longest a blocked call waits before it polls its caller's cancellation again.
  static constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

  // `shape` must be valid (dimensions >= 1, num_ranks dividing seq_len).
  explicit AttendSession(const AttendShape& shape);
  AttendSession(const AttendSession&) = delete;
  AttendSession& operator=(const AttendSession&) = delete;

  const AttendShape& shape() const { return shape_; }

  // --- the caller's inputs ---
  // Takes the caller's next chunk. INVALID_ARGUMENT naming the tensor and the value for a chunk of
  // another tensor than the next expected (q, k, v, then dout with backward), at another offset
  // than where the tensor's previous chunk ended, empty, over 4 MiB or past the tensor's end.
  // Blocks while the queues are full; the session's status once closed; CANCELLED when
  // `cancelled` says so.
  absl::Status PushInput(const v1::AttendChunk& chunk, const std::function<bool()>& cancelled);
  // The caller sent its last chunk: OK if every input is complete, else INVALID_ARGUMENT naming
  // the first incomplete tensor and how many of its bytes came.
  absl::Status FinishInputs();
  // Whether every input byte came.
  bool InputsComplete() const;

  // --- a rank's inputs ---
  // Sends rank `rank`'s pieces, in order, as they come, until its last one (OK). `send` false (the
  // worker went away): CANCELLED. The session's status once closed; CANCELLED when `cancelled`.
  // Once per rank (FAILED_PRECONDITION for a second call: a rank's inputs are read once).
  absl::Status ReadInput(int rank, const std::function<bool(const v1::AttendChunk&)>& send,
                         const std::function<bool()>& cancelled);

  // --- a rank's outputs ---
  // Takes rank `rank`'s next output bytes: `tensor` (OUT, then DQ, DK, DV with backward) at byte
  // `offset` of the rank's shard. INVALID_ARGUMENT for another tensor or offset than expected or
  // bytes past the shard's end; blocks while the queues are full; closed / cancelled as above.
  absl::Status PushOutput(int rank, v1::AttendTensor tensor, int64_t offset, std::string data,
                          const std::function<bool()>& cancelled);

  // --- the caller's outputs ---
  // The next output chunk in the caller's order (tensor, then offset in the whole tensor), at most
  // 4 MiB. NOT_FOUND once every output was taken; the session's status once closed; CANCELLED
  // when `cancelled`; DEADLINE_EXCEEDED when nothing came before `deadline` (the caller then checks
  // the job and calls again).
  absl::Status NextOutput(v1::AttendChunk* chunk, absl::Time deadline,
                          const std::function<bool()>& cancelled);
  // Whether every output byte was taken by NextOutput.
  bool OutputsDone() const;

  // Ends the session with `status` (not OK). The first call wins; later ones do nothing.
  void Close(absl::Status status);
  // OK while open, else what Close was given.
  absl::Status status() const;

  // Bytes waiting now (inputs + outputs), and the most that ever waited at once, for tests and
  // metrics.
  int64_t buffered_bytes() const;
  int64_t peak_buffered_bytes() const;

 private:
  struct Piece {
    v1::AttendTensor tensor = v1::ATTEND_TENSOR_UNSPECIFIED;
    int64_t offset = 0;  // In the rank's shard.
    std::string data;
  };
  struct RankQueue {
    std::deque<Piece> pieces;
    int64_t bytes = 0;
  };

  // Waits on cv_ until `ready` holds, the session closes or `cancelled`; returns the reason.
  absl::Status WaitLocked(const std::function<bool()>& ready,
                          const std::function<bool()>& cancelled, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AdmitsLocked(const RankQueue& queue, int64_t total, int64_t bytes) const;

  const AttendShape shape_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  // Inputs: the caller's position (which tensor, how many of its bytes), each rank's queue.
  int input_tensor_ ABSL_GUARDED_BY(mu_) = 0;  // 0 .. num_inputs (all done).
  int64_t input_offset_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RankQueue> inputs_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> input_readers_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> input_sent_ ABSL_GUARDED_BY(mu_);  // Bytes each rank was sent.
  int64_t input_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Outputs: each rank's position (tensor index, bytes of it) and queue; the caller's position.
  std::vector<int> output_tensor_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> output_offset_ ABSL_GUARDED_BY(mu_);
  std::vector<RankQueue> outputs_ ABSL_GUARDED_BY(mu_);
  int64_t output_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t taken_ ABSL_GUARDED_BY(mu_) = 0;  // Output bytes taken, over all outputs in order.
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;   // Most of input_bytes_ + output_bytes_ at once.
};

// Job id -> session, for the calls of the workers (ReadInput, UploadOutput) to find the call they
// serve. Thread-safe.
class AttendRelay {
 public:
  void Add(const std::string& job_id, std::shared_ptr<AttendSession> session);
  // Null when the job has no session (its call ended, or it never was an Attend job here).
  std::shared_ptr<AttendSession> Find(const std::string& job_id) const;
  void Remove(const std::string& job_id);
  int64_t size() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<AttendSession>> sessions_ ABSL_GUARDED_BY(mu_);
};

using api::AttendTensorName;  // api/attend_tensors.h

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_ATTEND_RELAY_H_
