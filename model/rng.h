// Deterministic pseudo-random numbers for sampling data and building tasks.
//
// The same seed gives the same numbers on every machine, compiler and standard library: nothing
// here uses std:: engines or distributions (std::uniform_int_distribution's output differs between
// libstdc++ and libc++, and may change between versions). The algorithms are published and short,
// so a Python or CUDA re-implementation can reproduce a sample exactly:
//   Mix64     SplitMix64's output function (Steele, Lea, Flood 2014): a bijection on 64 bits.
//   Rng       xoshiro256** 1.0 (Blackman, Vigna 2018), seeded by four SplitMix64 outputs.
//   Below(n)  Lemire's multiply-shift with rejection (2019): exactly uniform on [0, n).
//
// Threads: the free functions are pure. An Rng is a value with no shared state; one thread at a
// time uses a given Rng.
#ifndef DATTN_MODEL_RNG_H_
#define DATTN_MODEL_RNG_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dattn {
namespace model {

// SplitMix64's finalizer: x + golden gamma, then two xor-shift-multiplies. Bijective, so distinct
// inputs give distinct outputs; consecutive inputs give unrelated outputs.
uint64_t Mix64(uint64_t x);

// A hash of the pair (a, b) built from Mix64, used to derive independent streams from a seed:
// e.g. HashPair(seed, epoch). Not commutative.
uint64_t HashPair(uint64_t a, uint64_t b);

class Rng {
 public:
  // The state is four consecutive SplitMix64 outputs starting from `seed` (never all zero).
  explicit Rng(uint64_t seed);

  // The next 64 random bits.
  uint64_t Next();
  // Uniform on [0, n); n == 0 returns 0 (there is nothing to choose).
  uint64_t Below(uint64_t n);
  // Uniform on [0, 1), the top 53 bits of Next() over 2^53.
  double Uniform();

  // The whole state: saving it and calling FromState later continues the same sequence.
  std::array<uint64_t, 4> state() const { return s_; }
  // INVALID_ARGUMENT for the all-zero state (xoshiro's one forbidden state, which no seed yields).
  static absl::StatusOr<Rng> FromState(const std::array<uint64_t, 4>& state);

 private:
  Rng() = default;
  std::array<uint64_t, 4> s_{};
};

// A 64-bit value as 16 lower-case hexadecimal digits, and back. Seeds and RNG states are stored
// this way in JSON files, because many JSON readers hold numbers as doubles (exact only to 2^53).
std::string U64ToHex(uint64_t value);
// INVALID_ARGUMENT naming the text unless it is 1 to 16 hexadecimal digits (no prefix, no sign).
absl::StatusOr<uint64_t> HexToU64(absl::string_view text);

}  // namespace model
}  // namespace dattn

#endif  // DATTN_MODEL_RNG_H_
