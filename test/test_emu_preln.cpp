// CPU emulation test (dev/emu; doc/cuda.md "Emulating kernels on the CPU") of GpuPreLN's backward
// (train_gpt_baselines.cu, included with TESTING): the backbone's call sequence readout_backward /
// output_backward(j) / input_norm_backward(j) ... / begin_backward with the fused override
// (rmsnorm_backward_residual: d_o_{j-1} written in the RMSNorm backward's pass) must give the same
// bits as the default GpuScheme::input_norm_backward (rmsnorm_backward, then input_backward, then
// output_backward's own conversion) for every d_o_j, de and norm-weight gradient, fp32 and bf16,
// at an odd d (lane-strided path) and d = 64 (16-byte packs), N = 3·13 rows; de also against a
// CPU recurrence (cpu::rmsnorm_backward, dx rounded to T, dh in fp32). Misuse throws ldm::Error.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#define TESTING  // the trainer file without its main()
#include "cuda_emu/train_gpt_baselines.cu.h"
#include "cpu/ops.h"
#include "cpu/rng.h"

using namespace ldm;
using namespace ldm::gpu;

namespace {

std::vector<float> rand_vec(int64_t n, uint64_t stream, float scale, float offset = 0.f) {
    std::vector<float> v((size_t)n);
    const uint64_t s0 = init_stream(11, stream);
    for (int64_t i = 0; i < n; i++) v[(size_t)i] = offset + scale * (2.f * (float)stream_uniform(s0, (uint64_t)i) - 1.f);
    return v;
}

template <typename T>
std::vector<float> round_to(std::vector<float> v) {
    for (float& x : v) x = to_f(from_f<T>(x));
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

// Per-sublayer inputs of the input-norm backward: dln = dL/dxn_j, x_j, w_j, rstd_j (of x_j).
struct Sub {
    std::vector<float> dln, x, w, rstd;
    DeviceBuffer<float> rstd_d;
};

template <typename T>
void fused_equals_default(int d) {
    const int B = 3, T_ = 13, D = 4;
    const int64_t N = (int64_t)B * T_, n = N * d;
    ModelConfig cfg = preset_config("tiny", 257);
    cfg.d_model = d;
    GpuPreLN<T> fused(cfg), plain(cfg);
    fused.resize(B, T_);
    plain.resize(B, T_);

    const std::vector<float> dy = round_to<T>(rand_vec(n, 1, 1.f));
    std::vector<Sub> sub((size_t)D + 1);
    std::vector<DeviceBuffer<T>> dln_d((size_t)D + 1), x_d((size_t)D + 1), w_d((size_t)D + 1);
    for (int j = 1; j <= D; j++) {
        Sub& s = sub[(size_t)j];
        s.dln = round_to<T>(rand_vec(n, 10 + 4 * j, 1.f));
        s.x = round_to<T>(rand_vec(n, 11 + 4 * j, 1.f));
        s.w = round_to<T>(rand_vec(d, 12 + 4 * j, 0.2f, 1.f));
        std::vector<float> xn((size_t)n);
        s.rstd.resize((size_t)N);
        cpu::rmsnorm_forward<float>(xn.data(), s.rstd.data(), s.x.data(), s.w.data(), (int)N, d, 1e-5f);
        for (auto* p : {&dln_d, &x_d}) (*p)[(size_t)j].alloc(n);
        w_d[(size_t)j].alloc(d);
        upload(dln_d[(size_t)j].ptr, s.dln.data(), n);
        upload(x_d[(size_t)j].ptr, s.x.data(), n);
        upload(w_d[(size_t)j].ptr, s.w.data(), d);
        s.rstd_d.alloc(N);
        upload(s.rstd_d.ptr, s.rstd.data(), N);
    }
    DeviceBuffer<T> dy_d(n), do_f(n), do_p(n), dx_f(n), dx_p(n), de_f(n), de_p(n);
    upload(dy_d.ptr, dy.data(), n);
    DeviceBuffer<float> dw_f(D * (int64_t)d), dw_p(D * (int64_t)d), scr(rmsnorm_backward_scratch(N, d));
    const std::vector<float> dw0 = rand_vec(D * (int64_t)d, 2, 0.5f);
    upload(dw_f.ptr, dw0.data(), D * (int64_t)d);
    upload(dw_p.ptr, dw0.data(), D * (int64_t)d);

    fused.readout_backward(dy_d.ptr, 0);
    plain.readout_backward(dy_d.ptr, 0);
    // CPU recurrence: dh (fp32) = dy; d_o_j = (T) dh; dh += (T) dx_j; de = (T) dh.
    std::vector<float> dh(dy), dx((size_t)n), dw_sink((size_t)d);
    double worst_do = 0;
    for (int j = D; j >= 1; j--) {
        if (j == D) fill(do_f.ptr, n, NAN, 0);  // j < D: the fused input_norm_backward(j+1) wrote it
        fill(do_p.ptr, n, NAN, 0);
        fused.output_backward(j, do_f.ptr, 0);
        plain.output_backward(j, do_p.ptr, 0);
        const std::vector<float> gf = download(do_f.ptr, n), gp = download(do_p.ptr, n);
        INFO("d=" << d << " j=" << j);
        CHECK(same_bits(gf, gp));
        worst_do = std::max(worst_do, rel_l2(gf, round_to<T>(dh)));
        const Sub& s = sub[(size_t)j];
        float* dwf = dw_f.ptr + (int64_t)(j - 1) * d;
        float* dwp = dw_p.ptr + (int64_t)(j - 1) * d;
        fused.input_norm_backward(j, dln_d[(size_t)j].ptr, x_d[(size_t)j].ptr, w_d[(size_t)j].ptr, s.rstd_d.ptr, N, d,
                                  dwf, scr.ptr, dx_f.ptr, do_f.ptr, 0);
        plain.GpuScheme<T>::input_norm_backward(j, dln_d[(size_t)j].ptr, x_d[(size_t)j].ptr, w_d[(size_t)j].ptr,
                                                s.rstd_d.ptr, N, d, dwp, scr.ptr, dx_p.ptr, do_p.ptr, 0);
        std::fill(dx.begin(), dx.end(), 0.f);
        cpu::rmsnorm_backward<float>(dx.data(), dw_sink.data(), s.dln.data(), s.x.data(), s.w.data(), s.rstd.data(),
                                     (int)N, d);
        for (int64_t i = 0; i < n; i++) dh[(size_t)i] += to_f(from_f<T>(dx[(size_t)i]));
    }
    fill(de_f.ptr, n, NAN, 0);
    fill(de_p.ptr, n, NAN, 0);
    fused.begin_backward(de_f.ptr, 0);
    plain.begin_backward(de_p.ptr, 0);
    const std::vector<float> ef = download(de_f.ptr, n);
    INFO("d=" << d);
    CHECK(same_bits(ef, download(de_p.ptr, n)));
    CHECK(same_bits(download(dw_f.ptr, D * (int64_t)d), download(dw_p.ptr, D * (int64_t)d)));
    // vs the CPU: the device's dot products sum in another order, so (T) dx may differ by one
    // rounding step of T in a few elements (bf16: 2^-8 relative), fp32: a few ulps.
    const double tol = std::is_same<T, float>::value ? 1e-5 : 1e-2;
    const double e_de = rel_l2(ef, round_to<T>(dh));
    INFO("relative L2 vs CPU: de " << e_de << ", worst d_o " << worst_do);
    CHECK(e_de <= tol);
    CHECK(worst_do <= tol);
    // the comparison can fail: de is far from dy (4 sublayers added into it)
    CHECK(rel_l2(ef, dy) > 0.1);
}

}  // namespace

TEST_CASE("emu: GpuPreLN fused input_norm_backward == the unfused default, bit for bit", "[emu][preln]") {
    for (int d : {37, 64}) {
        fused_equals_default<float>(d);
        fused_equals_default<bf16>(d);
    }
}

TEST_CASE("emu: GpuPreLN fused backward rejects a call sequence it cannot serve", "[emu][preln]") {
    const int B = 2, T_ = 5, d = 16;
    const int64_t N = (int64_t)B * T_, n = N * d;
    ModelConfig cfg = preset_config("tiny", 257);
    cfg.d_model = d;
    GpuPreLN<float> S(cfg);
    S.resize(B, T_);
    DeviceBuffer<float> g(n), x(n), w(d), rstd(N), dw(d), scr(rmsnorm_backward_scratch(N, d)), dx(n), a(n), b(n);
    for (auto* p : {&g, &x, &a, &b}) fill(p->ptr, n, 0.5f, 0);
    fill(w.ptr, d, 1.f, 0);
    fill(rstd.ptr, N, 1.f, 0);
    fill(dw.ptr, d, 0.f, 0);
    auto inb = [&](int j, int64_t rows, float* next) {
        S.input_norm_backward(j, g.ptr, x.ptr, w.ptr, rstd.ptr, rows, d, dw.ptr, scr.ptr, dx.ptr, next, 0);
    };
    S.readout_backward(g.ptr, 0);
    CHECK_THROWS_AS(inb(4, N + 1, a.ptr), Error);  // rows != the resized B·T
    S.output_backward(4, a.ptr, 0);
    inb(4, N, a.ptr);
    CHECK_THROWS_AS(S.output_backward(3, b.ptr, 0), Error);  // d_o is not the d_o_next written
    S.readout_backward(g.ptr, 0);                              // a new backward starts clean
    S.output_backward(4, a.ptr, 0);
    inb(4, N, a.ptr);
    CHECK_THROWS_AS(inb(3, N, a.ptr), Error);  // output_backward(3) skipped
    S.readout_backward(g.ptr, 0);
    inb(2, N, a.ptr);
    CHECK_THROWS_AS(S.begin_backward(b.ptr, 0), Error);  // output_backward(1) skipped
    S.readout_backward(g.ptr, 0);
    S.output_backward(1, a.ptr, 0);
    inb(1, N, a.ptr);  // j == 1: d_o_next unused, begin_backward converts
    CHECK_NOTHROW(S.begin_backward(b.ptr, 0));
}
