// Incremental decoding of the LongNet language model on one GPU: model/decoder.h's decoder (the
// same cache of only the keys some pattern can still select, the same geometry, the same API) with
// the cache, the layers and the cached attention on the device, in bf16 like CudaLongNetLM.
//
// What runs where:
//   - Prefill(prompt): the CUDA model's batched forward pass over the prompt as the first rows of
//     a max_context-long causal sequence (rotary planned for max_context, as on the CPU); after
//     each block's rotary positions the model hands its q, k, v projection to the decoder (the
//     model's qkv observer), which copies the rows the cache keeps (the prompt's last segment of
//     each slot's pattern: decode_kernels.h's CopyRows) into the state. Logits of the last
//     position are copied out.
//   - Step(states, tokens): per layer LayerNorm, the q, k, v GEMM over the B new rows at once
//     (cuBLASLt through the model's Gemm, its bf16 working copy), rotary at each row's own
//     position, the new key and value appended to each state's cache, split-K attention over the
//     cached rows (chunks of 256 rows, one CTA each, fp32 partial softmaxes), the partials merged
//     per slot and then per head (grouped or mixture mode, the engine's rule), then the output
//     projection and the feed-forward branch as in CudaLongNetLM's forward (the same kernels and
//     GEMM epilogues); the final LayerNorm and the head give fp32 logits, copied to the host.
//   - Score(tokens): the model's forward pass over the tokens with targets, each row's
//     log-probability of its target on the device (n - 1 floats copied out).
// The step's kernels: decode_kernels.h (FLOPs and bytes stated there). A step reads the weights
// once for all B sequences (2 P bytes, bf16) and each sequence's cached rows that its position's
// patterns select: at most the cache's bytes.
//
// Numbers. bf16 activations, fp32 accumulation and softmax: a step's logits equal the model's
// forward pass over the same prefix (last row) to bf16's rounding, not bit for bit (the two run
// different GEMM shapes and attention kernels); against the CPU decoder in fp32 on the same
// weights the difference is bf16's (cuda_decoder_test states the tolerances it checks).
//
// A ring of S GPUs (Create with an NCCL communicator of S > 1 ranks): model/decoder.h's ring, on
// the device. Every rank holds the whole model, whose attention must be the ring over the same
// communicator (CudaModelOptions::attention_factory with cuda_sequence_attention.h's
// NewCudaRingSequenceAttention); the cache is split as the CPU ring splits it (row j of a slot on
// rank j mod S), 1/S of one GPU's bytes to a row a slot.
//   - Prefill: the prompt padded with token 0 to S ceil(n / S) positions, rank r computing
//     positions [r n' / S, (r + 1) n' / S) as the prefix of a max_context-long sequence; each
//     layer's cached rows go from the rank that computed them to the rank that holds them (CopyRows
//     into a send buffer, one NCCL group of sends and receives, CopyRows into the cache), and the
//     logits of position n - 1 from the rank that computed them to all (an all-gather).
//   - Step: every rank runs the layers for the new tokens (the same weights and inputs), the rank
//     that holds a slot's new row appends the key and value, each rank attends over the rows it
//     holds (DecodeAttend writes every chunk, empty past its rows), the partials of all ranks are
//     all-gathered (NCCL, on the model's stream; per layer B x slots x max_chunks x (dh + 2) fp32
//     from each rank) and every rank merges all of them in rank order: every rank computes the
//     same bits, and the same logits. The step's device work, the all-gathers included (NCCL
//     kernels), is captured as a CUDA graph as on one GPU and replayed by every rank in the same
//     order; the host then waits through the communicator (its timeout, its errors).
//   - Score: the forward pass split as Prefill's (S ceil(n / S) positions, the whole padded
//     sequence), each rank's log-probabilities all-gathered.
// Collective contract: every rank makes the same calls with the same arguments (its own states
// of the same sequences), as on the CPU; a rank that does not leaves the others waiting until the
// communicator's timeout. After a communicator error the states are unspecified (drop them). A
// deployment's ring is driven by rank 0 alone: Lead, Follow, KeepAlive and Release are the CPU
// decoder's (decoder.h; the calls of decoder_calls.h), their words staged through a small device
// buffer for NCCL.
//
// Memory: each state's cache is one device allocation of KvCacheGeometry::ElementsPerSequence()
// bf16 values (2 bytes each; on a ring this rank's share), made by NewState. Step keeps buffers
// for the largest batch seen (activations of B rows, B x slots x DecodeMaxChunks partials of
// head_dim + 2 floats, and on a ring S times those again for every rank's). Prefill keeps its row
// copies' jobs (32 bytes a kept row) and, on a ring, the rows it sends and receives (2 head_dim
// bf16 values each), grown to the largest prompt's.
// Prefill and Score use the model's activation arena for the prompt's shape (the model's
// ModelOptions::checkpoint_activations keeps it to each block's input and one block's set).
//
// The model is borrowed: its weights must not change while the decoder is used (Create refreshes
// the working copy once; Prefill and Score refresh it again through Forward), and it must not be
// used by another thread meanwhile. Thread-safety: one call at a time; a state is used with the
// decoder that made it, by one call at a time, and must not outlive the model's device context
// (destroying it frees its cache with cudaFree).
// Errors: as decoder.h's (INVALID_ARGUMENT naming the bad token, state or size; OUT_OF_RANGE past
// max_context; FAILED_PRECONDITION for Prefill on a state that holds tokens), RESOURCE_EXHAUSTED
// naming the bytes when the device cannot hold a cache or the step's buffers, and CUDA errors
// naming the call. A failed call leaves every state at the position it had.
#ifndef DATTN_MODEL_CUDA_CUDA_DECODER_H_
#define DATTN_MODEL_CUDA_CUDA_DECODER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/comm/communicator.h"
#include "model/config.h"
#include "model/cuda/cuda_longnet.h"
#include "model/cuda/decode_kernels.h"
#include "model/decoder.h"
#include "model/decoder_calls.h"

namespace dattn {
namespace model {
namespace cuda {

class CudaDecoder;

// One sequence's cache (on the device) and position. Move-only; made by CudaDecoder::NewState.
class CudaDecodeState {
 public:
  CudaDecodeState(CudaDecodeState&& other) noexcept { *this = std::move(other); }
  CudaDecodeState& operator=(CudaDecodeState&& other) noexcept;
  CudaDecodeState(const CudaDecodeState&) = delete;
  CudaDecodeState& operator=(const CudaDecodeState&) = delete;
  ~CudaDecodeState() { Free(); }

  // Tokens the sequence holds so far (the position of the next one).
  int64_t position() const { return position_; }
  // Bytes of its cache on the device (allocated whole at creation).
  int64_t cache_bytes() const { return 2 * elements_ * static_cast<int64_t>(sizeof(bf16_t)); }

 private:
  friend class CudaDecoder;
  CudaDecodeState() = default;
  // Frees the cache; a state of a leading decoder joins its dropped list (decoder.h).
  void Free();
  const void* owner_ = nullptr;
  int64_t id_ = 0;  // Its decoder's number for it (1, 2, ...), the same on a ring.
  std::shared_ptr<DroppedStates> dropped_;
  int device_ = 0;
  int64_t position_ = 0;
  int64_t elements_ = 0;     // Of K (and of V): layers x rows_per_layer x head_dim.
  bf16_t* cache_ = nullptr;  // K then V, [layer][row][head_dim] each.
};

class CudaDecoder {
 public:
  using State = CudaDecodeState;
  using Logit = float;

  // Borrows `model` (it must outlive the decoder and every state). INVALID_ARGUMENT for
  // max_context < 1 (naming it); the rotary plan's errors for a max_context it refuses. With
  // `ring` (borrowed, outliving the decoder; null or one rank: one GPU) the decoder is that rank's
  // part of a ring (above): INVALID_ARGUMENT unless the ring is on CUDA memory (NCCL) and its size
  // divides max_context; `model`'s attention must be the ring over the same communicator.
  static absl::StatusOr<std::unique_ptr<CudaDecoder>> Create(CudaLongNetLM* model,
                                                             int64_t max_context,
                                                             comm::Communicator* ring = nullptr);
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  const LongNetConfig& config() const { return model_->config(); }
  const KvCacheGeometry& geometry() const { return geometry_; }

  // A sequence with no tokens yet and its whole cache allocated on the model's device.
  absl::StatusOr<CudaDecodeState> NewState() const;
  // A copy of `state` (its cache and position): a shared prompt decoded several ways, without a
  // second prefill. INVALID_ARGUMENT for a state of another decoder; FAILED_PRECONDITION while
  // leading a ring (a clone is not a call the followers make).
  absl::StatusOr<CudaDecodeState> Clone(const CudaDecodeState& state) const;

  // As Decoder::Prefill: the prompt (1 <= n <= max_context tokens) through the forward pass, the
  // cache filled, logits[0, vocab) := the logits predicting token n.
  absl::Status Prefill(const int32_t* tokens, int64_t n, CudaDecodeState* state, float* logits);
  // As Decoder::Step: tokens[j] fed to states[j] (distinct, each below max_context), logits of
  // each one's next token into logits[j vocab, (j + 1) vocab); each state advances by one.
  absl::Status Step(absl::Span<CudaDecodeState* const> states, const int32_t* tokens,
                    float* logits);
  // As Decoder::Score: logprobs[i] := log p(tokens[i + 1] | tokens[0..i]), i < n - 1, n >= 2.
  absl::Status Score(const int32_t* tokens, int64_t n, double* logprobs);

  // A ring driven by rank 0 alone, as decoder.h's Decoder: after Lead() on rank 0 each Prefill,
  // Step and Score first sends the call to the other ranks, which are in Follow(); Release() ends
  // them; KeepAlive(interval) sends a no-op when nothing was sent for `interval`. On one GPU Lead,
  // KeepAlive and Release do nothing. Errors as decoder.h's.
  absl::Status Lead();
  absl::Status Follow();
  absl::Status KeepAlive(absl::Duration interval);
  absl::Status Release();
  bool leading() const { return calls_.leading(); }
  int64_t follower_states() const { return calls_.follower_states(); }

 private:
  struct Buffers;
  CudaDecoder(CudaLongNetLM* model, KvCacheGeometry geometry, RotaryPlan rotary,
              comm::Communicator* ring);  // A ring's call wire is made here: the model's stream.
  absl::Status Init();
  // Waits for the model's stream: on a ring through the communicator (a dead peer is its
  // timeout's error, not a hang).
  absl::Status Sync();
  // Grows a device buffer to at least `bytes` (after the stream's work that may read it).
  absl::Status Reserve(void** buffer, int64_t* capacity, int64_t bytes, const char* what);
  // all[r count, (r + 1) count) := rank r's mine[0, count), for every rank (one GPU: a copy).
  absl::Status ShareFromRanks(const float* mine, int64_t count, float* all);
  absl::Status EnsureStepBuffers(int64_t rows);
  absl::Status RunStep(absl::Span<CudaDecodeState* const> states, const int32_t* tokens,
                       float* logits);
  // Enqueues a step's device work for `rows` sequences (the upload done): embedding to logits.
  absl::Status EnqueueStep(int64_t rows);

  CudaLongNetLM* const model_;
  comm::Communicator* const ring_;  // Null: one GPU.
  const int shards_;                // The ring's size (1 without one).
  const KvCacheGeometry geometry_;
  const RotaryPlan rotary_;
  const AttentionSpec spec_;
  int64_t max_chunks_ = 1;  // DecodeMaxChunks: shard 0's, the same on every rank
  std::unique_ptr<Buffers> buffers_;
  // States' ids, Lead, Follow and the calls a leader sends (decoder_calls.h).
  RingCalls calls_;
};

}  // namespace cuda
}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_CUDA_CUDA_DECODER_H_
