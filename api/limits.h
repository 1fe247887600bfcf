// The limits of the dattn.v1 API, defined once: the coordinator validates against them, the workers
// check what they are handed against them, and the CLI's help text quotes them. Each constant says
// which field it bounds; the .proto files state the same numbers to users.
#ifndef DATTN_API_LIMITS_H_
#define DATTN_API_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace dattn {
namespace api {

// SubmitJobRequest.idempotency_key: 1 .. this many characters.
inline constexpr size_t kMaxIdempotencyKeyLength = 128;
// JobSpec.name: at most this many characters.
inline constexpr size_t kMaxJobNameLength = 128;
// JobSpec.tenant: at most this many characters of [A-Za-z0-9._-].
inline constexpr size_t kMaxTenantLength = 64;
// JobSpec.priority: kMinPriority .. kMaxPriority.
inline constexpr int kMinPriority = -100;
inline constexpr int kMaxPriority = 100;
// RecoveryPolicy.stall_seconds: a RUNNING job with no finished step for this long is recovered.
inline constexpr int kDefaultStallSeconds = 30 * 60;
inline constexpr int kMaxStallSeconds = 7 * 24 * 3600;
// Job ids in requests: at most this many characters ("j-" + 16 hex digits in practice).
inline constexpr size_t kMaxJobIdLength = 64;
// AttentionSpec.segment_lengths and .dilation_rates: at most this many entries (patterns, G) per
// job. LongNet uses a handful; the bound keeps a request from making every process that holds the
// spec (coordinator, store, workers) hold millions of them.
inline constexpr int kMaxPatterns = 64;
// A submitted JobSpec's serialized size, unknown fields included. Every known field is bounded on
// its own (name 128, tenant 64, patterns kMaxPatterns, the rest scalars: under 2 KiB in all); this
// bounds what a client can make the coordinator store in fields it does not know.
inline constexpr size_t kMaxSpecBytes = 64 << 10;
// AttentionJobSpec.num_ranks (P, the ring size): 1 .. kMaxRingRanks, and P^2 x num_heads at most
// kMaxRingPlanWork. The coordinator plans every rank's exchange buffers when it accepts a ring job
// (engine/rank_memory_plan.h), and at every restart under its lock. That planning once grew as
// P^2 H (a fuzzer's input took 20 s, docs/FUZZING.md); it is now near P^2 (P = 1024, H = 2048:
// 0.55 s on one core), and these bounds keep the worst shape a fuzzer can build to 0.02 s (P = 128,
// H = 256, a shard of one position, hundreds of distinct head offsets) and a few seconds in the
// sanitized fuzz build, under its 10 s limit per input.
inline constexpr int kMaxRingRanks = 256;
inline constexpr int64_t kMaxRingPlanWork = int64_t{1} << 22;
// AttentionJobSpec.iterations: 1 .. this many (0 means 1).
inline constexpr int64_t kMaxIterations = 1000000;
// AttentionJobSpec.return_output: the largest output a job may return, all ranks together. The
// output is written to the coordinator's data dir and read back with JobService.ReadOutput in
// chunks, so it is bounded by disk, not by a message size.
inline constexpr int64_t kMaxReturnedOutputBytes = int64_t{16} << 30;
// Largest data chunk of an output stream (JobService.ReadOutput, WorkerRegistry.UploadOutput).
inline constexpr int64_t kMaxOutputChunkBytes = int64_t{4} << 20;
// CancelJobRequest.reason: at most this many characters.
inline constexpr size_t kMaxCancelReasonLength = 256;
// ListJobsRequest.page_size: 1 .. kMaxPageSize; 0 means kDefaultPageSize.
inline constexpr int kMaxPageSize = 1000;
inline constexpr int kDefaultPageSize = 50;
// GetJobRequest.max_events: 1 .. kMaxEvents; 0 means kDefaultMaxEvents.
inline constexpr int kDefaultMaxEvents = 1000;
inline constexpr int kMaxEvents = 10000;
// DeploymentSpec's limits: max_context, max_batch and max_queued, 1 .. kMax...; 0 means
// kDefault...; ranks 1 .. kMaxDeploymentRanks (0 means 1).
inline constexpr int64_t kDefaultMaxContext = 4096;
inline constexpr int64_t kMaxDeploymentContext = int64_t{1} << 24;
inline constexpr int kDefaultMaxBatch = 8;
inline constexpr int kMaxDeploymentBatch = 256;
inline constexpr int kDefaultMaxQueued = 256;
inline constexpr int kMaxDeploymentQueued = 65536;
inline constexpr int kMaxDeploymentRanks = 64;
// Largest gRPC message the coordinator and its clients exchange. No message carries a tensor (those
// travel in chunks of kMaxOutputChunkBytes), so this bounds a Job with its events and per-rank
// results and a listing page.
inline constexpr int kMaxMessageBytes = 32 << 20;

}  // namespace api
}  // namespace dattn

#endif  // DATTN_API_LIMITS_H_
