#include "model/rng.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dattn {
namespace model {
namespace {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

uint64_t Mix64(uint64_t x) {
  uint64_t z = x + kGoldenGamma;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t HashPair(uint64_t a, uint64_t b) { return Mix64(Mix64(a) ^ Rotl(b, 17) ^ kGoldenGamma); }

Rng::Rng(uint64_t seed) {
  // SplitMix64 as a generator: state += gamma, output = finalizer(state). Mix64 adds the gamma.
  uint64_t x = seed;
  for (uint64_t& word : s_) {
    word = Mix64(x);
    x += kGoldenGamma;
  }
}

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

uint64_t Rng::Below(uint64_t n) {
  if (n == 0) return 0;
  unsigned __int128 product = static_cast<unsigned __int128>(Next()) * n;
  uint64_t low = static_cast<uint64_t>(product);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (low < threshold) {
      product = static_cast<unsigned __int128>(Next()) * n;
      low = static_cast<uint64_t>(product);
    }
  }
  return static_cast<uint64_t>(product >> 64);
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

absl::StatusOr<Rng> Rng::FromState(const std::array<uint64_t, 4>& state) {
  if (state[0] == 0 && state[1] == 0 && state[2] == 0 && state[3] == 0) {
    return absl::InvalidArgumentError("RNG state: all four words are zero (not a xoshiro state)");
  }
  Rng rng;
  rng.s_ = state;
  return rng;
}

std::string U64ToHex(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i) {
    text[i] = kDigits[value & 15];
    value >>= 4;
  }
  return text;
}

absl::StatusOr<uint64_t> HexToU64(absl::string_view text) {
  if (text.empty() || text.size() > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a 64-bit hexadecimal value (1 to 16 digits)"));
  }
  uint64_t value = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\" is not a 64-bit hexadecimal value (bad digit '",
                       absl::string_view(&c, 1), "')"));
    }
    value = (value << 4) | static_cast<uint64_t>(digit);
  }
  return value;
}

}  // namespace model
}  // namespace dattn
