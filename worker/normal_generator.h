// The counter-based standard-normal generator of random_inputs.h, as inline functions that both the
// host compiler and nvcc build: the host fill (random_inputs.cc) and the GPU fill
// (random_inputs_cuda.cu) run this one definition. See random_inputs.h for the algorithm and for
// how far results agree between libm implementations (the GPU's log and cos included).
#ifndef DATTN_WORKER_NORMAL_GENERATOR_H_
#define DATTN_WORKER_NORMAL_GENERATOR_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define DATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DATTN_HOST_DEVICE inline
#endif

namespace dattn {
namespace worker {
namespace normal_generator {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr double kTwoPi = 6.283185307179586476925286766559;
constexpr double kTwoPow53Inv = 1.0 / 9007199254740992.0;  // 2^-53

// splitmix64's finalizer.
DATTN_HOST_DEVICE uint64_t Mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

// The stream key of tensor id `tensor` (q = 0, k = 1, v = 2, dout = 3) under `seed`.
DATTN_HOST_DEVICE uint64_t StreamKey(uint64_t seed, uint32_t tensor) {
  return Mix(seed + kGolden * (static_cast<uint64_t>(tensor) + 1));
}

// Element `index` of the stream `key`: Box-Muller, cosine branch, in double.
DATTN_HOST_DEVICE double NormalFromKey(uint64_t key, uint64_t index) {
  const uint64_t z0 = Mix(key + kGolden * (2 * index + 1));
  const uint64_t z1 = Mix(key + kGolden * (2 * index + 2));
  const double u1 = static_cast<double>((z0 >> 11) + 1) * kTwoPow53Inv;
  const double u2 = static_cast<double>(z1 >> 11) * kTwoPow53Inv;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace normal_generator
}  // namespace worker
}  // namespace dattn

#undef DATTN_HOST_DEVICE

#endif  // DATTN_WORKER_NORMAL_GENERATOR_H_
