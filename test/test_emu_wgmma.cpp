// The CPU emulation of sm_90a warpgroup MMA (dev/emu/emu.h "wgmma", the wrappers of
// dev/cuda/wgmma.cuh). A warpgroup kernel writes random bf16 matrices A [64 x K] and B [K x N]
// into dynamic shared memory at byte offsets this test computes from the PTX ISA's description of
// each operand layout (core matrices of 8 rows x 16 bytes, the strides LBO / SBO, swizzle atoms of
// 8 rows whose 16-byte chunks are permuted by XOR with the row), points matrix descriptors at
// them, runs K/16 chained wgmma and stores the accumulators through the documented fragment
// layout; the result must equal a double GEMM within fp32 summation error. Every major-ness and
// swizzle mode, A from shared memory and from registers, N from 8 to 256; then the layout the
// wgmma attention kernel writes (wgmma::sw128_offset with desc_kmajor / desc_mnmajor); the
// asynchrony the emulation models (accumulators undefined until the wait, groups, shared operands
// read at completion); and the launches it refuses.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/dev_cuda/wgmma.cuh"
#include "cpu/rng.h"
#include "dev/emu/emu.h"
#include "test/helpers.h"

using namespace ldm::gpu;

namespace {

// One operand of a test GEMM: its element byte offsets in shared memory and its descriptors.
struct Operand {
    std::vector<uint32_t> off;   // [mn][k] byte offset from the start of dynamic shared memory
    std::vector<uint64_t> desc;  // one per 16-wide K step
    bool mn_major = false;
};

// Bytes of a 16-byte chunk row in each swizzle mode (the width of an atom's rows).
int row_bytes(int swz) { return swz == 1 ? 128 : swz == 2 ? 64 : swz == 3 ? 32 : 16; }

// Lays out an operand of MN x K bf16 elements at byte `base` (1024-aligned) in the canonical
// layout of (mn_major, swizzle), written from the PTX ISA's prose rather than its formulas:
// no swizzle: core matrices of 8 rows x 16 bytes (a row = 8 contiguous elements along K for
// K-major, along MN for MN-major), K-adjacent core matrices LBO apart and MN-adjacent ones SBO
// apart (given with padding here, so wrong strides show); swizzled: atoms of 8 rows x W bytes
// (W = 32/64/128), a row holding W/2 consecutive elements along K (K-major) or MN (MN-major),
// chunk c of row r stored at chunk c ^ ((r·W / 128) mod (W/16)) — the XOR of address bits 4.. with
// bits 7.. —, atoms along the other dimension SBO = 8W apart, further panels along the row
// dimension one after another.
Operand layout(int MN, int K, bool mn_major, int swz, uint32_t base) {
    Operand op;
    op.mn_major = mn_major;
    op.off.resize((size_t)MN * K);
    if (swz == 0) {
        // K-major: core (i_mn, i_k) at i_mn·SBO + i_k·LBO; MN-major: the same with the core's
        // rows along K. Padded strides (multiples of 16).
        const uint32_t lbo = mn_major ? (uint32_t)(MN / 8) * 128 + 32 : 128;
        const uint32_t sbo = mn_major ? 128 : (uint32_t)(K / 8) * 128 + 48;
        for (int mn = 0; mn < MN; mn++)
            for (int k = 0; k < K; k++) {
                const uint32_t core = (uint32_t)(mn / 8) * sbo + (uint32_t)(k / 8) * lbo;
                const uint32_t in = mn_major ? (uint32_t)(16 * (k % 8) + 2 * (mn % 8)) : (uint32_t)(16 * (mn % 8) + 2 * (k % 8));
                op.off[(size_t)mn * K + k] = base + core + in;
            }
        for (int k0 = 0; k0 < K; k0 += 16)
            op.desc.push_back(wgmma::make_desc(base + (uint32_t)(k0 / 8) * lbo, lbo, sbo, 0));
        return op;
    }
    const int W = row_bytes(swz), E = W / 2, X = W / 16;  // bytes, elements, chunks per row
    const uint32_t sbo = (uint32_t)(8 * W);
    if (!mn_major) {
        // rows = mn, W/2 consecutive k per row; K panels of MN rows one after another
        for (int mn = 0; mn < MN; mn++)
            for (int k = 0; k < K; k++) {
                const int p = k / E, c = (k % E) / 8, r = mn % 8;
                const int pc = c ^ ((r * W / 128) % X);
                op.off[(size_t)mn * K + k] = base + (uint32_t)(p * MN * W + (mn / 8) * (int)sbo + r * W + 16 * pc + 2 * (k % 8));
            }
        for (int k0 = 0; k0 < K; k0 += 16)
            op.desc.push_back(wgmma::make_desc(base + (uint32_t)((k0 / E) * MN * W + (k0 % E) * 2), 16, sbo, swz));
    } else {
        // rows = k, W/2 consecutive mn per row; 8-row K atoms SBO apart; MN panels LBO apart
        const uint32_t lbo = (uint32_t)(K / 8) * sbo;
        for (int mn = 0; mn < MN; mn++)
            for (int k = 0; k < K; k++) {
                const int p = mn / E, c = (mn % E) / 8, r = k % 8;
                const int pc = c ^ ((r * W / 128) % X);
                op.off[(size_t)mn * K + k] = base + (uint32_t)p * lbo + (uint32_t)(k / 8) * sbo + (uint32_t)(r * W + 16 * pc + 2 * (mn % 8));
            }
        for (int k0 = 0; k0 < K; k0 += 16) op.desc.push_back(wgmma::make_desc(base + (uint32_t)(k0 / 8) * sbo, lbo, sbo, swz));
    }
    return op;
}
uint32_t extent(const Operand& op) {
    uint32_t m = 0;
    for (uint32_t o : op.off) m = std::max(m, o + 2);
    return m;
}

uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);  // the test's values are exact in bf16
}

// Random values with 8 significant bits (exact in bf16), in [-2, 2).
std::vector<float> random_bf16(size_t n, uint64_t seed) {
    std::vector<float> v(n);
    const uint64_t s0 = ldm::init_stream(seed, 0);
    for (size_t i = 0; i < n; i++) v[i] = (float)std::ldexp(std::floor(ldm::stream_uniform(s0, i) * 512.0) - 256.0, -7);
    return v;
}

struct Gemm {
    int N, K;
    bool a_regs;
    const uint16_t* A;  // [64][K] values
    const uint16_t* B;  // [K][N]
    const uint32_t* a_off;
    const uint32_t* b_off;
    const uint64_t* a_desc;
    const uint64_t* b_desc;
    int tnsp_a, tnsp_b;
    float* D;  // [64][N]
};

// One warpgroup: writes A and B to shared memory at the given offsets, then D = A·B by K/16
// chained wgmma (A from registers when a_regs: the m16n8k16 A fragments built from A directly).
__global__ void gemm_kernel(Gemm gm) {
    unsigned char* sm = (unsigned char*)::emu::dyn_smem();
    for (int i = threadIdx.x; i < 64 * gm.K; i += blockDim.x)
        if (!gm.a_regs) std::memcpy(sm + gm.a_off[i], &gm.A[i], 2);
    for (int i = threadIdx.x; i < gm.N * gm.K; i += blockDim.x) {
        const int n = i / gm.K, k = i % gm.K;
        std::memcpy(sm + gm.b_off[i], &gm.B[(size_t)k * gm.N + n], 2);
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tg = lane % 4;
    float d[128];
    for (int j = 0; j < 128; j++) d[j] = 12345.f;  // scale-d 0 on the first step must ignore these
    ::emu::wgmma_fence();
    for (int ks = 0; ks < gm.K / 16; ks++) {
        if (gm.a_regs) {
            uint32_t a[4];
            for (int r = 0; r < 4; r++) {
                const int row = 16 * (warp % 4) + gr + ((r & 1) ? 8 : 0), col = 16 * ks + 2 * tg + ((r & 2) ? 8 : 0);
                a[r] = (uint32_t)gm.A[(size_t)row * gm.K + col] | (uint32_t)gm.A[(size_t)row * gm.K + col + 1] << 16;
            }
            ::emu::wgmma_rs(d, gm.N, a, gm.b_desc[ks], ks > 0, gm.tnsp_b);
        } else {
            ::emu::wgmma_ss(d, gm.N, gm.a_desc[ks], gm.b_desc[ks], ks > 0, gm.tnsp_a, gm.tnsp_b);
        }
    }
    ::emu::wgmma_commit();
    ::emu::wgmma_wait(0);
    for (int j = 0; j < gm.N / 2; j++) {
        const int i = j / 4, e = j % 4;
        const int row = 16 * (warp % 4) + gr + 8 * (e / 2), col = 8 * i + 2 * tg + (e % 2);
        gm.D[(size_t)row * gm.N + col] = d[j];
    }
}

// Runs one GEMM configuration and compares with a double GEMM: |D − ref| <= K·2^-24·Σ|a·b| per
// element (bf16 products are exact in fp32; K − 1 roundings of the running sum).
void check_gemm(int N, int K, bool a_regs, bool a_mn, int a_swz, bool b_mn, int b_swz, uint64_t seed) {
    INFO("N=" << N << " K=" << K << " A " << (a_regs ? "regs" : a_mn ? "MN-major" : "K-major") << " swizzle " << a_swz
              << ", B " << (b_mn ? "MN-major" : "K-major") << " swizzle " << b_swz);
    const std::vector<float> Af = random_bf16((size_t)64 * K, seed), Bf = random_bf16((size_t)K * N, seed + 1);
    std::vector<uint16_t> A(Af.size()), B(Bf.size());
    for (size_t i = 0; i < A.size(); i++) A[i] = bf16_bits(Af[i]);
    for (size_t i = 0; i < B.size(); i++) B[i] = bf16_bits(Bf[i]);
    const Operand oa = layout(64, K, a_mn, a_swz, 0);
    const uint32_t b_base = (extent(oa) + 1023u) & ~1023u;
    const Operand ob = layout(N, K, b_mn, b_swz, b_base);
    const size_t smem = extent(ob);
    std::vector<float> D((size_t)64 * N, NAN);
    Gemm gm{N, K, a_regs, A.data(), B.data(), oa.off.data(), ob.off.data(), oa.desc.data(), ob.desc.data(),
            a_mn ? 1 : 0, b_mn ? 1 : 0, D.data()};
    if (smem > 48 * 1024)
        REQUIRE(cudaFuncSetAttribute(gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess);
    emu::launch(dim3(1), dim3(128), smem, nullptr, gemm_kernel, gm);
    int bad = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                ref += (double)Af[(size_t)m * K + k] * Bf[(size_t)k * N + n];
                mag += std::fabs((double)Af[(size_t)m * K + k] * Bf[(size_t)k * N + n]);
            }
            const double got = D[(size_t)m * N + n];
            if (!(std::fabs(got - ref) <= K * std::ldexp(mag, -24) + 1e-30)) {
                if (bad++ < 3) UNSCOPED_INFO("D[" << m << "][" << n << "] = " << got << ", expected " << ref);
            }
        }
    CHECK(bad == 0);
}

// The attention kernel's layout: tiles of R rows x C columns in wgmma::sw128_offset, Q/K as
// K-major operands (desc_kmajor), V as an MN-major B operand (desc_mnmajor, imm-trans-b 1).
struct TileGemm {
    const uint16_t* X;  // [64][C] (A: rows m, columns k)
    const uint16_t* Y;  // K-major B: [N][C] (rows n, columns k); MN-major: [K][N] (rows k, columns n)
    int C, N, mn;       // A columns = K; mn: B is MN-major
    float* D;
};
template <int N>
__global__ void tile_kernel(TileGemm t) {
    unsigned char* sm = (unsigned char*)::emu::dyn_smem();
    const int Kdim = t.C;
    const int yr = t.mn ? Kdim : N, yc = t.mn ? N : Kdim;  // B tile rows x columns
    for (int i = threadIdx.x; i < 64 * t.C; i += blockDim.x) {
        const int r = i / t.C, c = i % t.C;
        std::memcpy(sm + wgmma::sw128_offset(64, r, c / 8) + 2 * (c % 8), &t.X[i], 2);
    }
    const uint32_t yb = (uint32_t)(64 * t.C * 2);
    for (int i = threadIdx.x; i < yr * yc; i += blockDim.x) {
        const int r = i / yc, c = i % yc;
        std::memcpy(sm + yb + wgmma::sw128_offset(yr, r, c / 8) + 2 * (c % 8), &t.Y[i], 2);
    }
    __syncthreads();
    const uint32_t s0 = wgmma::smem_u32(sm);
    float d[N / 2];
    wgmma::fence();
    for (int ks = 0; ks < Kdim / 16; ks++) {
        const uint64_t da = wgmma::desc_kmajor(s0, 64, 0, 16 * ks);
        if (t.mn) wgmma::mma_ss<N, 0, 1>(d, da, wgmma::desc_mnmajor(s0 + yb, yr, 16 * ks), ks > 0);
        else wgmma::mma_ss<N, 0, 0>(d, da, wgmma::desc_kmajor(s0 + yb, yr, 0, 16 * ks), ks > 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = 0; j < N / 2; j++) {
        const int row = 16 * (warp % 4) + lane / 4 + 8 * ((j % 4) / 2), col = 8 * (j / 4) + 2 * (lane % 4) + (j % 2);
        t.D[(size_t)row * N + col] = d[j];
    }
}

template <int N>
void check_tile(int C, bool mn, uint64_t seed) {
    INFO("tile layout: N=" << N << " K=" << C << (mn ? " B MN-major" : " B K-major"));
    const std::vector<float> Xf = random_bf16((size_t)64 * C, seed), Yf = random_bf16((size_t)N * C, seed + 1);
    std::vector<uint16_t> X(Xf.size()), Y(Yf.size());
    for (size_t i = 0; i < X.size(); i++) X[i] = bf16_bits(Xf[i]);
    for (size_t i = 0; i < Y.size(); i++) Y[i] = bf16_bits(Yf[i]);
    std::vector<float> D((size_t)64 * N, NAN);
    TileGemm t{X.data(), Y.data(), C, N, mn ? 1 : 0, D.data()};
    const size_t smem = (size_t)(64 * C + N * C) * 2;
    REQUIRE(cudaFuncSetAttribute(tile_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess);
    emu::launch(dim3(1), dim3(128), smem, nullptr, tile_kernel<N>, t);
    int bad = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < C; k++) {
                const double y = mn ? Yf[(size_t)k * N + n] : Yf[(size_t)n * C + k];
                ref += (double)Xf[(size_t)m * C + k] * y;
                mag += std::fabs((double)Xf[(size_t)m * C + k] * y);
            }
            if (!(std::fabs(D[(size_t)m * N + n] - ref) <= C * std::ldexp(mag, -24) + 1e-30)) bad++;
        }
    CHECK(bad == 0);
}

// Asynchrony: accumulators read before the wait are NaN; wait_group 1 completes only the older
// of two groups; a shared operand overwritten before the wait is read at completion.
struct AsyncOut {
    float before_wait, after_wait1_g0, after_wait1_g1, after_wait0_g1;
    int pending_after_issue, pending_after_wait1;
};
__global__ void async_kernel(AsyncOut* out) {
    unsigned char* sm = (unsigned char*)::emu::dyn_smem();
    // A = all ones (64 x 16, K-major, no swizzle, cores packed: LBO 128, SBO 256), B0 and B1
    // likewise (N = 8) after it; group 0 reads B0, group 1 B1
    const uint16_t one = bf16_bits(1.0f), two = bf16_bits(2.0f);
    for (int i = threadIdx.x; i < (64 * 16 + 2 * 8 * 16); i += blockDim.x) std::memcpy(sm + 2 * i, &one, 2);
    __syncthreads();
    const uint32_t b0 = 64 * 16 * 2, b1 = b0 + 8 * 16 * 2;
    const uint64_t da = wgmma::make_desc(0, 128, 256, 0), db0 = wgmma::make_desc(b0, 128, 256, 0),
                   db1 = wgmma::make_desc(b1, 128, 256, 0);
    float d0[4] = {0, 0, 0, 0}, d1[4] = {0, 0, 0, 0};
    ::emu::wgmma_fence();
    ::emu::wgmma_ss(d0, 8, da, db0, 0, 0, 0);
    ::emu::wgmma_commit();
    ::emu::wgmma_ss(d1, 8, da, db1, 0, 0, 0);
    ::emu::wgmma_commit();
    const int warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        out->before_wait = d0[0];
        out->pending_after_issue = ::emu::wgmma_pending(warp);
    }
    __syncthreads();
    // B1 becomes all twos before either group completes
    for (int i = threadIdx.x; i < 8 * 16; i += blockDim.x) std::memcpy(sm + b1 + 2 * i, &two, 2);
    __syncthreads();
    ::emu::wgmma_wait(1);
    if (threadIdx.x == 0) {
        out->after_wait1_g0 = d0[0];
        out->after_wait1_g1 = d1[0];
        out->pending_after_wait1 = ::emu::wgmma_pending(warp);
    }
    ::emu::wgmma_wait(0);
    if (threadIdx.x == 0) out->after_wait0_g1 = d1[0];
}

__global__ void bad_block_kernel() {
    float d[4];
    ::emu::wgmma_ss(d, 8, wgmma::make_desc(0, 128, 256, 0), wgmma::make_desc(0, 128, 256, 0), 0, 0, 0);
}
__global__ void bad_desc_kernel(uint64_t da, uint64_t db) {
    float d[4];
    ::emu::wgmma_ss(d, 8, da, db, 0, 0, 0);
    ::emu::wgmma_commit();
    ::emu::wgmma_wait(0);
}

}  // namespace

TEST_CASE("emu wgmma: every operand layout against a double GEMM", "[emu][wgmma]") {
    uint64_t seed = 100;
    for (int swz = 0; swz < 4; swz++)
        for (int a_mn = 0; a_mn < 2; a_mn++)
            for (int b_mn = 0; b_mn < 2; b_mn++) check_gemm(64, 64, false, a_mn, swz, b_mn, swz, seed++);
    // mixed modes, A from registers, other N
    check_gemm(8, 16, false, false, 1, true, 0, seed++);
    check_gemm(24, 32, true, false, 0, false, 2, seed++);
    check_gemm(128, 32, true, false, 0, true, 1, seed++);
    check_gemm(256, 16, false, true, 3, false, 1, seed++);
    check_gemm(136, 48, true, false, 0, true, 3, seed++);
}

TEST_CASE("emu wgmma: the attention kernel's swizzled tiles through wgmma.cuh", "[emu][wgmma]") {
    check_tile<64>(64, false, 1);
    check_tile<64>(128, false, 2);
    check_tile<128>(128, false, 3);
    check_tile<64>(64, true, 4);
    check_tile<128>(64, true, 5);
    check_tile<128>(128, true, 6);
}

TEST_CASE("emu wgmma: accumulators are undefined until the wait; operands are read at completion",
          "[emu][wgmma]") {
    AsyncOut* out = nullptr;
    REQUIRE(cudaMalloc(&out, sizeof(AsyncOut)) == cudaSuccess);
    emu::launch(dim3(1), dim3(128), 64 * 16 * 2 + 2 * 8 * 16 * 2, nullptr, async_kernel, out);
    CHECK(std::isnan(out->before_wait));
    CHECK(out->pending_after_issue == 2);
    CHECK(out->after_wait1_g0 == 16.0f);  // 16 products of 1·1
    CHECK(std::isnan(out->after_wait1_g1));
    CHECK(out->pending_after_wait1 == 1);
    CHECK(out->after_wait0_g1 == 32.0f);  // B1 was overwritten with 2 before its group completed
    cudaFree(out);
}

TEST_CASE("emu wgmma: launches and descriptors the emulation refuses", "[emu][wgmma]") {
    ChildResult r = run_child([] { emu::launch(dim3(1), dim3(96), 4096, nullptr, bad_block_kernel); });
    INFO("child stderr: " << r.err);
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("not a multiple of 128 threads"));
    // a base offset
    r = run_child([] {
        emu::launch(dim3(1), dim3(128), 4096, nullptr, bad_desc_kernel, wgmma::make_desc(0, 128, 256, 0) | (1ull << 49),
                    wgmma::make_desc(0, 128, 256, 0));
    });
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("base offset"));
    // a 128B-swizzled operand starting in row 1 of its pattern
    r = run_child([] {
        emu::launch(dim3(1), dim3(128), 4096, nullptr, bad_desc_kernel, wgmma::make_desc(0, 128, 256, 0),
                    wgmma::make_desc(128, 16, 1024, wgmma::kSwizzle128B));
    });
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("swizzle pattern"));
    // an operand past the end of dynamic shared memory
    r = run_child([] {
        emu::launch(dim3(1), dim3(128), 1024, nullptr, bad_desc_kernel, wgmma::make_desc(0, 128, 256, 0),
                    wgmma::make_desc(0, 128, 256, 0));
    });
    CHECK(r.aborted);
    CHECK_THAT(r.err, Catch::Contains("outside the block's"));
}
