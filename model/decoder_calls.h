// A ring of decoders driven by rank 0 alone (Decoder::Lead and Follow, model/decoder.h): the calls
// rank 0 sends and what a follower does with them, shared by the CPU decoder (model/decoder.h, a
// Gloo ring on host memory) and the GPU decoder (model/cuda/cuda_decoder.h, an NCCL ring), which
// differ only in how words travel (DecoderCallWire).
//
// A call is int64 words: [op, d, d dropped state ids, arguments...]. The leader sends one packet of
// kCallPacketWords (the call's length, then its first words) to every follower and, when the call
// is longer, the rest in a second transfer: a step of a few sequences is one round trip. The ops:
//   kCallNothing  a keep-alive (no arguments);
//   kCallRelease  the follower's Follow returns OK;
//   kCallPrefill  state id, n, n tokens;
//   kCallStep     rows, rows state ids, rows tokens;
//   kCallScore    n, n tokens.
// A follower keeps a state for each of rank 0's live state ids (made at its first use, dropped
// with the next call after rank 0's state is destroyed) and makes the same call on its decoder
// with its own states: the collective part of every call then runs on every rank.
//
// Errors: the wire's (the communicator's: a dead peer, DEADLINE_EXCEEDED after its timeout); a
// malformed call (a length or a count that does not fit) is INTERNAL naming it; a follower's call
// that fails returns its error, prefixed with the rank and the op.
// Thread-safety: a wire and the functions using it, one thread at a time.
#ifndef DATTN_MODEL_DECODER_CALLS_H_
#define DATTN_MODEL_DECODER_CALLS_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/comm/communicator.h"

namespace dattn {
namespace model {

inline constexpr int64_t kCallNothing = 1;
inline constexpr int64_t kCallRelease = 2;
inline constexpr int64_t kCallPrefill = 3;
inline constexpr int64_t kCallStep = 4;
inline constexpr int64_t kCallScore = 5;
// A call's first packet: its length, then up to kCallPacketWords - 1 of its words.
inline constexpr int64_t kCallPacketWords = 64;

// How a call's words travel between rank 0 and the other ranks.
class DecoderCallWire {
 public:
  virtual ~DecoderCallWire() = default;
  // From rank 0: words[0, count) to every other rank, returning once they may be reused.
  virtual absl::Status Send(const int64_t* words, int64_t count) = 0;
  // On another rank: count words from rank 0, waiting at most the communicator's timeout.
  virtual absl::Status Receive(int64_t* words, int64_t count) = 0;
};

// The wire of a communicator on host memory (Gloo): point-to-point transfers of the words.
// INVALID_ARGUMENT for a null communicator or one on device memory.
absl::StatusOr<std::unique_ptr<DecoderCallWire>> NewHostCallWire(comm::Communicator* ring);

// The leader's side: sends [op, the ids in *dropped (then cleared), arguments] (`words` is the op
// and its arguments).
absl::Status SendDecoderCall(DecoderCallWire& wire, std::vector<int64_t>* dropped,
                             std::vector<int64_t> words);

// The words of each call (the op and its arguments), as a leader sends them.
std::vector<int64_t> PrefillCall(int64_t state_id, const int32_t* tokens, int64_t n);
std::vector<int64_t> StepCall(const std::vector<int64_t>& state_ids, const int32_t* tokens);
std::vector<int64_t> ScoreCall(const int32_t* tokens, int64_t n);

// A call as a follower receives it.
struct DecoderCall {
  int64_t op = 0;
  std::vector<int64_t> dropped;
  std::vector<int64_t> args;
};
absl::StatusOr<DecoderCall> ReceiveDecoderCall(DecoderCallWire& wire);

// The ids of the states a leading decoder's sequences dropped since its last call to the followers:
// shared by the decoder and its states, so that a state may outlive its decoder. A state records
// its id here when it is destroyed while `record` is set.
struct DroppedStates {
  bool record = false;  // Only a leading decoder records.
  std::vector<int64_t> ids;
};

// A decoder's side of the calls, the same for both decoders: its states' ids, and its Lead,
// KeepAlive, Release (rank 0) and Follow (the others) as decoder.h states them. Without a wire
// (one device) Lead, KeepAlive and Release do nothing and Follow is FAILED_PRECONDITION; `name`
// ("decoder", "GPU decoder") names the decoder in errors. One thread at a time.
class RingCalls {
 public:
  RingCalls(std::unique_ptr<DecoderCallWire> wire, int rank, const char* name)
      : wire_(std::move(wire)), rank_(rank), name_(name) {}

  // A new state's id (1, 2, ...: the same on every rank of a ring that makes the same calls) and
  // the list its destruction joins while leading.
  int64_t NewStateId() const { return next_id_++; }
  const std::shared_ptr<DroppedStates>& dropped() const { return dropped_; }

  bool leading() const { return leading_; }
  // While leading, sends `words` (one of the *Call functions') to the followers; else nothing.
  absl::Status SendIfLeading(std::vector<int64_t> words);
  absl::Status Lead();
  absl::Status KeepAlive(absl::Duration interval);
  absl::Status Release();
  // FollowDecoderCalls on `decoder` (below), counting the states it holds.
  template <typename D>
  absl::Status Follow(D& decoder);
  int64_t follower_states() const { return follower_states_; }

 private:
  const std::unique_ptr<DecoderCallWire> wire_;  // Null: one device.
  const int rank_;
  const char* const name_;
  mutable int64_t next_id_ = 1;
  const std::shared_ptr<DroppedStates> dropped_ = std::make_shared<DroppedStates>();
  bool leading_ = false;
  int64_t follower_states_ = 0;
  absl::Time last_call_ = absl::InfinitePast();  // When the leader last sent a call.
};

// A follower's loop (Decoder::Follow): receives rank 0's calls and makes them on `decoder` with
// its own states until a release (OK) or an error. D is a decoder with State, Logit, config(),
// NewState(), Prefill(tokens, n, State*, Logit*), Step(Span<State* const>, tokens, Logit*) and
// Score(tokens, n, double*), which must not lead. *states_held (optional) is the number of states
// the follower holds after each call.
template <typename D>
absl::Status FollowDecoderCalls(D& decoder, DecoderCallWire& wire, int rank, int64_t* states_held) {
  using State = typename D::State;
  using Logit = typename D::Logit;
  std::map<int64_t, State> states;  // Rank 0's state ids -> this rank's states.
  auto state_of = [&](int64_t id) -> absl::StatusOr<State*> {
    auto it = states.find(id);
    if (it == states.end()) {
      absl::StatusOr<State> made = decoder.NewState();
      if (!made.ok()) return made.status();
      it = states.emplace(id, *std::move(made)).first;
    }
    return &it->second;
  };
  const int64_t vocab = decoder.config().vocab_size;
  std::vector<Logit> logits;
  std::vector<double> logprobs;
  std::vector<int32_t> tokens;
  while (true) {
    absl::StatusOr<DecoderCall> call = ReceiveDecoderCall(wire);
    if (!call.ok()) return call.status();
    for (int64_t id : call->dropped) states.erase(id);
    if (states_held != nullptr) *states_held = static_cast<int64_t>(states.size());
    const int64_t op = call->op;
    const std::vector<int64_t>& args = call->args;
    const int64_t argc = static_cast<int64_t>(args.size());
    auto take_tokens = [&](int64_t from, int64_t n) -> absl::Status {
      if (n < 0 || from + n > argc) {
        return absl::InternalError(absl::StrCat("decoder Follow: rank 0's call of op ", op,
                                                " holds ", argc, " words, not ", from + n));
      }
      tokens.assign(args.begin() + from, args.begin() + from + n);
      return absl::OkStatus();
    };
    absl::Status s;
    if (op == kCallNothing) {
      continue;
    } else if (op == kCallRelease) {
      return absl::OkStatus();
    } else if (op == kCallPrefill && argc >= 2) {
      if (absl::Status t = take_tokens(2, args[1]); !t.ok()) return t;
      absl::StatusOr<State*> state = state_of(args[0]);
      if (!state.ok()) return state.status();
      logits.resize(static_cast<size_t>(vocab));
      s = decoder.Prefill(tokens.data(), args[1], *state, logits.data());
    } else if (op == kCallStep && argc >= 1) {
      const int64_t rows = args[0];
      if (absl::Status t = take_tokens(1 + rows, rows); !t.ok()) return t;
      std::vector<State*> step;
      for (int64_t j = 0; j < rows; ++j) {
        absl::StatusOr<State*> state = state_of(args[static_cast<size_t>(1 + j)]);
        if (!state.ok()) return state.status();
        step.push_back(*state);
      }
      logits.resize(static_cast<size_t>(rows * vocab));
      s = decoder.Step(step, tokens.data(), logits.data());
    } else if (op == kCallScore && argc >= 1) {
      if (absl::Status t = take_tokens(1, args[0]); !t.ok()) return t;
      logprobs.resize(static_cast<size_t>(std::max<int64_t>(args[0] - 1, 1)));
      s = decoder.Score(tokens.data(), args[0], logprobs.data());
    } else {
      return absl::InternalError(
          absl::StrCat("decoder Follow: rank 0 sent op ", op, " with ", argc, " arguments"));
    }
    if (states_held != nullptr) *states_held = static_cast<int64_t>(states.size());
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("decoder Follow, rank ", rank, ", following rank 0's call (op ",
                                 op, "): ", s.message()));
    }
  }
}

template <typename D>
absl::Status RingCalls::Follow(D& decoder) {
  if (wire_ == nullptr || rank_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, " Follow: only ranks 1.. of a ring follow (rank 0 leads)"));
  }
  return FollowDecoderCalls(decoder, *wire_, rank_, &follower_states_);
}

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_DECODER_CALLS_H_
