// dev/cuda/attention_plain_frags.cuh — a workbench-only fragment loader for the mma attention
// kernels of cuda/attention.cuh: the MMA operand fragments read from shared memory with plain
// 32/16-bit loads (ld_pair / pack_bf16) instead of ldmatrix. Same register contents as
// LdsmFrags, more shared-memory instructions: the mma kernels' loader before ldmatrix, kept so
// dev/cuda/attention.cu can compare the two (measurements: doc/results_gpu.md).
#pragma once
#include "cuda/attention.cuh"

namespace ldm {
namespace gpu {
namespace attn_detail {

// A fragment of rows [row0, row0+16) x columns [col0, col0+16) of a row-major smem tile.
template <int LDS>
__device__ __forceinline__ void frag_a(uint32_t a[4], const bf16* tile, int row0, int col0,
                                       int gr, int tg) {
    const bf16* p = tile + (row0 + gr) * LDS + col0 + 2 * tg;
    a[0] = ld_pair(p);
    a[1] = ld_pair(p + 8 * LDS);
    a[2] = ld_pair(p + 8);
    a[3] = ld_pair(p + 8 * LDS + 8);
}
// B fragment where B[k][n] = tile[n0 + n][k0 + k] (B = tileᵀ: e.g. Kᵀ for Q Kᵀ).
template <int LDS>
__device__ __forceinline__ void frag_b_trans(uint32_t b[2], const bf16* tile, int n0, int k0,
                                             int gr, int tg) {
    const bf16* p = tile + (n0 + gr) * LDS + k0 + 2 * tg;
    b[0] = ld_pair(p);
    b[1] = ld_pair(p + 8);
}
// B fragment where B[k][n] = tile[k0 + k][n0 + n] (B = the tile itself: e.g. V for P V).
template <int LDS>
__device__ __forceinline__ void frag_b(uint32_t b[2], const bf16* tile, int k0, int n0, int gr,
                                       int tg) {
    const bf16* p = tile + (k0 + 2 * tg) * LDS + n0 + gr;
    b[0] = pack_bf16(p[0], p[LDS]);
    b[1] = pack_bf16(p[8 * LDS], p[9 * LDS]);
}

// The loader interface of the mma kernels (see LdsmFrags in cuda/attention.cuh).
struct PlainFrags {
    template <int LDS>
    __device__ __forceinline__ static void a(uint32_t a[4], const bf16* tile, int row0, int col0, int lane) {
        frag_a<LDS>(a, tile, row0, col0, lane >> 2, lane & 3);
    }
    template <int LDS>
    __device__ __forceinline__ static void b_trans2(uint32_t b0[2], uint32_t b1[2], const bf16* tile, int n0,
                                                    int k0, int lane) {
        frag_b_trans<LDS>(b0, tile, n0, k0, lane >> 2, lane & 3);
        frag_b_trans<LDS>(b1, tile, n0 + 8, k0, lane >> 2, lane & 3);
    }
    template <int LDS>
    __device__ __forceinline__ static void b2(uint32_t b0[2], uint32_t b1[2], const bf16* tile, int k0, int n0,
                                              int lane) {
        frag_b<LDS>(b0, tile, k0, n0, lane >> 2, lane & 3);
        frag_b<LDS>(b1, tile, k0, n0 + 8, lane >> 2, lane & 3);
    }
};

}  // namespace attn_detail
using attn_detail::PlainFrags;
}  // namespace gpu
}  // namespace ldm
