// The stored outputs of jobs: the shards their ranks upload, kept as files beside the job store,
// and read back as one assembled tensor in chunks.
//
// Layout: DIR/JOB_ID/ATTEMPT/rank-R.bin holds rank R's shard of that attempt (raw row-major
// little-endian bytes, exactly the shard header's total_bytes). A shard is written to
// rank-R.bin.part as it arrives, then fsync'ed, renamed and its directory fsync'ed, so a shard
// file exists only complete and durable. The coordinator commits a job's SUCCEEDED state (whose
// result names the output) only after every shard is stored; the output of a job is the files of
// its succeeded attempt. Other attempts' files (requeued, failed, cancelled) are removed by the
// coordinator when the attempt ends and at start-up, and a job's files when the job is deleted.
//
// Files are created 0600 in folders 0700 (the data dir is private).
//
// Thread-safety: every method may be called from any thread. Shards of different tasks are written
// concurrently; a ShardWriter is used by one thread. A reader keeps reading the files it opened if
// they are deleted meanwhile.
#ifndef DATTN_SERVER_RESULT_STORE_H_
#define DATTN_SERVER_RESULT_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dattn/v1/attention.pb.h"
#include "server/work_kind.h"

namespace dattn {
namespace server {

class ResultStore {
 public:
  // One shard being written. Append in order; Finish makes it durable; destroying an unfinished
  // writer removes what it wrote.
  class ShardWriter {
   public:
    ~ShardWriter();
    ShardWriter(const ShardWriter&) = delete;
    ShardWriter& operator=(const ShardWriter&) = delete;
    // `data` at byte `offset` of the shard. INVALID_ARGUMENT for an offset other than the bytes
    // written so far, or bytes past the shard's size; UNAVAILABLE for a failed write (disk full).
    absl::Status Append(int64_t offset, const std::string& data);
    // FAILED_PRECONDITION when fewer bytes than the shard's size arrived; UNAVAILABLE for a failed
    // fsync or rename. Then the shard is stored.
    absl::Status Finish();
    int64_t written() const { return written_; }

   private:
    friend class ResultStore;
    ShardWriter(std::string part, std::string path, int fd, int64_t size)
        : part_(std::move(part)), path_(std::move(path)), fd_(fd), size_(size) {}
    const std::string part_, path_;
    int fd_;
    const int64_t size_;
    int64_t written_ = 0;
    bool finished_ = false;
  };

  // Opens (creating, 0700) the folder `dir`. UNAVAILABLE naming it when it cannot be created.
  static absl::StatusOr<std::unique_ptr<ResultStore>> Open(const std::string& dir);

  // Starts rank `rank`'s shard of attempt `attempt` of job `job_id`, of `bytes` bytes; an earlier
  // unfinished upload of it is replaced. UNAVAILABLE when the file cannot be created.
  absl::StatusOr<std::unique_ptr<ShardWriter>> BeginShard(const std::string& job_id, int attempt,
                                                          int rank, int64_t bytes);
  // Whether that shard is stored, complete (its size is `bytes`).
  bool HasShard(const std::string& job_id, int attempt, int rank, int64_t bytes) const;

  // Streams the output of attempt `attempt` of job `job_id`, laid out by `layout`: first a chunk
  // with the header, then the data in order, at most `max_chunk` bytes per chunk. `emit` returning
  // false stops the stream (CANCELLED). DATA_LOSS naming the file for a shard missing or of the
  // wrong size.
  absl::Status Read(const std::string& job_id, int attempt, const OutputLayout& layout,
                    int64_t max_chunk,
                    const std::function<bool(const v1::TensorChunk&)>& emit) const;

  // Removes the job's attempts other than `keep` (all of them when keep < 0); returns the bytes
  // freed.
  int64_t Discard(const std::string& job_id, int keep);
  // Bytes stored for the job's attempt `attempt`.
  int64_t Bytes(const std::string& job_id, int attempt) const;
  // The job ids that have a folder here.
  std::vector<std::string> Jobs() const;

  const std::string& dir() const { return dir_; }

 private:
  explicit ResultStore(std::string dir) : dir_(std::move(dir)) {}
  std::string ShardPath(const std::string& job_id, int attempt, int rank) const;

  const std::string dir_;
};

}  // namespace server
}  // namespace dattn

#endif  // DATTN_SERVER_RESULT_STORE_H_
