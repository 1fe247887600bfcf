#include "model/cuda/cuda_decoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "engine/attention_spec.h"
#include "engine/cuda/cuda_status.h"
#include "model/cuda/serving_plan.h"
#include "model/ignore_target.h"
#include "model/language_model.h"
#include "model/longnet_params.h"

namespace dattn {
namespace model {
namespace cuda {
namespace {

#define DECODER_CUDA(expr) DATTN_CUDA_RETURN_IF_ERROR(expr)

absl::Status Allocate(void** p, int64_t bytes, const char* what) {
  const cudaError_t e = cudaMalloc(p, static_cast<size_t>(std::max<int64_t>(bytes, 16)));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    return absl::ResourceExhaustedError(
        absl::StrCat("the GPU decoder could not allocate ", bytes, " bytes for ", what));
  }
  if (e != cudaSuccess) return ::dattn::cuda::CudaErrorStatus(e, "cudaMalloc", __FILE__, __LINE__);
  return absl::OkStatus();
}

// A ring's call words through a device buffer (NCCL moves device memory): staged in and out on
// the model's stream, each transfer waited for through the communicator (its timeout, its errors).
class DeviceCallWire final : public DecoderCallWire {
 public:
  DeviceCallWire(comm::Communicator* ring, cudaStream_t stream, int device)
      : ring_(ring), stream_(stream), device_(device) {}
  ~DeviceCallWire() override {
    if (words_ != nullptr) cudaFree(words_);
  }
  absl::Status Send(const int64_t* words, int64_t count) override {
    DATTN_RETURN_IF_ERROR(Stage(count));
    DECODER_CUDA(cudaMemcpyAsync(words_, words, static_cast<size_t>(count) * 8,
                                 cudaMemcpyHostToDevice, stream_));
    std::vector<comm::P2POp> sends;
    for (int peer = 1; peer < ring_->size(); ++peer) {
      sends.push_back(comm::P2POp::Send(peer, words_, count, DType::kFloat64));
    }
    DATTN_RETURN_IF_ERROR(Run(sends));
    return ring_->Synchronize(comm::Stream{stream_});
  }
  absl::Status Receive(int64_t* words, int64_t count) override {
    DATTN_RETURN_IF_ERROR(Stage(count));
    DATTN_RETURN_IF_ERROR(Run({comm::P2POp::Recv(0, words_, count, DType::kFloat64)}));
    DECODER_CUDA(cudaMemcpyAsync(words, words_, static_cast<size_t>(count) * 8,
                                 cudaMemcpyDeviceToHost, stream_));
    return ring_->Synchronize(comm::Stream{stream_});
  }

 private:
  absl::Status Stage(int64_t count) {
    DECODER_CUDA(cudaSetDevice(device_));
    if (count <= capacity_) return absl::OkStatus();
    DECODER_CUDA(cudaStreamSynchronize(stream_));
    if (words_ != nullptr) cudaFree(words_);
    words_ = nullptr;
    capacity_ = 0;
    DATTN_RETURN_IF_ERROR(Allocate(reinterpret_cast<void**>(&words_), count * 8, "a ring call"));
    capacity_ = count;
    return absl::OkStatus();
  }
  absl::Status Run(const std::vector<comm::P2POp>& ops) {
    absl::StatusOr<std::unique_ptr<comm::Work>> work =
        ring_->StartGroup(ops, comm::Stream{stream_});
    if (!work.ok()) return work.status();
    return (*work)->Wait(comm::Stream{stream_});
  }

  comm::Communicator* const ring_;
  const cudaStream_t stream_;
  const int device_;
  int64_t* words_ = nullptr;
  int64_t capacity_ = 0;
};

}  // namespace

// --- States.

CudaDecodeState& CudaDecodeState::operator=(CudaDecodeState&& other) noexcept {
  if (this != &other) {
    Free();
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = std::exchange(other.id_, 0);
    dropped_ = std::move(other.dropped_);
    device_ = other.device_;
    position_ = std::exchange(other.position_, 0);
    elements_ = std::exchange(other.elements_, 0);
    cache_ = std::exchange(other.cache_, nullptr);
  }
  return *this;
}

void CudaDecodeState::Free() {
  if (id_ != 0 && dropped_ != nullptr && dropped_->record) dropped_->ids.push_back(id_);
  id_ = 0;
  if (cache_ != nullptr) {
    int current = 0;
    cudaGetDevice(&current);
    if (current != device_) cudaSetDevice(device_);
    cudaFree(cache_);
    if (current != device_) cudaSetDevice(current);
  }
  cache_ = nullptr;
}

// --- The decoder's device buffers.

struct CudaDecoder::Buffers {
  ~Buffers() {
    ClearGraphs();
    for (void* p : {static_cast<void*>(rotary), static_cast<void*>(slots),
                    static_cast<void*>(slot_of), copy_jobs, transfer, scratch, step}) {
      if (p != nullptr) cudaFree(p);
    }
  }
  RotaryConsts* rotary = nullptr;
  DecodeSlot* slots = nullptr;
  int32_t* slot_of = nullptr;  // [patterns][heads]
  // A prefill's row copies (RowCopy), its rows sent and received on a ring (bf16), and the
  // gathers of logits and log-probabilities (fp32): grown as needed, kept.
  void* copy_jobs = nullptr;
  int64_t copy_jobs_bytes = 0;
  void* transfer = nullptr;
  int64_t transfer_bytes = 0;
  void* scratch = nullptr;
  int64_t scratch_bytes = 0;
  // Step's buffers for `rows` sequences, one allocation: first what each step uploads (tokens,
  // positions, cache pointers, slot rows), then the activations, the logits and the partials.
  void* step = nullptr;
  int64_t rows = 0;
  int64_t upload_bytes = 0;
  int32_t* tokens = nullptr;
  int64_t* positions = nullptr;
  bf16_t** k_cache = nullptr;
  bf16_t** v_cache = nullptr;
  int32_t* slot_rows = nullptr;
  int32_t* append_rows = nullptr;  // a ring's (decode_kernels.h's DecodeBatch)
  int32_t* merge_rows = nullptr;
  bf16_t *x = nullptr, *x_next = nullptr, *ln = nullptr, *qkv = nullptr, *attn = nullptr,
         *sub = nullptr, *x_mid = nullptr, *h = nullptr, *sub2 = nullptr, *xf = nullptr;
  float* stats = nullptr;  // mean [rows], rstd [rows]
  float* logits = nullptr;
  float* partials = nullptr;
  float* gathered = nullptr;   // a ring's: every rank's partials
  int64_t partial_floats = 0;  // of one rank's partials, for `rows` sequences
  std::vector<char> upload;    // host image of the upload region
  // A step's work for a batch of `rows` sequences, captured once as a CUDA graph (after an eager
  // run of that size has planned its GEMMs) and replayed: one launch instead of ~12 a layer.
  std::map<int64_t, cudaGraphExec_t> graphs;
  std::set<int64_t> planned;   // sizes run eagerly once
  bool graphs_failed = false;  // a capture failed: run eagerly from then on
  void ClearGraphs() {
    for (auto& [rows, exec] : graphs) cudaGraphExecDestroy(exec);
    graphs.clear();
    planned.clear();
  }
};

CudaDecoder::CudaDecoder(CudaLongNetLM* model, KvCacheGeometry geometry, RotaryPlan rotary,
                         comm::Communicator* ring)
    : model_(model),
      ring_(ring),
      shards_(ring == nullptr ? 1 : ring->size()),
      geometry_(std::move(geometry)),
      rotary_(std::move(rotary)),
      spec_(model->config().attention_spec()),
      buffers_(std::make_unique<Buffers>()),
      calls_(ring == nullptr
                 ? nullptr
                 : std::make_unique<DeviceCallWire>(ring, model->stream(), model->cuda_device()),
             ring == nullptr ? 0 : ring->rank(), "GPU decoder") {}

CudaDecoder::~CudaDecoder() {
  cudaSetDevice(model_->cuda_device());
  cudaStreamSynchronize(model_->stream());
}

absl::StatusOr<std::unique_ptr<CudaDecoder>> CudaDecoder::Create(CudaLongNetLM* model,
                                                                 int64_t max_context,
                                                                 comm::Communicator* ring) {
  if (model == nullptr) return absl::InvalidArgumentError("GPU decoder: no model");
  if (max_context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU decoder: max_context ", max_context, " must be >= 1"));
  }
  if (ring != nullptr && ring->size() == 1) ring = nullptr;  // one rank: one GPU
  if (ring != nullptr) {
    if (ring->device() != Device::kCuda) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU decoder: the ring's communicator (", ring->name(),
                       ") is on host memory; a ring of GPUs needs an NCCL communicator"));
    }
    if (max_context % ring->size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat("GPU decoder: max_context ", max_context,
                                                     " is not a multiple of the ring's ",
                                                     ring->size(), " ranks"));
    }
  }
  absl::StatusOr<KvCacheGeometry> geometry =
      KvCacheGeometry::Make(model->config(), max_context, ring == nullptr ? 1 : ring->size(),
                            ring == nullptr ? 0 : ring->rank());
  if (!geometry.ok()) return geometry.status();
  absl::StatusOr<RotaryPlan> rotary = RotaryPlan::Make(model->config(), max_context);
  if (!rotary.ok()) return rotary.status();
  std::unique_ptr<CudaDecoder> decoder(
      new CudaDecoder(model, *std::move(geometry), *std::move(rotary), ring));
  DATTN_RETURN_IF_ERROR(decoder->Init());
  return decoder;
}

absl::Status CudaDecoder::Init() {
  DECODER_CUDA(cudaSetDevice(model_->cuda_device()));
  const LongNetConfig& c = config();
  const cudaStream_t stream = model_->stream();
  Buffers& b = *buffers_;
  // Rotary constants of the max_context plan (as CudaLongNetLM::UploadRotary computes them).
  RotaryConsts rc;
  rc.pairs = static_cast<int>(rotary_.head_dim() / 2);
  rc.block = rotary_.block();
  rc.xpos = rotary_.xpos();
  for (int j = 0; j < rc.pairs; ++j) {
    rc.inv_freq[j] = rotary_.inv_freq()[static_cast<size_t>(j)];
    rc.log2_zeta_over_base[j] =
        rotary_.log_zeta()[static_cast<size_t>(j)] / rotary_.scale_base() / std::log(2.0);
  }
  const std::vector<KvCacheGeometry::Slot>& slots = geometry_.slots();
  const int64_t num_slots = static_cast<int64_t>(slots.size());
  std::vector<DecodeSlot> table(slots.size());
  std::vector<int32_t> slot_of(static_cast<size_t>(spec_.num_patterns() * c.num_heads), -1);
  for (int64_t s = 0; s < num_slots; ++s) {
    const KvCacheGeometry::Slot& slot = slots[static_cast<size_t>(s)];
    table[static_cast<size_t>(s)].head = slot.head;
    table[static_cast<size_t>(s)].first_row = slot.first_row;
    slot_of[static_cast<size_t>(slot.pattern * c.num_heads + slot.head)] = static_cast<int32_t>(s);
  }
  max_chunks_ = DecodeMaxChunks(geometry_);
  DATTN_RETURN_IF_ERROR(
      Allocate(reinterpret_cast<void**>(&b.rotary), sizeof(RotaryConsts), "rotary constants"));
  DATTN_RETURN_IF_ERROR(Allocate(reinterpret_cast<void**>(&b.slots),
                                 num_slots * static_cast<int64_t>(sizeof(DecodeSlot)), "slots"));
  DATTN_RETURN_IF_ERROR(Allocate(reinterpret_cast<void**>(&b.slot_of),
                                 static_cast<int64_t>(slot_of.size() * 4), "slot table"));
  DECODER_CUDA(cudaMemcpyAsync(b.rotary, &rc, sizeof(rc), cudaMemcpyHostToDevice, stream));
  if (num_slots > 0) {
    DECODER_CUDA(cudaMemcpyAsync(b.slots, table.data(), table.size() * sizeof(DecodeSlot),
                                 cudaMemcpyHostToDevice, stream));
  }
  DECODER_CUDA(cudaMemcpyAsync(b.slot_of, slot_of.data(), slot_of.size() * 4,
                               cudaMemcpyHostToDevice, stream));
  DATTN_RETURN_IF_ERROR(model_->RefreshWorkingCopy());
  DECODER_CUDA(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<CudaDecodeState> CudaDecoder::NewState() const {
  DECODER_CUDA(cudaSetDevice(model_->cuda_device()));
  CudaDecodeState state;
  state.owner_ = this;
  state.device_ = model_->cuda_device();
  state.id_ = calls_.NewStateId();
  state.dropped_ = calls_.dropped();
  state.elements_ = config().num_layers * geometry_.rows_per_layer() * config().head_dim();
  DATTN_RETURN_IF_ERROR(
      Allocate(reinterpret_cast<void**>(&state.cache_), state.cache_bytes(), "a sequence's cache"));
  return state;
}

absl::StatusOr<CudaDecodeState> CudaDecoder::Clone(const CudaDecodeState& state) const {
  if (state.owner_ != this) {
    return absl::InvalidArgumentError("GPU decoder Clone: the state was not made by this decoder");
  }
  if (calls_.leading()) {
    return absl::FailedPreconditionError(
        "GPU decoder Clone: this decoder leads a ring, whose followers make no clones");
  }
  absl::StatusOr<CudaDecodeState> copy = NewState();
  if (!copy.ok()) return copy.status();
  DECODER_CUDA(cudaMemcpyAsync(copy->cache_, state.cache_, static_cast<size_t>(state.cache_bytes()),
                               cudaMemcpyDeviceToDevice, model_->stream()));
  DECODER_CUDA(cudaStreamSynchronize(model_->stream()));
  copy->position_ = state.position_;
  return copy;
}

absl::Status CudaDecoder::Sync() {
  if (ring_ != nullptr) return ring_->Synchronize(comm::Stream{model_->stream()});
  DECODER_CUDA(cudaStreamSynchronize(model_->stream()));
  return absl::OkStatus();
}

absl::Status CudaDecoder::Reserve(void** buffer, int64_t* capacity, int64_t bytes,
                                  const char* what) {
  if (bytes <= *capacity) return absl::OkStatus();
  DECODER_CUDA(cudaStreamSynchronize(model_->stream()));  // the old one may still be read
  if (*buffer != nullptr) cudaFree(*buffer);
  *buffer = nullptr;
  *capacity = 0;
  DATTN_RETURN_IF_ERROR(Allocate(buffer, bytes, what));
  *capacity = bytes;
  return absl::OkStatus();
}

absl::Status CudaDecoder::ShareFromRanks(const float* mine, int64_t count, float* all) {
  const cudaStream_t stream = model_->stream();
  if (ring_ == nullptr) {
    std::copy(mine, mine + count, all);
    return absl::OkStatus();
  }
  Buffers& b = *buffers_;
  DATTN_RETURN_IF_ERROR(
      Reserve(&b.scratch, &b.scratch_bytes, (shards_ + 1) * count * 4, "a gather's buffer"));
  float* send = static_cast<float*>(b.scratch);
  float* recv = send + count;
  DECODER_CUDA(
      cudaMemcpyAsync(send, mine, static_cast<size_t>(count) * 4, cudaMemcpyHostToDevice, stream));
  DATTN_RETURN_IF_ERROR(ring_->AllGather(send, recv, count, DType::kFloat32, comm::Stream{stream}));
  DECODER_CUDA(cudaMemcpyAsync(all, recv, static_cast<size_t>(shards_ * count) * 4,
                               cudaMemcpyDeviceToHost, stream));
  return Sync();
}

absl::Status CudaDecoder::Prefill(const int32_t* tokens, int64_t n, CudaDecodeState* state,
                                  float* logits) {
  if (logits == nullptr) {
    return absl::InvalidArgumentError("GPU decoder Prefill: no buffer for the logits");
  }
  // The tokens are checked whole before anything runs: on a ring a rank refusing only its own
  // shard would leave the others waiting.
  DATTN_RETURN_IF_ERROR(CheckPrefillArgs("GPU decoder", state != nullptr && state->owner_ == this,
                                         state != nullptr ? state->position_ : 0, tokens, n,
                                         geometry_.max_context(), config().vocab_size));
  DATTN_RETURN_IF_ERROR(calls_.SendIfLeading(PrefillCall(state->id_, tokens, n)));
  DECODER_CUDA(cudaSetDevice(model_->cuda_device()));
  const LongNetConfig& c = config();
  const cudaStream_t stream = model_->stream();
  const int64_t d = c.d_model, dh = c.head_dim(), v = c.vocab_size;
  const int me = geometry_.shard();
  // This rank's positions [begin, begin + len) of the prompt padded to S ceil(n / S) (one GPU:
  // [0, n)); padding is token 0 after the prompt, which changes none of its rows (causal).
  const int64_t len = (n + shards_ - 1) / shards_, begin = me * len;
  // The rows the prompt leaves, each slot's selected positions of the prompt's last segment, in
  // the same order on every rank: row j of a slot is held by rank j mod S as its row j / S. Each
  // is a copy from this rank's projection into its cache (`local`), into the block sent to the
  // rank that holds it (`sent`), or from the block received from the rank that computed it
  // (`got`). Destinations in the cache are offsets from layer 0's K (V: elements further on).
  std::vector<RowCopy> local;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> sent(static_cast<size_t>(shards_));
  std::vector<std::vector<int64_t>> got(static_cast<size_t>(shards_));
  const int64_t v_at = state->elements_;
  for (const KvCacheGeometry::Slot& slot : geometry_.slots()) {
    const int64_t w = c.segment_lengths[static_cast<size_t>(slot.pattern)];
    const int64_t r = c.dilation_rates[static_cast<size_t>(slot.pattern)];
    for (int64_t p = (n - 1) / w * w + slot.offset, row = 0; p < n; p += r, ++row) {
      const int computer = static_cast<int>(p / len);
      const int owner = static_cast<int>(row % shards_);
      const int64_t cache_row = slot.first_row + row / shards_;
      const int64_t src_k = (p - begin) * 3 * d + d + slot.head * dh;
      if (computer == me && owner == me) {
        local.push_back({src_k, src_k + d, cache_row * dh, v_at + cache_row * dh});
      } else if (computer == me) {
        sent[static_cast<size_t>(owner)].emplace_back(src_k, src_k + d);
      } else if (owner == me) {
        got[static_cast<size_t>(computer)].push_back(cache_row);
      }
    }
  }
  // Each peer's block holds its rows as (k, v) pairs of dh values: send offsets, then receive.
  std::vector<RowCopy> pack, unpack;
  std::vector<int64_t> send_at(static_cast<size_t>(shards_)), recv_at(static_cast<size_t>(shards_));
  int64_t sent_rows = 0, got_rows = 0;
  for (int peer = 0; peer < shards_; ++peer) {
    send_at[static_cast<size_t>(peer)] = sent_rows;
    for (const auto& [src_k, src_v] : sent[static_cast<size_t>(peer)]) {
      pack.push_back({src_k, src_v, sent_rows * 2 * dh, sent_rows * 2 * dh + dh});
      ++sent_rows;
    }
  }
  for (int peer = 0; peer < shards_; ++peer) {
    recv_at[static_cast<size_t>(peer)] = got_rows;
    for (int64_t cache_row : got[static_cast<size_t>(peer)]) {
      unpack.push_back({(sent_rows + got_rows) * 2 * dh, (sent_rows + got_rows) * 2 * dh + dh,
                        cache_row * dh, v_at + cache_row * dh});
      ++got_rows;
    }
  }
  Buffers& b = *buffers_;
  std::vector<RowCopy> jobs = local;
  jobs.insert(jobs.end(), pack.begin(), pack.end());
  jobs.insert(jobs.end(), unpack.begin(), unpack.end());
  DATTN_RETURN_IF_ERROR(Reserve(&b.copy_jobs, &b.copy_jobs_bytes,
                                static_cast<int64_t>(jobs.size() * sizeof(RowCopy)),
                                "a prefill's row copies"));
  DATTN_RETURN_IF_ERROR(Reserve(&b.transfer, &b.transfer_bytes, (sent_rows + got_rows) * 2 * dh * 2,
                                "a prefill's transfers"));
  if (!jobs.empty()) {
    DECODER_CUDA(cudaMemcpyAsync(b.copy_jobs, jobs.data(), jobs.size() * sizeof(RowCopy),
                                 cudaMemcpyHostToDevice, stream));
  }
  const RowCopy* local_jobs = static_cast<const RowCopy*>(b.copy_jobs);
  const RowCopy* pack_jobs = local_jobs + local.size();
  const RowCopy* unpack_jobs = pack_jobs + pack.size();
  bf16_t* transfer = static_cast<bf16_t*>(b.transfer);
  const int64_t layer_elements = geometry_.rows_per_layer() * dh;
  bf16_t* cache = state->cache_;
  model_->set_qkv_observer([&](int64_t layer, const bf16_t* qkv) -> absl::Status {
    const int64_t shift = layer * layer_elements;
    DECODER_CUDA(
        CopyRows(qkv, cache, shift, local_jobs, static_cast<int64_t>(local.size()), dh, stream));
    if (sent_rows + got_rows == 0) return absl::OkStatus();
    DECODER_CUDA(
        CopyRows(qkv, transfer, 0, pack_jobs, static_cast<int64_t>(pack.size()), dh, stream));
    std::vector<comm::P2POp> ops;
    for (int peer = 0; peer < shards_; ++peer) {
      const auto at = static_cast<size_t>(peer);
      if (!sent[at].empty()) {
        ops.push_back(comm::P2POp::Send(peer, transfer + send_at[at] * 2 * dh,
                                        static_cast<int64_t>(sent[at].size()) * 2 * dh,
                                        DType::kBFloat16));
      }
      if (!got[at].empty()) {
        ops.push_back(comm::P2POp::Recv(peer, transfer + (sent_rows + recv_at[at]) * 2 * dh,
                                        static_cast<int64_t>(got[at].size()) * 2 * dh,
                                        DType::kBFloat16));
      }
    }
    absl::StatusOr<std::unique_ptr<comm::Work>> work = ring_->StartGroup(ops, comm::Stream{stream});
    if (!work.ok()) return work.status();
    DATTN_RETURN_IF_ERROR((*work)->Wait(comm::Stream{stream}));
    DECODER_CUDA(CopyRows(transfer, cache, shift, unpack_jobs, static_cast<int64_t>(unpack.size()),
                          dh, stream));
    return absl::OkStatus();
  });
  std::vector<int32_t> mine(static_cast<size_t>(len), 0);
  if (begin < n) {
    std::copy(tokens + begin, tokens + std::min(n, begin + len), mine.begin());
  }
  TokenBatch batch;
  batch.tokens = mine.data();
  batch.batch = 1;
  batch.seq_len = len;
  // The prompt as the first positions of a max_context-long sequence (rotary's plan).
  batch.positions = {begin, geometry_.max_context()};
  absl::StatusOr<LossResult> forward = model_->Forward(batch);
  model_->set_qkv_observer(nullptr);
  if (!forward.ok()) return forward.status();
  // The logits of position n - 1, from the rank that computed it.
  const int holder = static_cast<int>((n - 1) / len);
  std::vector<float> row(static_cast<size_t>(v), 0.0f);
  if (holder == me) DATTN_RETURN_IF_ERROR(model_->CopyLogitsToHost(row.data(), n - 1 - begin, 1));
  if (ring_ == nullptr) {
    std::copy(row.begin(), row.end(), logits);
  } else {
    std::vector<float> all(static_cast<size_t>(shards_ * v));
    DATTN_RETURN_IF_ERROR(ShareFromRanks(row.data(), v, all.data()));
    std::copy(all.begin() + holder * v, all.begin() + (holder + 1) * v, logits);
  }
  DATTN_RETURN_IF_ERROR(Sync());
  state->position_ = n;
  return absl::OkStatus();
}

absl::Status CudaDecoder::Score(const int32_t* tokens, int64_t n, double* logprobs) {
  DATTN_RETURN_IF_ERROR(CheckScoreArgs("GPU decoder", tokens, n, logprobs, geometry_.max_context(),
                                       config().vocab_size));
  DATTN_RETURN_IF_ERROR(calls_.SendIfLeading(ScoreCall(tokens, n)));
  DECODER_CUDA(cudaSetDevice(model_->cuda_device()));
  // This rank's positions of the n tokens padded to S ceil(n / S), a whole sequence (rotary
  // planned for the padded length); each position's target is the next token, none past n - 1.
  const int64_t len = (n + shards_ - 1) / shards_, begin = geometry_.shard() * len;
  std::vector<int32_t> mine(static_cast<size_t>(len), 0), targets(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    const int64_t g = begin + i;
    if (g < n) mine[static_cast<size_t>(i)] = tokens[g];
    targets[static_cast<size_t>(i)] = g + 1 < n ? tokens[g + 1] : kIgnoreTarget;
  }
  TokenBatch batch;
  batch.tokens = mine.data();
  batch.targets = targets.data();
  batch.batch = 1;
  batch.seq_len = len;
  if (ring_ != nullptr) batch.positions = {begin, len * shards_};
  absl::StatusOr<LossResult> forward = model_->Forward(batch);
  if (!forward.ok()) return forward.status();
  std::vector<float> out(static_cast<size_t>(len));
  DATTN_RETURN_IF_ERROR(model_->CopyTargetLogProbsToHost(out.data()));
  std::vector<float> all(static_cast<size_t>(shards_ * len));
  DATTN_RETURN_IF_ERROR(ShareFromRanks(out.data(), len, all.data()));
  for (int64_t i = 0; i + 1 < n; ++i) logprobs[i] = all[static_cast<size_t>(i)];
  return absl::OkStatus();
}

absl::Status CudaDecoder::EnsureStepBuffers(int64_t rows) {
  Buffers& b = *buffers_;
  if (rows <= b.rows) return absl::OkStatus();
  const DecodeStepLayout l = LayoutDecodeStep(
      config(), static_cast<int64_t>(geometry_.slots().size()), max_chunks_, rows, shards_);
  void* step = nullptr;
  DATTN_RETURN_IF_ERROR(Allocate(&step, l.bytes, "a decoding step's buffers"));
  DECODER_CUDA(cudaStreamSynchronize(model_->stream()));
  if (b.step != nullptr) cudaFree(b.step);
  b.ClearGraphs();  // they name the old buffers
  b.step = step;
  b.rows = rows;
  b.upload_bytes = l.upload_bytes;
  char* base = static_cast<char*>(step);
  b.tokens = reinterpret_cast<int32_t*>(base + l.tokens);
  b.positions = reinterpret_cast<int64_t*>(base + l.positions);
  b.k_cache = reinterpret_cast<bf16_t**>(base + l.k_cache);
  b.v_cache = reinterpret_cast<bf16_t**>(base + l.v_cache);
  b.slot_rows = reinterpret_cast<int32_t*>(base + l.slot_rows);
  b.append_rows = reinterpret_cast<int32_t*>(base + l.append_rows);
  b.merge_rows = reinterpret_cast<int32_t*>(base + l.merge_rows);
  b.x = reinterpret_cast<bf16_t*>(base + l.x);
  b.x_next = reinterpret_cast<bf16_t*>(base + l.x_next);
  b.ln = reinterpret_cast<bf16_t*>(base + l.ln);
  b.qkv = reinterpret_cast<bf16_t*>(base + l.qkv);
  b.attn = reinterpret_cast<bf16_t*>(base + l.attn);
  b.sub = reinterpret_cast<bf16_t*>(base + l.sub);
  b.x_mid = reinterpret_cast<bf16_t*>(base + l.x_mid);
  b.h = reinterpret_cast<bf16_t*>(base + l.h);
  b.sub2 = reinterpret_cast<bf16_t*>(base + l.sub2);
  b.xf = reinterpret_cast<bf16_t*>(base + l.xf);
  b.stats = reinterpret_cast<float*>(base + l.stats);
  b.logits = reinterpret_cast<float*>(base + l.logits);
  b.partials = reinterpret_cast<float*>(base + l.partials);
  b.gathered = reinterpret_cast<float*>(base + l.gathered);
  b.partial_floats = l.partial_floats;
  b.upload.assign(static_cast<size_t>(l.upload_bytes), 0);
  return absl::OkStatus();
}

absl::Status CudaDecoder::Step(absl::Span<CudaDecodeState* const> states, const int32_t* tokens,
                               float* logits) {
  if (states.empty()) return absl::OkStatus();
  if (tokens == nullptr || logits == nullptr) {
    return absl::InvalidArgumentError("GPU decoder Step: null tokens or logits");
  }
  std::unordered_set<const CudaDecodeState*> seen;
  for (size_t j = 0; j < states.size(); ++j) {
    const CudaDecodeState* s = states[j];
    const bool ours = s != nullptr && s->owner_ == this;
    DATTN_RETURN_IF_ERROR(CheckStepSequence(
        "GPU decoder", static_cast<int64_t>(j), ours, ours && !seen.insert(s).second,
        ours ? s->position_ : 0, geometry_.max_context(), tokens[j], config().vocab_size));
  }
  if (calls_.leading()) {
    std::vector<int64_t> ids;
    for (const CudaDecodeState* state : states) ids.push_back(state->id_);
    DATTN_RETURN_IF_ERROR(calls_.SendIfLeading(StepCall(ids, tokens)));
  }
  DECODER_CUDA(cudaSetDevice(model_->cuda_device()));
  return RunStep(states, tokens, logits);
}

absl::Status CudaDecoder::Lead() { return calls_.Lead(); }

absl::Status CudaDecoder::KeepAlive(absl::Duration interval) { return calls_.KeepAlive(interval); }

absl::Status CudaDecoder::Release() { return calls_.Release(); }

absl::Status CudaDecoder::Follow() { return calls_.Follow(*this); }

absl::Status CudaDecoder::RunStep(absl::Span<CudaDecodeState* const> states, const int32_t* tokens,
                                  float* logits) {
  const LongNetConfig& c = config();
  const int64_t rows = static_cast<int64_t>(states.size());
  DATTN_RETURN_IF_ERROR(EnsureStepBuffers(rows));
  Buffers& b = *buffers_;
  const cudaStream_t stream = model_->stream();
  const std::vector<KvCacheGeometry::Slot>& slots = geometry_.slots();
  const int num_slots = static_cast<int>(slots.size());
  // The step's upload: tokens, positions, cache pointers and each (sequence, slot)'s row.
  {
    char* host = b.upload.data();
    const char* dev = static_cast<const char*>(b.step);
    auto at = [&](const void* device_ptr) {
      return host + (static_cast<const char*>(device_ptr) - dev);
    };
    int32_t* h_tokens = reinterpret_cast<int32_t*>(at(b.tokens));
    int64_t* h_positions = reinterpret_cast<int64_t*>(at(b.positions));
    bf16_t** h_k = reinterpret_cast<bf16_t**>(at(b.k_cache));
    bf16_t** h_v = reinterpret_cast<bf16_t**>(at(b.v_cache));
    int32_t* h_rows = reinterpret_cast<int32_t*>(at(b.slot_rows));
    int32_t* h_append = reinterpret_cast<int32_t*>(at(b.append_rows));
    int32_t* h_merge = reinterpret_cast<int32_t*>(at(b.merge_rows));
    const int me = geometry_.shard();
    for (int64_t j = 0; j < rows; ++j) {
      const CudaDecodeState& s = *states[static_cast<size_t>(j)];
      h_tokens[j] = tokens[j];
      h_positions[j] = s.position_;
      h_k[j] = s.cache_;
      h_v[j] = s.cache_ + s.elements_;
      for (int k = 0; k < num_slots; ++k) {
        // The slot's row of the position on the whole ring; on a ring, also the rank that holds
        // it (and its row there) and the last row up to it that this rank holds.
        const int64_t row = geometry_.RowOf(slots[static_cast<size_t>(k)], s.position_);
        const int64_t at_jk = j * num_slots + k;
        if (shards_ == 1) {
          h_rows[at_jk] = static_cast<int32_t>(row);
          continue;
        }
        const int64_t held = row >= me ? (row - me) / shards_ + 1 : 0;
        h_rows[at_jk] = static_cast<int32_t>(held - 1);
        h_append[at_jk] =
            row >= 0 && row % shards_ == me ? static_cast<int32_t>(row / shards_) : -1;
        h_merge[at_jk] = static_cast<int32_t>(row);
      }
    }
    DECODER_CUDA(cudaMemcpyAsync(b.step, host, static_cast<size_t>(b.upload_bytes),
                                 cudaMemcpyHostToDevice, stream));
  }
  if (auto it = b.graphs.find(rows); it != b.graphs.end()) {
    DECODER_CUDA(cudaGraphLaunch(it->second, stream));
  } else if (b.planned.count(rows) == 0 || b.graphs_failed) {
    DATTN_RETURN_IF_ERROR(EnqueueStep(rows));
    b.planned.insert(rows);
  } else {
    // Every GEMM shape of this size is planned: capture the step and replay it from now on.
    DECODER_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status enqueued = EnqueueStep(rows);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    cudaGraphExec_t exec = nullptr;
    const bool captured = enqueued.ok() && ended == cudaSuccess && graph != nullptr &&
                          cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (captured) {
      b.graphs[rows] = exec;
      DECODER_CUDA(cudaGraphLaunch(exec, stream));
    } else {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      cudaGetLastError();  // a failed capture's error is not the step's
      b.graphs_failed = true;
      DATTN_RETURN_IF_ERROR(EnqueueStep(rows));
    }
  }
  DECODER_CUDA(cudaMemcpyAsync(logits, b.logits, static_cast<size_t>(rows * c.vocab_size) * 4,
                               cudaMemcpyDeviceToHost, stream));
  DATTN_RETURN_IF_ERROR(Sync());
  for (CudaDecodeState* s : states) ++s->position_;
  return absl::OkStatus();
}

absl::Status CudaDecoder::EnqueueStep(int64_t rows) {
  const LongNetConfig& c = config();
  Buffers& b = *buffers_;
  const cudaStream_t stream = model_->stream();
  const int num_sms = model_->num_sms();
  const int64_t d = c.d_model, f = c.ffn_dim, v = c.vocab_size, dh = c.head_dim();
  const int num_slots = static_cast<int>(geometry_.slots().size());
  const float eps = static_cast<float>(c.layer_norm_eps);
  const bf16_t* wk = model_->working_copy();
  const WorkingCopyLayout& working = model_->working_layout();
  const float* p = model_->params();
  const ModelOffsets& offsets = model_->offsets();
  Gemm& gemm = model_->gemm();
  DecodeBatch batch;
  batch.batch = rows;
  batch.slots = num_slots;
  batch.slot = b.slots;
  batch.rows = b.slot_rows;
  batch.k_cache = b.k_cache;
  batch.v_cache = b.v_cache;
  batch.d = d;
  batch.head_dim = dh;
  // This step's partials of one rank: B x slots x max_chunks x (dh + 2) floats.
  const int64_t partial_count = rows * num_slots * max_chunks_ * (dh + 2);
  if (ring_ != nullptr) {
    batch.append_rows = b.append_rows;
    batch.merge_rows = b.merge_rows;
    batch.ranks = shards_;
    batch.rank_stride = partial_count;
  }
  const float scale = static_cast<float>(spec_.ScaleFor(dh));
  float* mean = b.stats;
  float* rstd = b.stats + rows;
  // The residual stream alternates between two buffers (locally: a captured graph must name the
  // same ones every time).
  bf16_t* x = b.x;
  bf16_t* x_next = b.x_next;
  DECODER_CUDA(EmbeddingForward(b.tokens, rows, wk + working.embedding, d, x, stream));
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const WorkingBlock& w = working.blocks[static_cast<size_t>(layer)];
    const BlockOffsets& o = offsets.blocks[static_cast<size_t>(layer)];
    DECODER_CUDA(LayerNormForward(x, rows, d, p + o.attn_norm.weight, p + o.attn_norm.bias, eps,
                                  false, false, b.ln, mean, rstd, num_sms, stream));
    DATTN_RETURN_IF_ERROR(
        gemm.Run(LinearArgs(b.ln, rows, d, wk + w.wqkv, wk + w.bqkv, 3 * d, b.qkv)));
    DECODER_CUDA(
        RotaryForwardAt(b.qkv, rows, 3 * d, b.positions, d, dh, b.rotary, num_sms, stream));
    if (num_slots > 0) {
      batch.layer_offset = layer * geometry_.rows_per_layer() * dh;
      DECODER_CUDA(DecodeAppend(batch, b.qkv, stream));
      DECODER_CUDA(DecodeAttend(batch, b.qkv, scale, max_chunks_, b.partials, stream));
      if (ring_ != nullptr) {
        DATTN_RETURN_IF_ERROR(ring_->AllGather(b.partials, b.gathered, partial_count,
                                               DType::kFloat32, comm::Stream{stream}));
      }
      DECODER_CUDA(DecodeMerge(batch, ring_ != nullptr ? b.gathered : b.partials, max_chunks_,
                               b.slot_of, spec_.num_patterns(), c.num_heads,
                               spec_.mode == AttentionMode::kGrouped, b.attn, stream));
    } else {
      DECODER_CUDA(cudaMemsetAsync(b.attn, 0, static_cast<size_t>(rows * d * 2), stream));
    }
    DECODER_CUDA(LayerNormForward(b.attn, rows, d, p + o.attn_sub_norm.weight,
                                  p + o.attn_sub_norm.bias, eps, false, false, b.sub, mean, rstd,
                                  num_sms, stream));
    DATTN_RETURN_IF_ERROR(
        gemm.Run(LinearArgs(b.sub, rows, d, wk + w.wo, wk + w.bo, d, b.x_mid, x)));
    DECODER_CUDA(LayerNormForward(b.x_mid, rows, d, p + o.ffn_norm.weight, p + o.ffn_norm.bias, eps,
                                  false, false, b.ln, mean, rstd, num_sms, stream));
    DATTN_RETURN_IF_ERROR(gemm.Run(LinearArgs(b.ln, rows, d, wk + w.w1, wk + w.b1, f, b.h)));
    DECODER_CUDA(LayerNormForward(b.h, rows, f, p + o.ffn_sub_norm.weight, p + o.ffn_sub_norm.bias,
                                  eps, /*gelu=*/true, false, b.sub2, mean, rstd, num_sms, stream));
    DATTN_RETURN_IF_ERROR(
        gemm.Run(LinearArgs(b.sub2, rows, f, wk + w.w2, wk + w.b2, d, x_next, b.x_mid)));
    std::swap(x, x_next);
  }
  DECODER_CUDA(LayerNormForward(x, rows, d, p + offsets.final_norm.weight,
                                p + offsets.final_norm.bias, eps, false, false, b.xf, mean, rstd,
                                num_sms, stream));
  return gemm.Run(LinearArgs(b.xf, rows, d, wk + working.head, nullptr, v, b.logits, nullptr,
                             /*y_fp32=*/true));
}

#undef DECODER_CUDA

}  // namespace cuda
}  // namespace model
}  // namespace dattn
