// CPU emulation test of the attention kernels of cuda/attention.cuh (dev/emu; doc/cuda.md
// "Emulating kernels on the CPU"), through the dev/cuda/attention.cu workbench's kernel_forward /
// kernel_backward (row-dot, then dK/dV and dQ): the scalar kernels (fp32 and bf16, one warp per
// row), the mma kernels (bf16 mma.sync m16n8k16 with ldmatrix fragments, production), the
// workbench's mma-plain variant (plain shared-memory fragment loads), mma-dqfull variant (dQ over
// whole key tiles; both bitwise equal to mma) and mma-pipe variant
// (dev/cuda/attention_pipelined.cuh: cp.async pipelines) and wgmma forward and backward
// (dev/cuda/attention_wgmma.cuh), with mma.sync, ldmatrix and wgmma emulated as warp collectives
// per the PTX ISA fragment and descriptor tables and cp.async completing only at its wait,
// against cpu/ops.h attention in double (out, lse, dqkv). Outputs are poisoned with NaN; each case
// runs under the three scheduling orders and must give bit-identical results. Also: the
// emulator's cp.async semantics, that the pipelined kernels fail when a wait is too shallow, the
// scalar kernels' 32-bit row split and the shape checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/dev_cuda/attention.cu.h"
#include "test/emu_workbench_cases.h"
#include "cpu/ops.h"
#include "cpu/rng.h"

using namespace ldm;
using namespace ldm::gpu;

namespace {

template <typename T>
std::vector<T> rnd(int64_t n, uint64_t seed) {
    std::vector<T> v((size_t)n);
    const uint64_t s0 = init_stream(seed, 0);
    for (int64_t i = 0; i < n; i++) v[(size_t)i] = from_f<T>((float)stream_normal(s0, (uint64_t)i));
    return v;
}
template <typename T>
std::vector<float> tof(const std::vector<T>& v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = to_f(v[i]);
    return o;
}
template <typename T>
std::vector<uint16_t> raw_bits(const std::vector<T>& v) {
    std::vector<uint16_t> o(v.size() * sizeof(T) / 2);
    std::memcpy(o.data(), v.data(), o.size() * 2);
    return o;
}

void report(const std::string& ctx, const char* what, const std::vector<float>& got, const std::vector<float>& ref,
            double tol) {
    const Compare c = compare(got.data(), ref.data(), (int64_t)got.size());
    INFO(ctx << " " << what << ": rel " << c.rel << " max_abs " << c.max_abs);
    CHECK(c.finite);
    CHECK(c.rel <= tol);
}

// Runs `variant` forward and backward on random inputs from `seed`, checks it against the double
// reference and across the three scheduling orders; returns the raw bits of out, dqkv and lse
// (empty when wait_slack > 0: the run that must fail).
template <typename T>
std::vector<uint16_t> run(const Shape& sh, Kernel variant, uint64_t seed, int wait_slack = 0) {
    const int64_t N = sh.N(), C3 = sh.C3(), qd = (int64_t)sh.nh * sh.hd, kvd = (int64_t)sh.nkv * sh.hd;
    const auto qkv = rnd<T>(N * C3, seed);
    const auto dout = rnd<T>(N * qd, seed + 1);
    const auto qkvf = tof(qkv), doutf = tof(dout);
    // reference (double) on the values the kernels see
    std::vector<double> q((size_t)(N * qd)), k((size_t)(N * kvd)), v((size_t)(N * kvd));
    for (int64_t n = 0; n < N; n++) {
        for (int64_t c = 0; c < qd; c++) q[(size_t)(n * qd + c)] = qkvf[(size_t)(n * C3 + c)];
        for (int64_t c = 0; c < kvd; c++) {
            k[(size_t)(n * kvd + c)] = qkvf[(size_t)(n * C3 + qd + c)];
            v[(size_t)(n * kvd + c)] = qkvf[(size_t)(n * C3 + qd + kvd + c)];
        }
    }
    std::vector<double> out(q.size()), att((size_t)sh.B * sh.nh * sh.T * sh.T), dq(q.size()), dk(k.size()),
        dv(v.size()), dO(doutf.begin(), doutf.end());
    cpu::attention_forward<double>(out.data(), att.data(), q.data(), k.data(), v.data(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd);
    cpu::attention_backward<double>(dq.data(), dk.data(), dv.data(), dO.data(), att.data(), q.data(), k.data(),
                                    v.data(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd);
    std::vector<float> ref_out(out.begin(), out.end()), ref_d((size_t)(N * C3)), ref_lse((size_t)sh.B * sh.nh * sh.T);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t c = 0; c < qd; c++) ref_d[(size_t)(n * C3 + c)] = (float)dq[(size_t)(n * qd + c)];
        for (int64_t c = 0; c < kvd; c++) {
            ref_d[(size_t)(n * C3 + qd + c)] = (float)dk[(size_t)(n * kvd + c)];
            ref_d[(size_t)(n * C3 + qd + kvd + c)] = (float)dv[(size_t)(n * kvd + c)];
        }
    }
    const double scale = 1 / std::sqrt((double)sh.hd);
    const int G = sh.nh / sh.nkv;
    for (int b = 0; b < sh.B; b++)
        for (int h = 0; h < sh.nh; h++)
            for (int t = 0; t < sh.T; t++) {
                std::vector<double> s((size_t)t + 1);
                double mx = -1e300;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int e = 0; e < sh.hd; e++)
                        d += q[(size_t)((b * sh.T + t) * qd + h * sh.hd + e)] *
                             k[(size_t)((b * sh.T + j) * kvd + (h / G) * sh.hd + e)];
                    s[(size_t)j] = d * scale;
                    mx = std::max(mx, s[(size_t)j]);
                }
                double sum = 0;
                for (int j = 0; j <= t; j++) sum += std::exp(s[(size_t)j] - mx);
                ref_lse[((size_t)b * sh.nh + h) * sh.T + t] = (float)(mx + std::log(sum));
            }
    const std::string ctx = strprintf("attention %s %s B=%d T=%d nh=%d nkv=%d hd=%d", kernel_name(variant), dtype_name<T>(), sh.B,
                                      sh.T, sh.nh, sh.nkv, sh.hd);
    if (wait_slack > 0) {
        // Every cp.async wait one group too shallow: the forward must read poisoned stages, and so
        // must the backward given the correct forward outputs.
        std::vector<T> o((size_t)(N * qd), from_f<T>(NAN)), dqkv((size_t)(N * C3), from_f<T>(NAN));
        std::vector<float> lse(ref_lse.size(), NAN), scr(ref_lse.size(), NAN);
        emu::set_cp_async_wait_slack(wait_slack);
        kernel_forward<T>(variant, o.data(), lse.data(), qkv.data(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd, 0);
        emu::set_cp_async_wait_slack(0);
        INFO(ctx << ": forward with cp.async waits one group short");
        CHECK_FALSE(compare(tof(o).data(), ref_out.data(), (int64_t)o.size()).finite);
        kernel_forward<T>(variant, o.data(), lse.data(), qkv.data(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd, 0);
        REQUIRE(compare(tof(o).data(), ref_out.data(), (int64_t)o.size()).finite);
        emu::set_cp_async_wait_slack(wait_slack);
        kernel_backward<T>(variant, dqkv.data(), scr.data(), dout.data(), o.data(), lse.data(), qkv.data(), sh.B,
                           sh.T, sh.nh, sh.nkv, sh.hd, 0);
        emu::set_cp_async_wait_slack(0);
        INFO(ctx << ": backward with cp.async waits one group short");
        CHECK_FALSE(compare(tof(dqkv).data(), ref_d.data(), (int64_t)dqkv.size()).finite);
        return {};
    }
    std::vector<uint16_t> first;
    const emu::Order orders[3] = {emu::Order::kForward, emu::Order::kReverse, emu::Order::kRandom};
    for (int oi = 0; oi < 3; oi++) {
        emu::set_order(orders[oi], 99 + oi);
        std::vector<T> o((size_t)(N * qd), from_f<T>(NAN)), dqkv((size_t)(N * C3), from_f<T>(NAN));
        std::vector<float> lse(ref_lse.size(), NAN), scr(ref_lse.size(), NAN);
        kernel_forward<T>(variant, o.data(), lse.data(), qkv.data(), sh.B, sh.T, sh.nh, sh.nkv, sh.hd, 0);
        kernel_backward<T>(variant, dqkv.data(), scr.data(), dout.data(), o.data(), lse.data(), qkv.data(), sh.B,
                           sh.T, sh.nh, sh.nkv, sh.hd, 0);
        std::vector<uint16_t> all = raw_bits(o);
        for (auto x : raw_bits(dqkv)) all.push_back(x);
        for (auto x : raw_bits(lse)) all.push_back(x);
        if (oi == 0) {
            const bool f32 = std::is_same<T, float>::value;
            const double tol = f32 ? 1e-4 : 2e-2;
            report(ctx, "out", tof(o), ref_out, tol);
            report(ctx, "lse", lse, ref_lse, f32 ? 1e-5 : 1e-4);
            report(ctx, "dqkv", tof(dqkv), ref_d, tol);
            first = std::move(all);
        } else {
            INFO(ctx << ": results differ between scheduling orders forward and " << emu::order_name(orders[oi]));
            CHECK(all == first);
        }
    }
    emu::set_order(emu::Order::kForward);
    return first;
}

// One warp; each lane copies 16 bytes of `in` into each of three groups (the third zero-filled),
// then waits as `mode` says, and writes what it sees of its own three chunks (mode 4: of the next
// lane's first chunk, after its own full wait but without a barrier) to out[12 lane ...].
void cp_async_probe(float* out, const float* in, int mode) {
    float* sm = reinterpret_cast<float*>(::emu::dyn_smem());
    const int t = threadIdx.x;
    cp_async_16(sm + 4 * t, in + 4 * t, true);
    cp_async_commit();
    cp_async_16(sm + 128 + 4 * t, in + 128 + 4 * t, true);
    cp_async_commit();
    cp_async_16(sm + 256 + 4 * t, in, false);
    cp_async_commit();
    if (mode == 1) cp_async_wait<2>();
    if (mode == 2 || mode == 4) cp_async_wait<0>();
    if (mode == 3) cp_async_wait_all();
    out[12 * 32 + t] = (float)::emu::cp_async_pending();
    if (mode == 4) {
        for (int i = 0; i < 4; i++) out[12 * t + i] = sm[4 * ((t + 1) % 32) + i];
        return;
    }
    __syncthreads();
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 4; i++) out[12 * t + 4 * c + i] = sm[128 * c + 4 * t + i];
}

}  // namespace

TEST_CASE("emu: cp.async lands only at its wait (commit groups, wait_group N, wait_all, zero-fill)",
          "[emu][attention]") {
    std::vector<float> in(256);
    for (int i = 0; i < 256; i++) in[(size_t)i] = 1.f + (float)i;
    auto probe = [&](int mode) {
        std::vector<float> out(12 * 32 + 32, -7.f);
        ::emu::launch(dim3(1), dim3(32), 384 * sizeof(float), 0, cp_async_probe, out.data(), in.data(), mode);
        return out;
    };
    auto chunk_is = [&](const std::vector<float>& out, int t, int c, int what) {  // what: 0 data, 1 zero, 2 NaN
        for (int i = 0; i < 4; i++) {
            const float v = out[(size_t)(12 * t + 4 * c + i)];
            if (what == 0 && v != in[(size_t)(128 * c + 4 * t + i)]) return false;
            if (what == 1 && v != 0.f) return false;
            if (what == 2 && !std::isnan(v)) return false;
        }
        return true;
    };
    emu::set_order(emu::Order::kForward);
    const auto none = probe(0), first = probe(1), all = probe(2), wall = probe(3);
    for (int t = 0; t < 32; t++) {
        INFO("lane " << t);
        CHECK(chunk_is(none, t, 0, 2));  // no wait: everything still poisoned
        CHECK(chunk_is(none, t, 1, 2));
        CHECK(chunk_is(none, t, 2, 2));
        CHECK(none[12 * 32 + t] == 3.f);
        CHECK(chunk_is(first, t, 0, 0));  // wait_group 2: the oldest group only
        CHECK(chunk_is(first, t, 1, 2));
        CHECK(chunk_is(first, t, 2, 2));
        CHECK(first[12 * 32 + t] == 2.f);
        for (const auto* o : {&all, &wall}) {  // wait_group 0 / wait_all: all, zero-fill as zeros
            CHECK(chunk_is(*o, t, 0, 0));
            CHECK(chunk_is(*o, t, 1, 0));
            CHECK(chunk_is(*o, t, 2, 1));
            CHECK((*o)[12 * 32 + t] == 0.f);
        }
    }
#if !EMU_TSAN  // a read of another lane's copy without a barrier is a data race under ThreadSanitizer
    // Fault injection: wait_group 0 with slack 1 leaves the newest group pending.
    emu::set_cp_async_wait_slack(1);
    const auto shallow = probe(2);
    emu::set_cp_async_wait_slack(0);
    for (int t = 0; t < 32; t++) {
        CHECK(chunk_is(shallow, t, 0, 0));
        CHECK(chunk_is(shallow, t, 1, 0));
        CHECK(chunk_is(shallow, t, 2, 2));
    }
    // Another lane's copies are visible only once that lane has waited: without a barrier, in
    // forward order lane t runs to its end before lane t+1 waits, so it reads poison.
    const auto nobar = probe(4);
    for (int t = 0; t < 31; t++) {
        INFO("lane " << t << " reads lane " << t + 1 << " without a barrier");
        for (int i = 0; i < 4; i++) CHECK(std::isnan(nobar[(size_t)(12 * t + i)]));
    }
    for (int i = 0; i < 4; i++) CHECK(nobar[(size_t)(12 * 31 + i)] == in[(size_t)i]);  // lane 0 already waited
#endif
}

TEST_CASE("emu: attention mma-pipe (cp.async pipelines, diagonal-only mask, 128-row tiles)", "[emu][attention]") {
    // T = 1; a partial tile with GQA 2; several key tiles so the stage ring wraps (hd 64: 3 stages,
    // dK/dV steps across both heads of a group; hd 128: 2 stages, GQA 2 and 4).
    const Shape shapes[] = {{1, 1, 2, 1, 64}, {2, 37, 4, 2, 64}, {1, 203, 4, 2, 64}, {1, 1, 4, 2, 128},
                            {1, 70, 4, 2, 128}, {1, 150, 4, 1, 128}};
    uint64_t seed = 77;
    for (const Shape& sh : shapes) run<bf16>(sh, kMmaPipe, seed += 7);
#if !EMU_TSAN  // under ThreadSanitizer these are data races: test/tsan_emu_race.cpp expects them reported
    // A pipeline whose waits are one group short reads stages before they land: caught.
    run<bf16>(shapes[2], kMmaPipe, 1, 1);
    run<bf16>(shapes[5], kMmaPipe, 2, 1);
#endif
}

TEST_CASE("emu: attention wgmma forward and backward (sm_90a warpgroup MMA from swizzled shared tiles, cp.async "
          "pipelines)",
          "[emu][attention]") {
    // T = 1; partial tiles with GQA 2 (hd 64: 128-row blocks of two warpgroups, 128-key tiles; dK/dV:
    // 128-key blocks, 64-query steps across both heads of the group); several tiles so the stage
    // rings wrap (T = 300: the last block's second warpgroup is all padding and skips every tile);
    // hd 128 with GQA 2 and 4 (dQ: 64-key tiles).
    REQUIRE(attn_wgmma::wgmma_supported(64));  // the emulated device is compute capability 9.0
    const Shape shapes[] = {{1, 1, 2, 1, 64},  {2, 37, 4, 2, 64},   {1, 300, 2, 1, 64},
                            {1, 1, 4, 2, 128}, {1, 150, 4, 2, 128}, {1, 270, 4, 1, 128}};
    uint64_t seed = 301;
    for (const Shape& sh : shapes) run<bf16>(sh, kWgmma, seed += 7);
#if !EMU_TSAN
    run<bf16>(shapes[2], kWgmma, 3, 1);  // cp.async waits one group short: caught
#endif
}

TEST_CASE("emu: attention mma kernels (bf16 mma.sync; ldmatrix and plain fragment loads, whole-tile dQ; the "
          "dispatch)",
          "[emu][attention]") {
    // T = 1 (one row), T = 37 (partial tile, GQA 2), T = 70 (two tiles, hd 128), T = 130 (three
    // tiles, the last of 2 rows, GQA 2: dQ skips the masked half of each diagonal tile in warps 0
    // and 1). mma-plain
    // (other fragment loads) and mma-dqfull (dQ over whole tiles) run the same MMAs in the same
    // order as mma: their results must be mma's bit for bit.
    const Shape shapes[] = {{1, 1, 2, 1, 64}, {2, 37, 4, 2, 64}, {1, 70, 4, 2, 128}, {1, 130, 4, 2, 64}};
    uint64_t seed = 5;
    for (const Shape& sh : shapes) {
        REQUIRE(attention_uses_mma<bf16>(sh.hd));
        const std::vector<uint16_t> mma = run<bf16>(sh, kMma, seed);
        REQUIRE(!mma.empty());
        for (Kernel k : {kMmaPlain, kMmaDqFull}) {
            INFO(kernel_name(k) << " vs mma, T=" << sh.T << " hd=" << sh.hd);
            CHECK(run<bf16>(sh, k, seed) == mma);
        }
        seed += 7;
    }
    run<bf16>(shapes[1], kAuto, 3);  // what the trainer calls
}

TEST_CASE("attention: row split in 32 bits, and shapes whose rows exceed 31 bits refused", "[emu][attention]") {
    // split_row (the scalar kernels' (b, h, t) of a [B, H, T] row) against 64-bit division, at
    // random rows up to the largest one check_shape admits.
    const uint64_t s0 = init_stream(4242, 0);
    for (int i = 0; i < 20000; i++) {
        const int T_ = 1 + (int)(stream_uniform(s0, 4 * i) * 70000), H = 1 + (int)(stream_uniform(s0, 4 * i + 1) * 64);
        const int64_t rows_max = INT32_MAX / ((int64_t)T_ * H) * T_ * H;  // whole batches only
        if (rows_max == 0) continue;
        int64_t row = (int64_t)(stream_uniform(s0, 4 * i + 2) * (double)rows_max);
        if (i % 4 == 0) row = rows_max - 1;  // the last row
        row = std::min<int64_t>(std::max<int64_t>(row, 0), rows_max - 1);
        int b, h, t;
        attn_detail::split_row(row, T_, H, b, h, t);
        INFO("row " << row << " T " << T_ << " H " << H);
        REQUIRE(t == (int)(row % T_));
        REQUIRE(h == (int)((row / T_) % H));
        REQUIRE(b == (int)(row / ((int64_t)T_ * H)));
    }
    // B·nh·T = 2^32 rows: refused before any launch (null buffers are never touched).
    CHECK_THROWS_AS(attention_forward<bf16>(nullptr, nullptr, nullptr, 1 << 15, 1 << 12, 32, 8, 64, 0), Error);
    CHECK_THROWS_AS(attention_backward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1 << 15, 1 << 12,
                                             32, 8, 64, 0),
                    Error);
    CHECK_THROWS_AS(attention_forward<float>(nullptr, nullptr, nullptr, 1, 16, 6, 4, 64, 0), Error);  // nh % nkv
}

TEST_CASE("emu: attention scalar kernels (fp32 and bf16)", "[emu][attention]") {
    const Shape shapes[] = {{2, 37, 4, 2, 16}, {1, 9, 3, 1, 6}};
    uint64_t seed = 50;
    for (const Shape& sh : shapes) {
        REQUIRE_FALSE(attention_uses_mma<bf16>(sh.hd));
        run<float>(sh, kScalar, seed);
        run<bf16>(sh, kScalar, seed);
        seed += 7;
    }
    run<float>(shapes[0], kAuto, 3);
}

// the workbench's command line; gpu_check.sh's run of it, launches only (test_ptxas checks them)
EMU_WORKBENCH_CASES("attention")
EMU_WORKBENCH_QUICK_TIMES_NOTHING_CASE("attention")
