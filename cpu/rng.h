// cpu/rng.h — the project's deterministic initialisation RNG (doc/cpu_reference.md "Init").
//
// splitmix64 is counter-based: with stream start s0, the n-th output (n = 1, 2, ...) is
// mix(s0 + n * 0x9E3779B97F4A7C15). Normal number k of a stream (k = 0, 1, ...) comes from pair
// m = k / 2 by Box-Muller over the outputs n = 2m+1 and n = 2m+2:
//   u1 = ((out_{2m+1} >> 11) + 1) * 2^-53   in (0, 1]
//   u2 = (out_{2m+2} >> 11) * 2^-53         in [0, 1)
//   r = sqrt(-2 ln u1);  z_{2m} = r cos(2 pi u2),  z_{2m+1} = r sin(2 pi u2)
// all in double. Tensor i of param_specs uses the stream s0 = mix(seed + (i + 1) * 0xD1B54A32D192ED03).
// Any element can be computed independently (the GPU can initialise in parallel).
#pragma once
#include <cmath>
#include <cstdint>

#include "math/elementwise.h"

namespace ldm {

LDM_HD inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// n-th output (n >= 1) of the splitmix64 stream starting at state s0.
LDM_HD inline uint64_t splitmix64_at(uint64_t s0, uint64_t n) {
    return splitmix64_mix(s0 + n * 0x9E3779B97F4A7C15ULL);
}

// Start state of the stream for tensor `index` under `seed`.
LDM_HD inline uint64_t init_stream(uint64_t seed, uint64_t index) {
    return splitmix64_mix(seed + (index + 1) * 0xD1B54A32D192ED03ULL);
}

// k-th standard normal of the stream s0 (Box-Muller as documented above).
LDM_HD inline double stream_normal(uint64_t s0, uint64_t k) {
    uint64_t m = k >> 1;
    double u1 = (double)((splitmix64_at(s0, 2 * m + 1) >> 11) + 1) * 0x1.0p-53;
    double u2 = (double)(splitmix64_at(s0, 2 * m + 2) >> 11) * 0x1.0p-53;
    double r = sqrt(-2.0 * log(u1));
    double a = 6.283185307179586476925286766559 * u2;
    return (k & 1) ? r * sin(a) : r * cos(a);
}

// Uniform double in [0, 1) from the k-th output of stream s0 (k >= 0); for tests and sampling.
LDM_HD inline double stream_uniform(uint64_t s0, uint64_t k) {
    return (double)(splitmix64_at(s0, k + 1) >> 11) * 0x1.0p-53;
}

}  // namespace ldm
