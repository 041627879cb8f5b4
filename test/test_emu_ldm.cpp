// CPU emulation test of the LDM kernels of cuda/ldm.cuh (dev/emu: the kernels run under
// g++ on host memory, one fiber per CUDA thread; see doc/cuda.md "Emulating kernels on the CPU").
// Each warp kernel (one warp per token-head: read, rls write incl. in place and recompute, outer /
// delta write, fused unwind+VJP of rls, outer / delta VJP, unwind, read backward) and the drift
// kernel is launched directly (ldmk::..., with the launch shapes of LdmGpuScheme) at tiny odd
// shapes, against the per token-head math of math/ldm_math.h in double. Inputs are fresh random
// non-zero values; outputs and a tail guard after every buffer are poisoned with NaN; each kernel
// runs under three scheduling orders (forward / reverse / random warps and lanes) and must give
// bit-identical results (an order-dependent result means a missing __syncwarp/__syncthreads).
// Header copies come from `python3 dev/emu/gen.py` (Makefile: $(BUILD)/emu/cuda_emu/).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_emu/ldm.cuh"
#include "cuda_emu/dev_cuda/ldm_window_bwd.cuh"

using namespace ldm;
using namespace ldm::gpu;
using namespace ldm::gpu::ldmk;

namespace {

constexpr int kGuard = 8;  // poisoned floats after every buffer (out-of-bounds writes show there)

uint32_t bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }

// Host buffer standing for a device buffer: n values + kGuard NaN guard values.
struct Buf {
    std::vector<float> v;
    int64_t n = 0;
    Buf() = default;
    explicit Buf(int64_t n_) : v((size_t)(n_ + kGuard), std::nanf("")), n(n_) {}
    float* p() { return v.data(); }
    float& operator[](int64_t i) { return v[(size_t)i]; }
    float operator[](int64_t i) const { return v[(size_t)i]; }
    void poison() { std::fill(v.begin(), v.end(), std::nanf("")); }
    bool guard_intact() const {
        for (int i = 0; i < kGuard; i++)
            if (!std::isnan(v[(size_t)(n + i)])) return false;
        return true;
    }
};

struct Rng {
    std::mt19937_64 g;
    explicit Rng(uint64_t s) : g(s) {}
    // uniform in ±[lo, hi] (non-zero)
    float nz(float lo = 0.1f, float hi = 1.f) {
        std::uniform_real_distribution<float> u(lo, hi);
        return (g() & 1) ? u(g) : -u(g);
    }
    float pos(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g); }
    void fill(Buf& b, float lo = 0.1f, float hi = 1.f) {
        for (int64_t i = 0; i < b.n; i++) b[i] = nz(lo, hi);
    }
};

Dims dims(int N, int Hm, int dk, int dv, bool rls) {
    Dims D;
    D.N = N;
    D.Hm = Hm;
    D.dk = dk;
    D.dv = dv;
    D.d = dv * Hm;
    D.HK = Hm * dk;
    D.SS = dv * dk;
    D.PP = rls ? dk * dk : 0;
    D.ST = Hm * (D.SS + D.PP);
    return D;
}

// Random state: S entries ±[0.1, 1]; P = I + 0.2 sym(noise) (symmetric positive definite).
void random_state(const Dims& D, Buf& cur, Rng& r) {
    for (int n = 0; n < D.N; n++)
        for (int h = 0; h < D.Hm; h++) {
            float* S = cur.p() + D.state_off(n, h);
            for (int i = 0; i < D.SS; i++) S[i] = r.nz();
            if (!D.PP) continue;
            float* P = S + D.SS;
            for (int a = 0; a < D.dk; a++)
                for (int b = 0; b <= a; b++) {
                    const float x = a == b ? 1.f + r.pos(0.f, 0.2f) : 0.2f * r.nz(0.f, 1.f) / D.dk;
                    P[a * D.dk + b] = P[b * D.dk + a] = x;
                }
        }
}
// Normalised keys Kn (L2n of random raw keys) and their norms.
void random_keys(const Dims& D, Buf& Kn, Buf& Knrm, Rng& r) {
    std::vector<float> raw((size_t)D.dk);
    for (int64_t t = 0; t < (int64_t)D.N * D.Hm; t++) {
        for (auto& x : raw) x = r.nz();
        Knrm[t] = l2n_forward(raw.data(), Kn.p() + t * D.dk, D.dk);
    }
}

std::vector<double> dv_(const float* p, int64_t n) { return std::vector<double>(p, p + n); }

// Comparison of a kernel output with a double reference: every value finite, max |diff| <=
// tol * max(1, max |ref|) over the whole array, guard intact.
void expect_close(const char* what, const Buf& got, const std::vector<double>& ref, double tol,
                  const std::string& ctx) {
    INFO(ctx << " output " << what);
    REQUIRE((int64_t)ref.size() == got.n);
    double mref = 1.0, mdiff = 0.0;
    int64_t worst = -1;
    bool finite = true;
    for (int64_t i = 0; i < got.n; i++) {
        mref = std::max(mref, std::fabs(ref[(size_t)i]));
        if (!std::isfinite(got[i])) {
            finite = false;
            worst = i;
            break;
        }
        const double d = std::fabs(got[i] - ref[(size_t)i]);
        if (d > mdiff) {
            mdiff = d;
            worst = i;
        }
    }
    INFO("first non-finite / worst index " << worst << ": got "
                                           << (worst >= 0 ? got[worst] : 0.f) << " ref "
                                           << (worst >= 0 ? ref[(size_t)worst] : 0.0));
    CHECK(finite);
    CHECK(mdiff <= tol * mref);
    CHECK(got.guard_intact());
}

// Runs `setup` (fresh inputs, poisoned outputs) then `launch` under three scheduling orders and
// requires bit-identical `outs` across the orders. Leaves the outputs of the last run.
void run_orders(const std::string& ctx, const std::function<void()>& setup,
                const std::function<void()>& launch, const std::vector<Buf*>& outs) {
    std::vector<std::vector<uint32_t>> first;
    const emu::Order orders[3] = {emu::Order::kForward, emu::Order::kReverse, emu::Order::kRandom};
    for (int o = 0; o < 3; o++) {
        emu::set_order(orders[o], 12345 + o);
        setup();
        launch();
        std::vector<std::vector<uint32_t>> now;
        for (Buf* b : outs) {
            std::vector<uint32_t> u(b->v.size());
            for (size_t i = 0; i < u.size(); i++) u[i] = bits(b->v[i]);
            now.push_back(std::move(u));
        }
        if (o == 0) first = std::move(now);
        else {
            INFO(ctx << ": results differ between scheduling orders forward and " << emu::order_name(orders[o]));
            CHECK(now == first);
        }
    }
    emu::set_order(emu::Order::kForward);
}

struct Shape {
    int N, Hm, dk, dv;
};
// Tiny odd shapes: dk below / at the float4 widths, dv below and above one warp (rows per lane > 1).
const Shape kShapes[] = {{5, 1, 4, 7}, {13, 2, 8, 5}, {7, 3, 16, 3}, {11, 2, 5, 37},
                         {40, 4, 16, 9}, {9, 1, 3, 33}, {6, 2, 12, 70}};

// Template DK values that the launch code can pick for dk: the smallest of 4, 8, 16 that holds
// dk (outer/delta dispatch and rls for dk 4, 8) and 16 (rls dispatch for every other dk).
std::vector<int> dk_variants(int dk) {
    std::vector<int> v;
    for (int K : {4, 8, 16})
        if (dk <= K) {
            v.push_back(K);
            break;
        }
    if (v.back() != 16) v.push_back(16);
    return v;
}
template <typename F>
void with_dk(int K, F&& f) {
    if (K == 4) f(std::integral_constant<int, 4>());
    else if (K == 8) f(std::integral_constant<int, 8>());
    else f(std::integral_constant<int, 16>());
}

// Variants of the rls warp kernels at width K (cuda/ldm.cuh: template arguments PREG, the P
// placement of PMat, and ROWS, rows per lane and step of the row loops): 0 production (kRegPMax,
// kFwdRows / kBwdRows); 1 one row per step (the loops before row batching; where production
// batches); 2 at K = 8, P in registers with one row per step (the production layout before P
// moved to shared memory). The workbench dev/cuda/ldm.cu times 1 and 2 beside production.
std::vector<int> rls_variants(int K) {
    std::vector<int> v{0};
    const bool batched = K == 4 ? (kFwdRows<4> != 1 || kBwdRows<4> != 1)
                         : K == 8 ? (kFwdRows<8> != 1 || kBwdRows<8> != 1)
                                  : (kFwdRows<16> != 1 || kBwdRows<16> != 1);
    if (batched) v.push_back(1);
    if (K == 8) v.push_back(2);
    return v;
}
// Calls f(PREG, forward ROWS, backward ROWS) as integral constants for variant `var` at width DK.
template <int DK, typename F>
void with_variant(int var, F&& f) {
    using std::integral_constant;
    if (var == 2) f(integral_constant<int, 8>(), integral_constant<int, 1>(), integral_constant<int, 1>());
    else if (var == 1) f(integral_constant<int, kRegPMax>(), integral_constant<int, 1>(), integral_constant<int, 1>());
    else f(integral_constant<int, kRegPMax>(), integral_constant<int, kFwdRows<DK>>(), integral_constant<int, kBwdRows<DK>>());
}
std::string variant_name(int var) { return var == 0 ? " production" : var == 1 ? " rows=1" : " regP rows=1"; }

std::string ctx_of(const char* k, const Shape& s, int K, const char* extra = "") {
    return strprintf("%s N=%d Hm=%d dk=%d dv=%d DK=%d%s", k, s.N, s.Hm, s.dk, s.dv, K, extra);
}

const double kTol = 2e-5;  // fp32 kernel vs double reference, relative to max(1, max |ref|)

}  // namespace

TEST_CASE("emu: warp read forward (fp32 and bf16 x, with and without residual gates)", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int K : dk_variants(s.dk))
            for (int resid = 0; resid < 2; resid++)
                with_dk(K, [&](auto kc) {
                    constexpr int DK = decltype(kc)::value;
                    const Dims D = dims(s.N, s.Hm, s.dk, s.dv, false);
                    Rng r(1000 + s.N * 7 + K + resid);
                    Buf cur(D.N * D.ST), raw(D.N * D.HK), src(D.N * D.d), a(D.Hm * D.dv);
                    Buf Qn(D.N * D.HK), Qnrm(D.N * D.Hm), x(D.N * D.d);
                    random_state(D, cur, r);
                    r.fill(raw);
                    r.fill(src);
                    r.fill(a);
                    const float* ap = resid ? a.p() : nullptr;
                    const std::string ctx = ctx_of("read_warp", s, K, resid ? " resid" : "");
                    run_orders(
                        ctx, [&] { Qn.poison(); Qnrm.poison(); x.poison(); },
                        [&] {
                            emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, read_warp_kernel<float, DK>, D,
                                        (const float*)cur.p(), (const float*)raw.p(), Qn.p(), Qnrm.p(),
                                        (const float*)src.p(), ap, x.p());
                        },
                        {&Qn, &Qnrm, &x});
                    std::vector<double> rQn((size_t)Qn.n), rQnrm((size_t)Qnrm.n), rx((size_t)x.n);
                    for (int n = 0; n < D.N; n++)
                        for (int h = 0; h < D.Hm; h++) {
                            auto q = dv_(raw.p() + D.key_off(n, h), D.dk);
                            rQnrm[(size_t)D.tok_off(n, h)] = l2n_forward(q.data(), q.data(), D.dk);
                            std::copy(q.begin(), q.end(), rQn.begin() + D.key_off(n, h));
                            auto S = dv_(cur.p() + D.state_off(n, h), D.SS);
                            std::vector<double> rr((size_t)D.dv);
                            ldm_read(S.data(), q.data(), rr.data(), D.dv, D.dk);
                            for (int c = 0; c < D.dv; c++)
                                rx[(size_t)(D.val_off(n, h) + c)] =
                                    resid ? src[D.val_off(n, h) + c] + (double)a[h * D.dv + c] * rr[(size_t)c] : rr[(size_t)c];
                        }
                    expect_close("Qn", Qn, rQn, kTol, ctx);
                    expect_close("Qnrm", Qnrm, rQnrm, kTol, ctx);
                    expect_close("x", x, rx, kTol, ctx);
                    // bf16 output: same values rounded to bf16 (8 mantissa bits)
                    std::vector<bf16> xb((size_t)x.n + kGuard, __float2bfloat16(0.f));
                    emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, read_warp_kernel<bf16, DK>, D,
                                (const float*)cur.p(), (const float*)raw.p(), Qn.p(), Qnrm.p(),
                                (const float*)src.p(), ap, xb.data());
                    Buf xf(x.n);
                    for (int64_t i = 0; i < x.n; i++) xf[i] = __bfloat162float(xb[(size_t)i]);
                    expect_close("x (bf16)", xf, rx, 8e-3, ctx);
                });
}

TEST_CASE("emu: warp rls write (out of place, in place, recompute)", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int K : dk_variants(s.dk))
            for (int var : rls_variants(K))
            for (int mode = 0; mode < 3; mode++)  // 0 out of place, 1 in place, 2 RECOMP in place
                with_dk(K, [&](auto kc) { constexpr int DK = decltype(kc)::value;
                    with_variant<DK>(var, [&](auto pc, auto rf, auto) {
                    constexpr int PREG = decltype(pc)::value, ROWS = decltype(rf)::value;
                    const Dims D = dims(s.N, s.Hm, s.dk, s.dv, true);
                    Rng r(2000 + s.N * 7 + K + mode);
                    Buf in(D.N * D.ST), out(D.N * D.ST), raw(D.N * D.HK), v(D.N * D.d), lam(D.Hm);
                    Buf Kn(D.N * D.HK), Knrm(D.N * D.Hm);
                    random_state(D, in, r);
                    r.fill(v);
                    for (int h = 0; h < D.Hm; h++) lam[h] = r.pos(0.85f, 1.f);
                    if (mode == 2) random_keys(D, raw, Knrm, r);  // raw = stored normalised keys
                    else r.fill(raw);
                    const std::string ctx = ctx_of("write_rls_warp", s, K, mode == 0 ? " out-of-place" : mode == 1 ? " in-place" : " recompute") +
                                            variant_name(var);
                    run_orders(
                        ctx,
                        [&] {
                            Kn.poison();
                            Knrm.poison();
                            if (mode == 0) out.poison();
                            else out.v = in.v;
                        },
                        [&] {
                            float* src = mode == 0 ? in.p() : out.p();
                            if (mode == 2)
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, write_rls_warp_kernel<DK, true, PREG, ROWS>, D,
                                            out.p(), (const float*)src, (const float*)raw.p(), (float*)nullptr,
                                            (float*)nullptr, (const float*)v.p(), (const float*)lam.p());
                            else
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, write_rls_warp_kernel<DK, false, PREG, ROWS>, D,
                                            out.p(), (const float*)src, (const float*)raw.p(), Kn.p(), Knrm.p(),
                                            (const float*)v.p(), (const float*)lam.p());
                        },
                        mode == 2 ? std::vector<Buf*>{&out} : std::vector<Buf*>{&out, &Kn, &Knrm});
                    std::vector<double> rS((size_t)out.n), rKn((size_t)Kn.n), rKnrm((size_t)Knrm.n);
                    for (int n = 0; n < D.N; n++)
                        for (int h = 0; h < D.Hm; h++) {
                            auto k = dv_(raw.p() + D.key_off(n, h), D.dk);
                            if (mode != 2) rKnrm[(size_t)D.tok_off(n, h)] = l2n_forward(k.data(), k.data(), D.dk);
                            std::copy(k.begin(), k.end(), rKn.begin() + D.key_off(n, h));
                            auto st = dv_(in.p() + D.state_off(n, h), D.SS + D.PP);
                            auto vv = dv_(v.p() + D.val_off(n, h), D.dv);
                            std::vector<double> u((size_t)D.dk);
                            rls_write(st.data(), st.data() + D.SS, k.data(), vv.data(), (double)lam[h], D.dv, D.dk, u.data());
                            std::copy(st.begin(), st.end(), rS.begin() + D.state_off(n, h));
                        }
                    expect_close("state", out, rS, kTol, ctx);
                    if (mode != 2) {
                        expect_close("Kn", Kn, rKn, kTol, ctx);
                        expect_close("Knrm", Knrm, rKnrm, kTol, ctx);
                    } else {
                        CHECK(Kn.guard_intact());
                    }
                }); });
}

TEST_CASE("emu: warp outer / delta write (forward and recompute)", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int K : dk_variants(s.dk))
            for (int rule : {kOuter, kDelta})
                for (int recomp = 0; recomp < 2; recomp++)
                    with_dk(K, [&](auto kc) {
                        constexpr int DK = decltype(kc)::value;
                        const Dims D = dims(s.N, s.Hm, s.dk, s.dv, false);
                        Rng r(3000 + s.N * 7 + K + rule * 3 + recomp);
                        Buf in(D.N * D.ST), cur(D.N * D.ST), raw(D.N * D.HK), v(D.N * D.d), lam(D.Hm);
                        Buf Kn(D.N * D.HK), Knrm(D.N * D.Hm), zraw(D.N * D.Hm), bb(D.Hm), beta(D.N * D.Hm);
                        random_state(D, in, r);
                        r.fill(v);
                        r.fill(zraw, 0.1f, 2.f);
                        r.fill(bb);
                        for (int h = 0; h < D.Hm; h++) lam[h] = r.pos(0.85f, 1.f);
                        Buf beta_in(D.N * D.Hm);
                        for (int64_t i = 0; i < beta_in.n; i++) beta_in[i] = r.pos(0.05f, 0.95f);
                        if (recomp) random_keys(D, raw, Knrm, r);
                        else r.fill(raw);
                        const std::string ctx = ctx_of(rule == kOuter ? "write_od_warp<outer>" : "write_od_warp<delta>", s, K,
                                                       recomp ? " recompute" : "");
                        auto kern = [&](auto rc) {
                            constexpr int RL = decltype(rc)::value;
                            if (recomp)
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, write_od_warp_kernel<RL, DK, true>, D,
                                            cur.p(), (const float*)raw.p(), (float*)nullptr, (float*)nullptr,
                                            (const float*)v.p(), (const float*)lam.p(), (const float*)nullptr,
                                            (const float*)nullptr, beta.p());
                            else
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, write_od_warp_kernel<RL, DK, false>, D,
                                            cur.p(), (const float*)raw.p(), Kn.p(), Knrm.p(), (const float*)v.p(),
                                            (const float*)lam.p(), (const float*)zraw.p(), (const float*)bb.p(), beta.p());
                        };
                        run_orders(
                            ctx,
                            [&] {
                                cur.v = in.v;
                                Kn.poison();
                                Knrm.poison();
                                if (recomp) beta.v = beta_in.v;
                                else beta.poison();
                            },
                            [&] {
                                if (rule == kOuter) kern(std::integral_constant<int, kOuter>());
                                else kern(std::integral_constant<int, kDelta>());
                            },
                            {&cur, &Kn, &Knrm, &beta});
                        std::vector<double> rS((size_t)cur.n), rKn((size_t)Kn.n), rKnrm((size_t)Knrm.n), rb((size_t)beta.n);
                        for (int n = 0; n < D.N; n++)
                            for (int h = 0; h < D.Hm; h++) {
                                const int64_t nh = D.tok_off(n, h);
                                auto k = dv_(raw.p() + D.key_off(n, h), D.dk);
                                if (!recomp) rKnrm[(size_t)nh] = l2n_forward(k.data(), k.data(), D.dk);
                                std::copy(k.begin(), k.end(), rKn.begin() + D.key_off(n, h));
                                auto S = dv_(in.p() + D.state_off(n, h), D.SS);
                                auto vv = dv_(v.p() + D.val_off(n, h), D.dv);
                                const double bt = recomp ? (double)beta_in[nh]
                                                         : kBetaMax * sigmoid((double)zraw[nh] + (double)bb[h]);
                                rb[(size_t)nh] = bt;
                                if (rule == kOuter) outer_write(S.data(), k.data(), vv.data(), (double)lam[h], D.dv, D.dk);
                                else delta_write(S.data(), k.data(), vv.data(), bt, D.dv, D.dk);
                                std::copy(S.begin(), S.end(), rS.begin() + D.state_off(n, h));
                            }
                        expect_close("state", cur, rS, kTol, ctx);
                        if (!recomp) {
                            expect_close("Kn", Kn, rKn, kTol, ctx);
                            expect_close("Knrm", Knrm, rKnrm, kTol, ctx);
                            if (rule == kDelta) expect_close("beta", beta, rb, kTol, ctx);
                        }
                    });
}

TEST_CASE("emu: warp rls unwind+VJP (fused) and VJP, and warp unwind", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int K : dk_variants(s.dk))
            for (int var : rls_variants(K))
            for (int unw = 0; unw < 3; unw++)  // 0 VJP only, 1 fused unwind+VJP, 2 unwind_warp alone
                with_dk(K, [&](auto kc) { constexpr int DK = decltype(kc)::value;
                    with_variant<DK>(var, [&](auto pc, auto, auto rb) {
                    constexpr int PREG = decltype(pc)::value, ROWS = decltype(rb)::value;
                    if (unw == 2 && var != 0) return;  // unwind_warp_kernel: production only
                    const Dims D = dims(s.N, s.Hm, s.dk, s.dv, true);
                    Rng r(4000 + s.N * 7 + K + unw);
                    Buf in(D.N * D.ST), cur(D.N * D.ST), dS_in(D.N * D.ST), dS(D.N * D.ST);
                    Buf Kn(D.N * D.HK), Knrm(D.N * D.Hm), v(D.N * D.d), lam(D.Hm), dsrc(D.N * D.d);
                    Buf dvacc(D.N * D.d), draw(D.N * D.HK), dtok(D.N * D.Hm);
                    random_state(D, in, r);
                    random_state(D, dS_in, r);  // any values
                    random_keys(D, Kn, Knrm, r);
                    r.fill(v);
                    r.fill(dsrc);
                    for (int h = 0; h < D.Hm; h++) lam[h] = r.pos(0.85f, 1.f);
                    const std::string ctx = ctx_of(unw == 2 ? "unwind_warp<rls>" : "unwind_vjp_rls_warp", s, K,
                                                   unw == 1 ? " UNWIND" : "") + variant_name(var);
                    run_orders(
                        ctx,
                        [&] {
                            cur.v = in.v;
                            dS.v = dS_in.v;
                            dvacc.poison();
                            draw.poison();
                            dtok.poison();
                        },
                        [&] {
                            if (unw == 2)
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, unwind_warp_kernel<kRls, DK>, D, cur.p(),
                                            (const float*)Kn.p(), (const float*)v.p(), (const float*)lam.p());
                            else if (unw == 1)
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, unwind_vjp_rls_warp_kernel<DK, true, PREG, ROWS>, D,
                                            cur.p(), dS.p(), (const float*)Kn.p(), (const float*)Knrm.p(),
                                            (const float*)v.p(), (const float*)lam.p(), (const float*)dsrc.p(),
                                            dvacc.p(), draw.p(), dtok.p());
                            else
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, unwind_vjp_rls_warp_kernel<DK, false, PREG, ROWS>, D,
                                            cur.p(), dS.p(), (const float*)Kn.p(), (const float*)Knrm.p(),
                                            (const float*)v.p(), (const float*)lam.p(), (const float*)dsrc.p(),
                                            dvacc.p(), draw.p(), dtok.p());
                        },
                        {&cur, &dS, &dvacc, &draw, &dtok});
                    std::vector<double> rS((size_t)cur.n), rdS((size_t)dS.n), rdv((size_t)dvacc.n),
                        rdraw((size_t)draw.n), rdt((size_t)dtok.n);
                    for (int n = 0; n < D.N; n++)
                        for (int h = 0; h < D.Hm; h++) {
                            const int64_t so = D.state_off(n, h), kh = D.key_off(n, h), vo = D.val_off(n, h);
                            auto st = dv_(in.p() + so, D.SS + D.PP);
                            auto g = dv_(dS_in.p() + so, D.SS + D.PP);
                            auto k = dv_(Kn.p() + kh, D.dk);
                            auto vv = dv_(v.p() + vo, D.dv);
                            const double lm = lam[h];
                            std::vector<double> scr((size_t)(4 * D.dk + 2 * D.dv));
                            if (unw >= 1) rls_unwind(st.data(), st.data() + D.SS, k.data(), vv.data(), lm, D.dv, D.dk, scr.data());
                            std::copy(st.begin(), st.end(), rS.begin() + so);
                            std::copy(g.begin(), g.end(), rdS.begin() + so);
                            if (unw == 2) continue;
                            std::vector<double> dk((size_t)D.dk, 0.0), dvv((size_t)D.dv, 0.0);
                            double dl = 0;
                            rls_write_vjp(st.data(), st.data() + D.SS, k.data(), vv.data(), lm, g.data(), g.data() + D.SS,
                                          dk.data(), dvv.data(), &dl, D.dv, D.dk, scr.data());
                            std::copy(g.begin(), g.end(), rdS.begin() + so);
                            for (int c = 0; c < D.dv; c++) rdv[(size_t)(vo + c)] = dsrc[vo + c] + dvv[(size_t)c];
                            l2n_backward(k.data(), (double)Knrm[D.tok_off(n, h)], dk.data(), dk.data(), D.dk);
                            std::copy(dk.begin(), dk.end(), rdraw.begin() + kh);
                            rdt[(size_t)D.tok_off(n, h)] = dl;
                        }
                    // the unwind divides by 1 - k.Pk and multiplies by gamma: looser than plain products
                    expect_close("state", cur, rS, 1e-4, ctx);
                    if (unw == 2) {
                        CHECK(dvacc.guard_intact());
                        return;
                    }
                    expect_close("dS/dP", dS, rdS, 1e-4, ctx);
                    expect_close("dvacc", dvacc, rdv, 1e-4, ctx);
                    expect_close("draw", draw, rdraw, 1e-4, ctx);
                    expect_close("dtok (dlambda)", dtok, rdt, 1e-4, ctx);
                }); });
}

TEST_CASE("emu: warp outer / delta VJP (outer also fused with its unwind) and outer unwind", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int K : dk_variants(s.dk))
            for (int mode = 0; mode < 4; mode++)  // 0 outer VJP, 1 outer fused, 2 delta VJP, 3 unwind_warp<outer>
                with_dk(K, [&](auto kc) {
                    constexpr int DK = decltype(kc)::value;
                    const Dims D = dims(s.N, s.Hm, s.dk, s.dv, false);
                    const bool delta = mode == 2, unwind = mode == 1 || mode == 3;
                    Rng r(5000 + s.N * 7 + K + mode);
                    Buf in(D.N * D.ST), cur(D.N * D.ST), dS_in(D.N * D.ST), dS(D.N * D.ST);
                    Buf Kn(D.N * D.HK), Knrm(D.N * D.Hm), v(D.N * D.d), lam(D.Hm), dsrc(D.N * D.d), beta(D.N * D.Hm);
                    Buf dvacc(D.N * D.d), draw(D.N * D.HK), dtok(D.N * D.Hm);
                    random_state(D, in, r);
                    random_state(D, dS_in, r);
                    random_keys(D, Kn, Knrm, r);
                    r.fill(v);
                    r.fill(dsrc);
                    for (int h = 0; h < D.Hm; h++) lam[h] = r.pos(0.85f, 1.f);
                    for (int64_t i = 0; i < beta.n; i++) beta[i] = r.pos(0.05f, 0.9f);
                    const char* names[4] = {"vjp_od_warp<outer>", "vjp_od_warp<outer>", "vjp_od_warp<delta>", "unwind_warp<outer>"};
                    const std::string ctx = ctx_of(names[mode], s, K, mode == 1 ? " UNWIND" : "");
                    run_orders(
                        ctx,
                        [&] {
                            cur.v = in.v;
                            dS.v = dS_in.v;
                            dvacc.poison();
                            draw.poison();
                            dtok.poison();
                        },
                        [&] {
                            const dim3 g(warp_blocks(D)), b(32 * kWarpsPerBlock);
                            const float *kn = Kn.p(), *knrm = Knrm.p(), *vp = v.p(), *lp = lam.p(), *bp = beta.p(),
                                        *ds = dsrc.p();
                            if (mode == 0)
                                emu::launch(g, b, 0, 0, vjp_od_warp_kernel<kOuter, DK, false>, D, cur.p(), dS.p(), kn, knrm, vp,
                                            lp, bp, ds, dvacc.p(), draw.p(), dtok.p());
                            else if (mode == 1)
                                emu::launch(g, b, 0, 0, vjp_od_warp_kernel<kOuter, DK, true>, D, cur.p(), dS.p(), kn, knrm, vp,
                                            lp, bp, ds, dvacc.p(), draw.p(), dtok.p());
                            else if (mode == 2)
                                emu::launch(g, b, 0, 0, vjp_od_warp_kernel<kDelta, DK, false>, D, cur.p(), dS.p(), kn, knrm, vp,
                                            lp, bp, ds, dvacc.p(), draw.p(), dtok.p());
                            else
                                emu::launch(g, b, 0, 0, unwind_warp_kernel<kOuter, DK>, D, cur.p(), kn, vp, lp);
                        },
                        {&cur, &dS, &dvacc, &draw, &dtok});
                    std::vector<double> rS((size_t)cur.n), rdS((size_t)dS.n), rdv((size_t)dvacc.n),
                        rdraw((size_t)draw.n), rdt((size_t)dtok.n);
                    for (int n = 0; n < D.N; n++)
                        for (int h = 0; h < D.Hm; h++) {
                            const int64_t so = D.state_off(n, h), kh = D.key_off(n, h), vo = D.val_off(n, h),
                                          nh = D.tok_off(n, h);
                            auto S = dv_(in.p() + so, D.SS);
                            auto G = dv_(dS_in.p() + so, D.SS);
                            auto k = dv_(Kn.p() + kh, D.dk);
                            auto vv = dv_(v.p() + vo, D.dv);
                            const double lm = lam[h];
                            if (unwind) outer_unwind(S.data(), k.data(), vv.data(), lm, D.dv, D.dk);
                            std::copy(S.begin(), S.end(), rS.begin() + so);
                            std::copy(G.begin(), G.end(), rdS.begin() + so);
                            if (mode == 3) continue;
                            std::vector<double> dk((size_t)D.dk, 0.0), dvv((size_t)D.dv, 0.0);
                            double dsc = 0;
                            if (delta) {
                                const double bt = beta[nh];
                                delta_write_vjp(S.data(), k.data(), vv.data(), bt, G.data(), dk.data(), dvv.data(), &dsc, D.dv, D.dk);
                                dsc = dsc * bt * (1.0 - bt / kBetaMax);
                            } else {
                                outer_write_vjp(S.data(), k.data(), vv.data(), lm, G.data(), dk.data(), dvv.data(), &dsc, D.dv, D.dk);
                            }
                            std::copy(G.begin(), G.end(), rdS.begin() + so);
                            for (int c = 0; c < D.dv; c++) rdv[(size_t)(vo + c)] = dsrc[vo + c] + dvv[(size_t)c];
                            l2n_backward(k.data(), (double)Knrm[nh], dk.data(), dk.data(), D.dk);
                            std::copy(dk.begin(), dk.end(), rdraw.begin() + kh);
                            rdt[(size_t)nh] = dsc;
                        }
                    expect_close("state", cur, rS, kTol, ctx);
                    if (mode == 3) {
                        CHECK(dvacc.guard_intact());
                        return;
                    }
                    expect_close("dS", dS, rdS, kTol, ctx);
                    expect_close("dvacc", dvacc, rdv, kTol, ctx);
                    expect_close("draw", draw, rdraw, kTol, ctx);
                    expect_close("dtok", dtok, rdt, kTol, ctx);
                });
}

TEST_CASE("emu: warp read backward (fp32 and bf16 dx, with and without residual gates)", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int K : dk_variants(s.dk))
            for (int mode = 0; mode < 3; mode++)  // 0 no gates, 1 gates, 2 gates + bf16 dx
                with_dk(K, [&](auto kc) {
                    constexpr int DK = decltype(kc)::value;
                    const Dims D = dims(s.N, s.Hm, s.dk, s.dv, (s.N & 1) != 0);  // rls layout for odd N
                    Rng r(6000 + s.N * 7 + K + mode);
                    Buf cur(D.N * D.ST), Qn(D.N * D.HK), Qnrm(D.N * D.Hm), dx(D.N * D.d), a(D.Hm * D.dv);
                    Buf dS_in(D.N * D.ST), dS(D.N * D.ST), draw(D.N * D.HK), prod(D.N * D.d);
                    random_state(D, cur, r);
                    random_state(D, dS_in, r);
                    random_keys(D, Qn, Qnrm, r);
                    r.fill(dx);
                    r.fill(a);
                    std::vector<bf16> dxb((size_t)dx.n);
                    for (int64_t i = 0; i < dx.n; i++) {
                        dxb[(size_t)i] = __float2bfloat16(dx[i]);
                        if (mode == 2) dx[i] = __bfloat162float(dxb[(size_t)i]);  // reference sees the bf16 values
                    }
                    const float* ap = mode ? a.p() : nullptr;
                    const std::string ctx = ctx_of("read_bwd_warp", s, K, mode == 0 ? "" : mode == 1 ? " gates" : " gates bf16");
                    run_orders(
                        ctx,
                        [&] {
                            dS.v = dS_in.v;
                            draw.poison();
                            prod.poison();
                        },
                        [&] {
                            const dim3 g(warp_blocks(D)), b(32 * kWarpsPerBlock);
                            if (mode == 2)
                                emu::launch(g, b, 0, 0, read_bwd_warp_kernel<bf16, DK>, D, (const float*)cur.p(),
                                            (const float*)Qn.p(), (const float*)Qnrm.p(), (const bf16*)dxb.data(), ap,
                                            dS.p(), draw.p(), prod.p());
                            else
                                emu::launch(g, b, 0, 0, read_bwd_warp_kernel<float, DK>, D, (const float*)cur.p(),
                                            (const float*)Qn.p(), (const float*)Qnrm.p(), (const float*)dx.p(), ap,
                                            dS.p(), draw.p(), prod.p());
                        },
                        {&dS, &draw, &prod});
                    std::vector<double> rdS(dS_in.v.begin(), dS_in.v.begin() + dS.n), rdraw((size_t)draw.n),
                        rprod((size_t)prod.n);
                    for (int n = 0; n < D.N; n++)
                        for (int h = 0; h < D.Hm; h++) {
                            const int64_t so = D.state_off(n, h), kh = D.key_off(n, h), vo = D.val_off(n, h);
                            auto S = dv_(cur.p() + so, D.SS);
                            auto q = dv_(Qn.p() + kh, D.dk);
                            std::vector<double> rr((size_t)D.dv), dr((size_t)D.dv), dq((size_t)D.dk, 0.0);
                            ldm_read(S.data(), q.data(), rr.data(), D.dv, D.dk);
                            for (int c = 0; c < D.dv; c++) {
                                dr[(size_t)c] = ap ? (double)a[h * D.dv + c] * dx[vo + c] : (double)dx[vo + c];
                                rprod[(size_t)(vo + c)] = dx[vo + c] * rr[(size_t)c];
                            }
                            ldm_read_vjp(S.data(), q.data(), dr.data(), rdS.data() + so, dq.data(), D.dv, D.dk);
                            l2n_backward(q.data(), (double)Qnrm[D.tok_off(n, h)], dq.data(), dq.data(), D.dk);
                            std::copy(dq.begin(), dq.end(), rdraw.begin() + kh);
                        }
                    expect_close("dS", dS, rdS, kTol, ctx);
                    expect_close("draw", draw, rdraw, kTol, ctx);
                    if (ap) expect_close("prod32", prod, rprod, kTol, ctx);
                    else CHECK(std::isnan(prod[0]));  // not written without gates
                });
}

// The row pass of the fused backward (ldmk::row_backward_kernel, then colsum_final_kernel over its
// token slices): dsrc, d_o, src32, srcT of sublayer j from dsrc, dq·W_q, dx, dv, dk·W_k, O and
// src32, and (with the residual) the gate's gradient gA += Σ_n prod, against the formula in double.
// Shapes: HK below and at the register widths 16, 32 (padding), d not a multiple of the block
// width (idle threads), N not a multiple of the token tile; token slices from production's grid
// and forced to 1 and 2 (one block walks several tiles). dv (type T) aliasing d_o (production) and
// not, in fp32 and in bf16 (bf16 rows and weights); with and without the residual and the pending dx;
// with the residual at HK <= 16 also with and without the weight gradients (DW).
TEST_CASE("emu: fused backward row pass (dsrc, d_o, h_{j-1}) against the formula", "[emu][ldm]") {
    struct RowShape {
        int N, d, HK;
    };
    const RowShape shapes[] = {{70, 300, 32}, {37, 64, 12}, {5, 257, 16}, {33, 40, 5}, {66, 256, 17}};
    for (const RowShape& sh : shapes)
        for (int type = 0; type < 4; type++)  // 0 fp32, 1 fp32 with dv aliasing d_o, 2 bf16, 3 bf16 aliasing
            for (int residual = 0; residual < 2; residual++)
                for (int has_dx = 0; has_dx < 2; has_dx++)
                    for (int gy : {0, 1, 2})  // 0: production's grid
                    for (int dw = 0; dw < 2; dw++) {
                        if (!residual && has_dx) continue;  // (production: dx is pending only with the residual)
                        if (dw && !(residual && sh.HK <= kRowDwMaxK)) continue;
                        const bool bf = type >= 2, alias = type == 1 || type == 3;
                        const int N = sh.N, d = sh.d, HK = sh.HK;
                        const int64_t nd = (int64_t)N * d;
                        const std::string ctx = strprintf("row_backward N=%d d=%d HK=%d %s%s%s%s%s grid.y=%d", N, d, HK,
                                                          bf ? "bf16" : "fp32", alias ? " dv=d_o" : "",
                                                          residual ? " residual" : "", has_dx ? " dx" : "",
                                                          dw ? " dW" : "", gy);
                        Rng r(7000 + N + d + HK + 10 * type + 100 * residual + 1000 * has_dx + gy + 50 * dw);
                        auto rnd = [&](int64_t n) {  // T-representable values (the reference sees what the kernel reads)
                            Buf b(n);
                            r.fill(b);
                            if (bf)
                                for (int64_t i = 0; i < n; i++) b[i] = __bfloat162float(__float2bfloat16(b[i]));
                            return b;
                        };
                        Buf dq(N * HK), dk(N * HK), dsrc_in(nd), src_in(nd);
                        r.fill(dq);
                        r.fill(dk);
                        r.fill(dsrc_in, 0.1f, 4.f);
                        r.fill(src_in, 0.1f, 4.f);
                        Buf Wq = rnd(HK * d), Wk = rnd(HK * d), dx = rnd(nd), O = rnd(nd), prod = rnd(nd), dv_in = rnd(nd);
                        Buf gA_in(d), gA(d), gWq_in(HK * d), gWk_in(HK * d), gWq(HK * d), gWk(HK * d);
                        r.fill(gA_in);
                        r.fill(gWq_in);
                        r.fill(gWk_in);
                        Buf dsrc(nd), src32(nd), dvb(nd), d_o(nd), srcT(nd);  // outputs (d_o, srcT as floats)
                        auto bfv = [](const Buf& b) {
                            std::vector<bf16> v((size_t)b.n + kGuard);
                            for (int64_t i = 0; i < b.n; i++) v[(size_t)i] = __float2bfloat16(b[i]);
                            return v;
                        };
                        std::vector<bf16> Wqb = bfv(Wq), Wkb = bfv(Wk), dxb = bfv(dx), Ob = bfv(O), prodb = bfv(prod);
                        std::vector<bf16> d_ob((size_t)nd + kGuard), srcTb((size_t)nd + kGuard), dvbb = bfv(dv_in);
                        auto poison_b = [&](std::vector<bf16>& v) {
                            for (auto& x : v) x = __float2bfloat16(std::nanf(""));
                        };
                        dim3 g = row_backward_grid(N, d);
                        if (gy) g.y = gy;
                        Buf gpart((int64_t)g.y * d), dwpart(2 * (int64_t)g.y * HK * d);
                        // the slices' sum into gA (row_backward's second launch)
                        auto final_sum = [&] {
                            if (residual)
                                emu::launch(dim3((unsigned)((d + 127) / 128)), dim3(128), 0, 0, colsum_final_kernel,
                                            (const float*)gpart.p(), (int)g.y, d, (const float*)nullptr, gA.p());
                            if (dw) {  // row_backward's launches: the slices of dW_q, then of dW_k
                                const int C = HK * d;
                                emu::launch(dim3((unsigned)((C + 127) / 128)), dim3(128), 0, 0, colsum_final_kernel,
                                            (const float*)dwpart.p(), (int)g.y, C, (const float*)nullptr, gWq.p());
                                emu::launch(dim3((unsigned)((C + 127) / 128)), dim3(128), 0, 0, colsum_final_kernel,
                                            (const float*)dwpart.p() + (int64_t)g.y * C, (int)g.y, C,
                                            (const float*)nullptr, gWk.p());
                            }
                        };
                        run_orders(
                            ctx,
                            [&] {
                                dsrc.v = dsrc_in.v;
                                src32.v = src_in.v;
                                dvb.v = dv_in.v;
                                gA.v = gA_in.v;
                                gWq.v = gWq_in.v;
                                gWk.v = gWk_in.v;
                                gpart.poison();
                                dwpart.poison();
                                d_o.poison();
                                srcT.poison();
                                poison_b(d_ob);
                                poison_b(srcTb);
                                if (bf && alias)  // dv in d_o's place, as production writes it
                                    for (int64_t i = 0; i < nd; i++) d_ob[(size_t)i] = dvbb[(size_t)i];
                            },
                            [&] {
                                if (bf) {
                                    RowBackward<bf16> p;
                                    p.N = N; p.d = d; p.HK = HK; p.dq = dq.p(); p.dk = dk.p();
                                    p.Wq = Wqb.data(); p.Wk = Wkb.data(); p.dx = has_dx ? dxb.data() : nullptr;
                                    p.dv = alias ? d_ob.data() : dvbb.data(); p.dsrc = dsrc.p(); p.d_o = d_ob.data(); p.O = Ob.data();
                                    p.src32 = src32.p(); p.srcT = srcTb.data(); p.residual = residual;
                                    if (residual) { p.prod = prodb.data(); p.gpart = gpart.p(); p.gA = gA.p(); }
                                    if (dw) { p.dwpart = dwpart.p(); p.gWq = gWq.p(); p.gWk = gWk.p(); }
                                    if (dw) emu::launch(g, kRowThreads, 0, 0, row_backward_kernel<bf16, 16, true>, p);
                                    else if (HK <= 16) emu::launch(g, kRowThreads, 0, 0, row_backward_kernel<bf16, 16>, p);
                                    else emu::launch(g, kRowThreads, 0, 0, row_backward_kernel<bf16, 32>, p);
                                    final_sum();
                                    for (size_t i = 0; i < d_ob.size(); i++) {  // (guards included)
                                        d_o.v[i] = __bfloat162float(d_ob[i]);
                                        srcT.v[i] = __bfloat162float(srcTb[i]);
                                    }
                                } else {
                                    RowBackward<float> p;
                                    p.N = N; p.d = d; p.HK = HK; p.dq = dq.p(); p.dk = dk.p();
                                    p.Wq = Wq.p(); p.Wk = Wk.p(); p.dx = has_dx ? dx.p() : nullptr;
                                    p.dv = dvb.p(); p.dsrc = dsrc.p(); p.d_o = alias ? dvb.p() : d_o.p(); p.O = O.p();
                                    p.src32 = src32.p(); p.srcT = nullptr; p.residual = residual;
                                    if (residual) { p.prod = prod.p(); p.gpart = gpart.p(); p.gA = gA.p(); }
                                    if (dw) { p.dwpart = dwpart.p(); p.gWq = gWq.p(); p.gWk = gWk.p(); }
                                    if (dw) emu::launch(g, kRowThreads, 0, 0, row_backward_kernel<float, 16, true>, p);
                                    else if (HK <= 16) emu::launch(g, kRowThreads, 0, 0, row_backward_kernel<float, 16>, p);
                                    else emu::launch(g, kRowThreads, 0, 0, row_backward_kernel<float, 32>, p);
                                    final_sum();
                                    if (alias) d_o.v = dvb.v;
                                }
                            },
                            {&dsrc, &src32, &d_o, &srcT, &gA, &gWq, &gWk});
                        std::vector<double> rdsrc((size_t)nd), rdo((size_t)nd), rsrc((size_t)nd);
                        for (int n = 0; n < N; n++)
                            for (int c = 0; c < d; c++) {
                                const int64_t i = (int64_t)n * d + c;
                                double gq = 0, gk = 0;
                                for (int k = 0; k < HK; k++) {
                                    gq += (double)dq[(int64_t)n * HK + k] * Wq[(int64_t)k * d + c];
                                    gk += (double)dk[(int64_t)n * HK + k] * Wk[(int64_t)k * d + c];
                                }
                                const double sv = dsrc_in[i] + gq + (has_dx ? (double)dx[i] : 0.0);
                                rdo[(size_t)i] = dv_in[i] + gk + sv;
                                rdsrc[(size_t)i] = residual ? sv : 0.0;
                                rsrc[(size_t)i] = residual ? (double)src_in[i] - O[i] : (double)O[i];
                            }
                        std::vector<double> rgA(gA_in.v.begin(), gA_in.v.begin() + d);
                        if (residual)
                            for (int n = 0; n < N; n++)
                                for (int c = 0; c < d; c++) rgA[(size_t)c] += prod[(int64_t)n * d + c];
                        // gA: fp32 sums of N + 1 <= 71 terms of magnitude <= 1, |error| <= 71·2^-24·71 < 3.1e-4
                        expect_close("gA", gA, rgA, 3.1e-4, ctx);
                        if (dw) {  // dW_q = Σ_n dq·T(h_j), dW_k = Σ_n dk·O_j, added to the initial values
                            std::vector<double> rq(gWq_in.v.begin(), gWq_in.v.begin() + HK * d),
                                rk(gWk_in.v.begin(), gWk_in.v.begin() + HK * d);
                            for (int n = 0; n < N; n++)
                                for (int k = 0; k < HK; k++)
                                    for (int c = 0; c < d; c++) {
                                        const int64_t i = (int64_t)n * d + c;
                                        const double h = bf ? (double)__bfloat162float(__float2bfloat16(src_in[i]))
                                                            : (double)src_in[i];
                                        rq[(size_t)k * d + c] += (double)dq[(int64_t)n * HK + k] * h;
                                        rk[(size_t)k * d + c] += (double)dk[(int64_t)n * HK + k] * O[i];
                                    }
                            // fp32 sums of at most N + slices + 1 <= 72 terms, Σ|terms| <= 70·1·4 + 1 = 281:
                            // |error| <= 72·2^-24·281 < 1.3e-3 absolute (expect_close scales its
                            // tolerance by max(1, max|ref|): divided out here)
                            auto absolute = [](const std::vector<double>& ref, double bound) {
                                double m = 1.0;
                                for (double v : ref) m = std::max(m, std::fabs(v));
                                return bound / m;
                            };
                            expect_close("gWq", gWq, rq, absolute(rq, 1.3e-3), ctx);
                            expect_close("gWk", gWk, rk, absolute(rk, 1.3e-3), ctx);
                        }
                        expect_close("dsrc", dsrc, rdsrc, kTol, ctx);
                        expect_close("src32", src32, rsrc, kTol, ctx);
                        expect_close("d_o", d_o, rdo, bf ? 8e-3 : kTol, ctx);
                        if (bf) expect_close("srcT", srcT, rsrc, 8e-3, ctx);
                        else CHECK(std::isnan(srcT[0]));  // fp32: srcT is src32 (not written)
                    }
}

// The production fused rls passes of train_ldm.cu (doc/cuda.md "Fused passes") and their
// workbench variants (rls_variants): forward write i then read i+1 of the new state; backward read
// i+1's backward on the state after write i, then the unwind + VJP of write i (dsrc32 given or, as
// production, null). Reference: rls_write, l2n_forward, ldm_read / ldm_read_vjp, rls_unwind,
// rls_write_vjp and l2n_backward of math/ldm_math.h in double, composed in the kernels' order.
// One row per step (variant 1) must give production's bits exactly (row batching changes no
// arithmetic).
TEST_CASE("emu: fused rls passes (write + read, read backward + unwind + VJP), every variant", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int K : dk_variants(s.dk))
            for (int mode = 0; mode < 2; mode++) {  // 0 no gates, dsrc32 null; 1 gates, dsrc32 given
                std::vector<std::vector<float>> prod_out;  // production's outputs, in order
                for (int var : rls_variants(K))
                    with_dk(K, [&](auto kc) { constexpr int DK = decltype(kc)::value;
                        with_variant<DK>(var, [&](auto pc, auto rf, auto rb) {
                        constexpr int PREG = decltype(pc)::value, RF = decltype(rf)::value, RB = decltype(rb)::value;
                        const Dims D = dims(s.N, s.Hm, s.dk, s.dv, true);
                        Rng r(8000 + s.N * 7 + K + mode);  // the same inputs for every variant
                        Buf in(D.N * D.ST), cur(D.N * D.ST), kraw(D.N * D.HK), qraw(D.N * D.HK), v(D.N * D.d);
                        Buf lam(D.Hm), src(D.N * D.d), a(D.Hm * D.dv), Kn(D.N * D.HK), Knrm(D.N * D.Hm);
                        Buf Qn(D.N * D.HK), Qnrm(D.N * D.Hm), x(D.N * D.d);
                        random_state(D, in, r);
                        r.fill(kraw);
                        r.fill(qraw);
                        r.fill(v);
                        r.fill(src);
                        r.fill(a);
                        for (int h = 0; h < D.Hm; h++) lam[h] = r.pos(0.85f, 1.f);
                        const float* ap = mode ? a.p() : nullptr;
                        const std::string ctx = ctx_of("write_read_rls_warp", s, K, mode ? " gates" : "") + variant_name(var);
                        FusedRead<float> ff;
                        ff.raw = qraw.p();
                        ff.Qn = Qn.p();
                        ff.Qnrm = Qnrm.p();
                        ff.src32 = src.p();
                        ff.a = ap;
                        ff.x = x.p();
                        run_orders(
                            ctx,
                            [&] {
                                cur.poison();
                                for (Buf* b : {&Kn, &Knrm, &Qn, &Qnrm, &x}) b->poison();
                            },
                            [&] {
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0, write_read_rls_warp_kernel<float, DK, PREG, RF>,
                                            D, cur.p(), (const float*)in.p(), (const float*)kraw.p(), Kn.p(), Knrm.p(),
                                            (const float*)v.p(), (const float*)lam.p(), ff);
                            },
                            {&cur, &Kn, &Knrm, &Qn, &Qnrm, &x});
                        std::vector<double> rS((size_t)cur.n), rKn((size_t)Kn.n), rKnrm((size_t)Knrm.n),
                            rQn((size_t)Qn.n), rQnrm((size_t)Qnrm.n), rx((size_t)x.n);
                        for (int n = 0; n < D.N; n++)
                            for (int h = 0; h < D.Hm; h++) {
                                const int64_t so = D.state_off(n, h), kh = D.key_off(n, h), vo = D.val_off(n, h),
                                              nh = D.tok_off(n, h);
                                auto k = dv_(kraw.p() + kh, D.dk), q = dv_(qraw.p() + kh, D.dk);
                                rKnrm[(size_t)nh] = l2n_forward(k.data(), k.data(), D.dk);
                                rQnrm[(size_t)nh] = l2n_forward(q.data(), q.data(), D.dk);
                                std::copy(k.begin(), k.end(), rKn.begin() + kh);
                                std::copy(q.begin(), q.end(), rQn.begin() + kh);
                                auto st = dv_(in.p() + so, D.SS + D.PP);
                                auto vv = dv_(v.p() + vo, D.dv);
                                std::vector<double> u((size_t)D.dk), rr((size_t)D.dv);
                                rls_write(st.data(), st.data() + D.SS, k.data(), vv.data(), (double)lam[h], D.dv, D.dk, u.data());
                                std::copy(st.begin(), st.end(), rS.begin() + so);
                                ldm_read(st.data(), q.data(), rr.data(), D.dv, D.dk);
                                for (int c = 0; c < D.dv; c++)
                                    rx[(size_t)(vo + c)] = ap ? src[vo + c] + (double)a[h * D.dv + c] * rr[(size_t)c] : rr[(size_t)c];
                            }
                        expect_close("state", cur, rS, kTol, ctx);
                        expect_close("Kn", Kn, rKn, kTol, ctx);
                        expect_close("Knrm", Knrm, rKnrm, kTol, ctx);
                        expect_close("Qn", Qn, rQn, kTol, ctx);
                        expect_close("Qnrm", Qnrm, rQnrm, kTol, ctx);
                        expect_close("x", x, rx, kTol, ctx);

                        // backward of the same pair, from the state after the write (the kernel's cur)
                        Buf after = cur, dS_in(D.N * D.ST), dS(D.N * D.ST), dx(D.N * D.d), dsrc(D.N * D.d);
                        Buf dvacc(D.N * D.d), draw(D.N * D.HK), dtok(D.N * D.Hm), qdraw(D.N * D.HK), prod(D.N * D.d);
                        random_state(D, dS_in, r);  // any values
                        r.fill(dx);
                        r.fill(dsrc);
                        const float* dsp = mode ? dsrc.p() : nullptr;
                        FusedRead<float> fb;
                        fb.Qn = Qn.p();
                        fb.Qnrm = Qnrm.p();
                        fb.a = ap;
                        fb.dx = dx.p();
                        fb.draw = qdraw.p();
                        fb.prod = prod.p();
                        const std::string bctx =
                            ctx_of("read_bwd_unwind_vjp_rls_warp", s, K, mode ? " gates dsrc" : "") + variant_name(var);
                        run_orders(
                            bctx,
                            [&] {
                                cur.v = after.v;
                                dS.v = dS_in.v;
                                for (Buf* b : {&dvacc, &draw, &dtok, &qdraw, &prod}) b->poison();
                            },
                            [&] {
                                emu::launch(warp_blocks(D), 32 * kWarpsPerBlock, 0, 0,
                                            read_bwd_unwind_vjp_rls_warp_kernel<float, DK, PREG, RB>, D, cur.p(), dS.p(),
                                            (const float*)Kn.p(), (const float*)Knrm.p(), (const float*)v.p(),
                                            (const float*)lam.p(), dsp, dvacc.p(), draw.p(), dtok.p(), fb);
                            },
                            {&cur, &dS, &dvacc, &draw, &dtok, &qdraw, &prod});
                        std::vector<double> bS((size_t)cur.n), bdS((size_t)dS.n), bdv((size_t)dvacc.n),
                            bdraw((size_t)draw.n), bdt((size_t)dtok.n), bq((size_t)qdraw.n), bprod((size_t)prod.n);
                        for (int n = 0; n < D.N; n++)
                            for (int h = 0; h < D.Hm; h++) {
                                const int64_t so = D.state_off(n, h), kh = D.key_off(n, h), vo = D.val_off(n, h),
                                              nh = D.tok_off(n, h);
                                auto st = dv_(after.p() + so, D.SS + D.PP);
                                auto g = dv_(dS_in.p() + so, D.SS + D.PP);
                                auto k = dv_(Kn.p() + kh, D.dk), q = dv_(Qn.p() + kh, D.dk);
                                auto vv = dv_(v.p() + vo, D.dv);
                                const double lm = lam[h];
                                // read i+1's backward on the state after write i
                                std::vector<double> rr((size_t)D.dv), dr((size_t)D.dv), dq((size_t)D.dk, 0.0);
                                ldm_read(st.data(), q.data(), rr.data(), D.dv, D.dk);
                                for (int c = 0; c < D.dv; c++) {
                                    dr[(size_t)c] = ap ? (double)a[h * D.dv + c] * dx[vo + c] : (double)dx[vo + c];
                                    bprod[(size_t)(vo + c)] = dx[vo + c] * rr[(size_t)c];
                                }
                                ldm_read_vjp(st.data(), q.data(), dr.data(), g.data(), dq.data(), D.dv, D.dk);
                                l2n_backward(q.data(), (double)Qnrm[nh], dq.data(), dq.data(), D.dk);
                                std::copy(dq.begin(), dq.end(), bq.begin() + kh);
                                // unwind write i, then its VJP with the read's dS added
                                std::vector<double> scr((size_t)(4 * D.dk + 2 * D.dv)), dk((size_t)D.dk, 0.0),
                                    dvv((size_t)D.dv, 0.0);
                                rls_unwind(st.data(), st.data() + D.SS, k.data(), vv.data(), lm, D.dv, D.dk, scr.data());
                                std::copy(st.begin(), st.end(), bS.begin() + so);
                                double dl = 0;
                                rls_write_vjp(st.data(), st.data() + D.SS, k.data(), vv.data(), lm, g.data(),
                                              g.data() + D.SS, dk.data(), dvv.data(), &dl, D.dv, D.dk, scr.data());
                                std::copy(g.begin(), g.end(), bdS.begin() + so);
                                for (int c = 0; c < D.dv; c++)
                                    bdv[(size_t)(vo + c)] = (dsp ? (double)dsrc[vo + c] : 0.0) + dvv[(size_t)c];
                                l2n_backward(k.data(), (double)Knrm[nh], dk.data(), dk.data(), D.dk);
                                std::copy(dk.begin(), dk.end(), bdraw.begin() + kh);
                                bdt[(size_t)nh] = dl;
                            }
                        // the unwind divides by 1 - k.Pk and multiplies by gamma: looser than plain products
                        expect_close("state (unwound)", cur, bS, 1e-4, bctx);
                        expect_close("dS/dP", dS, bdS, 1e-4, bctx);
                        expect_close("dvacc", dvacc, bdv, 1e-4, bctx);
                        expect_close("draw (key)", draw, bdraw, 1e-4, bctx);
                        expect_close("dtok (dlambda)", dtok, bdt, 1e-4, bctx);
                        expect_close("draw (query)", qdraw, bq, kTol, bctx);
                        if (ap) expect_close("prod32", prod, bprod, kTol, bctx);
                        else CHECK(std::isnan(prod[0]));  // not written without gates
                        // every output of both passes, with its guard values
                        std::vector<std::vector<float>> outs;
                        for (const Buf* b : {&after, &Kn, &Knrm, &Qn, &Qnrm, &x, &cur, &dS, &dvacc, &draw, &dtok, &qdraw, &prod})
                            outs.push_back(b->v);
                        if (var == 0) {
                            prod_out = std::move(outs);
                        } else if (var == 1) {
                            REQUIRE(prod_out.size() == outs.size());
                            for (size_t o = 0; o < outs.size(); o++) {
                                INFO(bctx << ": output " << o << " differs from production's bits");
                                std::vector<uint32_t> a1, b1;
                                for (float f : outs[o]) a1.push_back(bits(f));
                                for (float f : prod_out[o]) b1.push_back(bits(f));
                                CHECK(a1 == b1);
                            }
                        }
                    }); });
            }
}

TEST_CASE("emu: windowed rls backward (workbench ldm_window_bwd.cuh) against unwinding write by write",
          "[emu][ldm]") {
    // A window of m writes from a random state, applied in double and rounded to fp32 (so the
    // unwind is the exact inverse it is in training); steps t = m-1..0 of the windowed kernel
    // against ldm_read_vjp + rls_unwind + rls_write_vjp per write (wbwd_reference), values in
    // fp32 and bf16; full windows and remainder windows (m < w), w up to kWbwdMaxWindow.
    const Shape shapes[] = {{5, 1, 4, 7}, {13, 2, 8, 5}, {7, 3, 16, 3}, {11, 2, 5, 37}, {6, 2, 12, 70}};
    const int wm[][2] = {{1, 1}, {3, 3}, {3, 2}, {4, 4}, {8, 8}, {8, 5}};
    int si = 0;
    for (const Shape& s : shapes) {
        si++;
        for (const auto& x : wm)
            for (int bf = 0; bf < 2; bf++) {
                const int w = x[0], m = x[1];
                if (bf && w != 4 && w != 8) continue;  // bf16 values: two window lengths suffice
                const Dims D = dims(s.N, s.Hm, s.dk, s.dv, true);
                const int64_t NHK = (int64_t)D.N * D.HK, Nd = (int64_t)D.N * D.d, NH = (int64_t)D.N * D.Hm;
                Rng r(9000 + 31 * si + 7 * w + m + 100 * bf);
                Buf cur_in(D.N * D.ST), dS_in(D.N * D.ST), Kn(m * NHK), Knrm(m * NH), Qn(m * NHK), Qnrm(m * NH);
                Buf V(m * Nd), dR(m * Nd), lam(m * D.Hm);
                random_state(D, cur_in, r);
                for (int t = 0; t < m; t++) {
                    Buf kk(NHK), kq(NHK), nk(NH), nq(NH);
                    random_keys(D, kk, nk, r);
                    random_keys(D, kq, nq, r);
                    std::copy(kk.p(), kk.p() + NHK, Kn.p() + t * NHK);
                    std::copy(kq.p(), kq.p() + NHK, Qn.p() + t * NHK);
                    for (int h = 0; h < D.Hm; h++) lam[t * D.Hm + h] = r.pos(0.9f, 1.f);
                }
                r.fill(V);
                r.fill(dR);
                std::vector<bf16> Vb((size_t)(m * Nd + kGuard), __float2bfloat16(0.f));
                for (int64_t i = 0; i < m * Nd; i++) {
                    Vb[(size_t)i] = __float2bfloat16(V[i]);
                    if (bf) V[i] = __bfloat162float(Vb[(size_t)i]);  // the reference sees the bf16 values
                }
                // the window's writes in double from the random start state, rounded to fp32
                {
                    std::vector<double> u((size_t)D.dk);
                    for (int n = 0; n < D.N; n++)
                        for (int h = 0; h < D.Hm; h++) {
                            auto st = dv_(cur_in.p() + D.state_off(n, h), D.SS + D.PP);
                            for (int t = 0; t < m; t++) {
                                auto k = dv_(Kn.p() + t * NHK + D.key_off(n, h), D.dk);
                                auto v = dv_(V.p() + t * Nd + D.val_off(n, h), D.dv);
                                rls_write(st.data(), st.data() + D.SS, k.data(), v.data(), (double)lam[t * D.Hm + h],
                                          D.dv, D.dk, u.data());
                            }
                            for (int i = 0; i < D.SS + D.PP; i++) cur_in[D.state_off(n, h) + i] = (float)st[(size_t)i];
                        }
                }
                r.fill(dS_in);
                const int CW = wbwd_coef_floats(wbwd_width(D.dk), w);
                Buf cur(D.N * D.ST), dS(D.N * D.ST), coef(NH * CW), dq(m * NHK), dkey(m * NHK), dv(m * Nd), dlam(m * NH);
                const std::string ctx = strprintf("wbwd_rls_warp N=%d Hm=%d dk=%d dv=%d w=%d m=%d%s", s.N, s.Hm, s.dk, s.dv,
                                                  w, m, bf ? " bf16" : " fp32");
                auto launch = [&](auto tag) {
                    using T = decltype(tag);
                    WbwdIn<T> in{Kn.p(), Qn.p(), nullptr, dR.p(), lam.p(), m, w};
                    if constexpr (std::is_same<T, float>::value) in.V = V.p();
                    else in.V = Vb.data();
                    for (int t = m - 1; t >= 0; t--)
                        wbwd_rls_step<T>(D, cur.p(), dS.p(), coef.p(), in, t,
                                         WbwdOut{dq.p() + t * NHK, dkey.p() + t * NHK, dv.p() + t * Nd, dlam.p() + t * NH}, 0);
                };
                run_orders(
                    ctx,
                    [&] {
                        cur.v = cur_in.v;
                        dS.v = dS_in.v;
                        coef.poison();
                        dq.poison();
                        dkey.poison();
                        dv.poison();
                        dlam.poison();
                    },
                    [&] {
                        if (bf) launch(bf16(__float2bfloat16(0.f)));
                        else launch(0.f);
                    },
                    {&cur, &dS, &dq, &dkey, &dv, &dlam});
                std::vector<double> rst = dv_(cur_in.p(), cur_in.n), rdst = dv_(dS_in.p(), dS_in.n), rdq, rdk, rdv, rdl;
                wbwd_reference(D, m, rst, rdst, dv_(Kn.p(), Kn.n), dv_(Qn.p(), Qn.n), dv_(V.p(), V.n), dv_(dR.p(), dR.n),
                               dv_(lam.p(), lam.n), rdq, rdk, rdv, rdl);
                // the unwind divides by 1 - k.Pk and multiplies by gamma (as in the fused unwind's test)
                expect_close("state at the window start", cur, rst, 1e-4, ctx);
                expect_close("dS/dP at the window start", dS, rdst, 1e-4, ctx);
                expect_close("dq", dq, rdq, 1e-4, ctx);
                expect_close("dkey", dkey, rdk, 1e-4, ctx);
                expect_close("dv", dv, rdv, 1e-4, ctx);
                expect_close("dlam", dlam, rdl, 1e-4, ctx);
            }
    }
    // refusals: not rls, d_k above the warp width, w outside 1..kWbwdMaxWindow, m outside 1..w, t
    // outside 0..m-1
    const Dims D = dims(3, 1, 8, 5, true);
    Dims Dn = dims(3, 1, 8, 5, false), Dw = dims(3, 1, 17, 5, true);
    WbwdIn<float> in{nullptr, nullptr, nullptr, nullptr, nullptr, 2, 4};
    const WbwdOut out{nullptr, nullptr, nullptr, nullptr};
    CHECK_THROWS_AS(wbwd_rls_step<float>(Dn, nullptr, nullptr, nullptr, in, 0, out, 0), Error);
    CHECK_THROWS_AS(wbwd_rls_step<float>(Dw, nullptr, nullptr, nullptr, in, 0, out, 0), Error);
    CHECK_THROWS_AS(wbwd_rls_step<float>(D, nullptr, nullptr, nullptr, in, 2, out, 0), Error);
    in.w = kWbwdMaxWindow + 1;
    CHECK_THROWS_AS(wbwd_rls_step<float>(D, nullptr, nullptr, nullptr, in, 0, out, 0), Error);
    in.w = 2;
    in.m = 3;
    CHECK_THROWS_AS(wbwd_rls_step<float>(D, nullptr, nullptr, nullptr, in, 0, out, 0), Error);
    in.m = 0;
    CHECK_THROWS_AS(wbwd_rls_step<float>(D, nullptr, nullptr, nullptr, in, 0, out, 0), Error);
    in.m = 1;
    CHECK_THROWS_AS(wbwd_rls_step<float>(D, nullptr, nullptr, nullptr, in, -1, out, 0), Error);
    in.w = 0;
    CHECK_THROWS_AS(wbwd_rls_step<float>(D, nullptr, nullptr, nullptr, in, 0, out, 0), Error);
}

TEST_CASE("emu: drift kernel (max |S - S_ref|, max |δP - δP_ref|, integer atomicMax)", "[emu][ldm]") {
    for (const Shape& s : kShapes)
        for (int withref = 0; withref < 2; withref++) {
            const Dims D = dims(s.N, s.Hm, s.dk, s.dv, true);
            Rng r(7000 + s.N + withref);
            Buf cur(D.N * D.ST), ref(D.N * D.ST);
            random_state(D, cur, r);
            random_state(D, ref, r);
            const float delta = 0.7f;
            unsigned out[2 + 2];
            const std::string ctx = strprintf("drift N=%d Hm=%d dk=%d dv=%d ref=%d", s.N, s.Hm, s.dk, s.dv, withref);
            double ms = 0, mp = 0;
            for (int n = 0; n < D.N; n++)
                for (int h = 0; h < D.Hm; h++) {
                    const float* S = cur.p() + D.state_off(n, h);
                    const float* R = ref.p() + D.state_off(n, h);
                    for (int i = 0; i < D.SS; i++) ms = std::max(ms, std::fabs((double)S[i] - (withref ? R[i] : 0.f)));
                    for (int p = 0; p < D.PP; p++) {
                        const double rv = withref ? (double)delta * R[D.SS + p] : (p / D.dk == p % D.dk ? 1.0 : 0.0);
                        mp = std::max(mp, std::fabs((double)delta * S[D.SS + p] - rv));
                    }
                }
            Buf o(2);
            run_orders(
                ctx, [&] { out[0] = out[1] = 0; out[2] = out[3] = 0xdeadbeefu; },
                [&] {
                    emu::launch(elem_blocks((int64_t)D.N * D.ST), 256, 0, 0, drift_kernel, D, (const float*)cur.p(),
                                withref ? (const float*)ref.p() : (const float*)nullptr, delta, out);
                    o[0] = __uint_as_float(out[0]);
                    o[1] = __uint_as_float(out[1]);
                },
                {&o});
            INFO(ctx);
            CHECK(out[2] == 0xdeadbeefu);
            CHECK(std::fabs(o[0] - ms) <= 1e-6 * std::max(1.0, ms));
            CHECK(std::fabs(o[1] - mp) <= 1e-6 * std::max(1.0, mp));
        }
}

TEST_CASE("emu: the emulator itself (shuffles, ballot, barriers, shared-memory poison)", "[emu]") {
    // A kernel written here: per warp, __shfl_*_sync variants and a block reduction via shared.
    struct K {
        static void kern(int* out) {
            __shared__ int sh__emu[64];  // as gen.py writes a __shared__ declaration
            auto& sh = emu::block_shared(sh__emu);
            const int t = threadIdx.x, lane = t & 31, w = t / 32;
            int x = t;
            for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
            const int up = __shfl_up_sync(0xffffffffu, t, 1), dn = __shfl_down_sync(0xffffffffu, t, 3, 16);
            const int src = __shfl_sync(0xffffffffu, t, 31 - lane);
            const unsigned bal = __ballot_sync(0xffffffffu, lane % 3 == 0);
            const int poisoned = sh[t];  // read before any write: the poison pattern
            __syncthreads();
            sh[t] = x;
            __syncthreads();
            int* o = out + (blockIdx.x * blockDim.x + t) * 7;
            o[0] = x;
            o[1] = up;
            o[2] = dn;
            o[3] = src;
            o[4] = (int)bal;
            o[5] = sh[(t + 32) % blockDim.x];
            o[6] = poisoned;
            (void)w;
        }
    };
    std::vector<int> out(2 * 64 * 7, 0);
    emu::launch(2, 64, 0, 0, &K::kern, out.data());
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 64; t++) {
            const int* o = out.data() + (b * 64 + t) * 7;
            const int lane = t & 31, w0 = t & ~31;
            const int wsum = 32 * w0 + 31 * 32 / 2;
            CHECK(o[0] == wsum);
            CHECK(o[1] == (lane >= 1 ? t - 1 : t));
            CHECK(o[2] == ((lane & 15) + 3 < 16 ? t + 3 : t));
            CHECK(o[3] == w0 + 31 - lane);
            unsigned e = 0;
            for (int l = 0; l < 32; l++)
                if (l % 3 == 0) e |= 1u << l;
            CHECK((unsigned)o[4] == e);
            const int other = (t + 32) % 64;
            CHECK(o[5] == 32 * (other & ~31) + 31 * 32 / 2);
            CHECK(o[6] == -1);
        }
}
