// CPU emulation test of the attention kernels of cuda/attention.cuh (dev/emu; doc/cuda.md
// "Emulating kernels on the CPU"), through the dev/cuda/attention.cu workbench's kernel_forward /
// kernel_backward (row-dot, then dK/dV and dQ): the scalar kernels (fp32 and bf16, one warp per
// row), the mma kernels (bf16 mma.sync m16n8k16 with ldmatrix fragments, production) and the
// workbench's mma-plain variant (plain shared-memory fragment loads), with mma.sync and ldmatrix
// emulated as warp collectives per the PTX ISA fragment tables, against cpu/ops.h attention in double
// (out, lse, dqkv). Outputs are poisoned with NaN; each case runs under the three scheduling
// orders and must give bit-identical results.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/dev_cuda/attention.cu.h"
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

template <typename T>
void run(const Shape& sh, Kernel variant, uint64_t seed) {
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
}

}  // namespace

TEST_CASE("emu: attention mma kernels (bf16 mma.sync; ldmatrix and plain fragment loads; the dispatch)",
          "[emu][attention]") {
    // T = 1 (one row), T = 37 (partial tile, GQA 2), T = 70 (two tiles, hd 128)
    const Shape shapes[] = {{1, 1, 2, 1, 64}, {2, 37, 4, 2, 64}, {1, 70, 4, 2, 128}};
    uint64_t seed = 5;
    for (const Shape& sh : shapes) {
        REQUIRE(attention_uses_mma<bf16>(sh.hd));
        for (Kernel k : {kMma, kMmaPlain}) run<bf16>(sh, k, seed);
        seed += 7;
    }
    run<bf16>(shapes[1], kAuto, 3);  // what the trainer calls
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
