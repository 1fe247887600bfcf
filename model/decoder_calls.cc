#include "model/decoder_calls.h"

#include <algorithm>
#include <utility>

namespace dattn {
namespace model {
namespace {

// Words on host memory: each call a group of point-to-point transfers. (int64s move as 8-byte
// words: nothing adds them.)
class HostCallWire final : public DecoderCallWire {
 public:
  explicit HostCallWire(comm::Communicator* ring) : ring_(ring) {}

  absl::Status Send(const int64_t* words, int64_t count) override {
    std::vector<comm::P2POp> sends;
    for (int peer = 1; peer < ring_->size(); ++peer) {
      sends.push_back(comm::P2POp::Send(peer, words, count, DType::kFloat64));
    }
    absl::StatusOr<std::unique_ptr<comm::Work>> work = ring_->StartGroup(sends, comm::Stream{});
    if (!work.ok()) return work.status();
    return (*work)->Wait(comm::Stream{});
  }
  absl::Status Receive(int64_t* words, int64_t count) override {
    const comm::P2POp recv = comm::P2POp::Recv(0, words, count, DType::kFloat64);
    absl::StatusOr<std::unique_ptr<comm::Work>> work =
        ring_->StartGroup(absl::MakeConstSpan(&recv, 1), comm::Stream{});
    if (!work.ok()) return work.status();
    return (*work)->Wait(comm::Stream{});
  }

 private:
  comm::Communicator* const ring_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DecoderCallWire>> NewHostCallWire(comm::Communicator* ring) {
  if (ring == nullptr) return absl::InvalidArgumentError("decoder call wire: no communicator");
  if (ring->device() != Device::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat("decoder call wire: the ", ring->name(),
                                                   " communicator is not on host memory"));
  }
  return std::unique_ptr<DecoderCallWire>(new HostCallWire(ring));
}

absl::Status SendDecoderCall(DecoderCallWire& wire, std::vector<int64_t>* dropped,
                             std::vector<int64_t> words) {
  // [op, dropped count, dropped ids..., arguments...]
  std::vector<int64_t> message = {words[0], static_cast<int64_t>(dropped->size())};
  message.insert(message.end(), dropped->begin(), dropped->end());
  message.insert(message.end(), words.begin() + 1, words.end());
  dropped->clear();
  // One packet: the message's length and its first words; the rest, when it is longer, after.
  const int64_t length = static_cast<int64_t>(message.size());
  std::vector<int64_t> packet(kCallPacketWords, 0);
  packet[0] = length;
  const int64_t inline_words = std::min<int64_t>(length, kCallPacketWords - 1);
  std::copy(message.begin(), message.begin() + inline_words, packet.begin() + 1);
  if (absl::Status s = wire.Send(packet.data(), kCallPacketWords); !s.ok()) return s;
  if (inline_words == length) return absl::OkStatus();
  return wire.Send(message.data() + inline_words, length - inline_words);
}

std::vector<int64_t> PrefillCall(int64_t state_id, const int32_t* tokens, int64_t n) {
  std::vector<int64_t> call = {kCallPrefill, state_id, n};
  call.insert(call.end(), tokens, tokens + n);
  return call;
}

std::vector<int64_t> StepCall(const std::vector<int64_t>& state_ids, const int32_t* tokens) {
  const int64_t rows = static_cast<int64_t>(state_ids.size());
  std::vector<int64_t> call = {kCallStep, rows};
  call.insert(call.end(), state_ids.begin(), state_ids.end());
  call.insert(call.end(), tokens, tokens + rows);
  return call;
}

std::vector<int64_t> ScoreCall(const int32_t* tokens, int64_t n) {
  std::vector<int64_t> call = {kCallScore, n};
  call.insert(call.end(), tokens, tokens + n);
  return call;
}

absl::Status RingCalls::SendIfLeading(std::vector<int64_t> words) {
  if (!leading_) return absl::OkStatus();
  last_call_ = absl::Now();
  return SendDecoderCall(*wire_, &dropped_->ids, std::move(words));
}

absl::Status RingCalls::Lead() {
  if (wire_ == nullptr) return absl::OkStatus();
  if (rank_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " Lead: rank ", rank_, " of the ring; rank 0 leads"));
  }
  leading_ = true;
  dropped_->record = true;
  last_call_ = absl::Now();
  return absl::OkStatus();
}

absl::Status RingCalls::KeepAlive(absl::Duration interval) {
  if (wire_ == nullptr) return absl::OkStatus();
  if (!leading_) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " KeepAlive: this rank does not lead"));
  }
  if (absl::Now() - last_call_ < interval) return absl::OkStatus();
  return SendIfLeading({kCallNothing});
}

absl::Status RingCalls::Release() {
  if (wire_ == nullptr) return absl::OkStatus();
  if (!leading_) {
    return absl::FailedPreconditionError(absl::StrCat(name_, " Release: this rank does not lead"));
  }
  absl::Status s = SendIfLeading({kCallRelease});
  leading_ = false;
  dropped_->record = false;
  dropped_->ids.clear();
  return s;
}

absl::StatusOr<DecoderCall> ReceiveDecoderCall(DecoderCallWire& wire) {
  std::vector<int64_t> packet(kCallPacketWords);
  if (absl::Status s = wire.Receive(packet.data(), kCallPacketWords); !s.ok()) return s;
  const int64_t length = packet[0];
  // A call is at most a Step of every state's token or a max_context-long prompt, with its ids:
  // far below this.
  if (length < 2 || length > (int64_t{1} << 32)) {
    return absl::InternalError(
        absl::StrCat("decoder Follow: rank 0 sent a call of ", length, " words"));
  }
  std::vector<int64_t> words(static_cast<size_t>(length));
  const int64_t inline_words = std::min<int64_t>(length, kCallPacketWords - 1);
  std::copy(packet.begin() + 1, packet.begin() + 1 + inline_words, words.begin());
  if (inline_words < length) {
    if (absl::Status s = wire.Receive(words.data() + inline_words, length - inline_words);
        !s.ok()) {
      return s;
    }
  }
  DecoderCall call;
  call.op = words[0];
  const int64_t dropped = words[1];
  if (dropped < 0 || 2 + dropped > length) {
    return absl::InternalError(absl::StrCat("decoder Follow: rank 0's call drops ", dropped,
                                            " states in ", length, " words"));
  }
  call.dropped.assign(words.begin() + 2, words.begin() + 2 + dropped);
  call.args.assign(words.begin() + 2 + dropped, words.end());
  return call;
}

}  // namespace model
}  // namespace dattn
