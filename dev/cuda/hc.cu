// dev/cuda/hc.cu — workbench of the HC / mHC GPU schemes (GpuHC of train_gpt_baselines.cu over
// the kernels of cuda/hc.cuh, spec §2.2, §2.3)
// against the CPU reference Scheme<double> (cpu/scheme_hc.*): every x_j, xn_j, y, d_o_j, de
// and every scheme parameter gradient at several shapes (odd N and d, n = 4 and 3), fp32 (tight)
// and bf16 (loose), for production, for production with 2 token slices in the combine kernels
// ("hc-2slices", "mhc-2slices"), for the earlier stream-gradient paths ("hc-gemm-dw",
// "mhc-gemm-dw": the weight gradient by a GEMM; "mhc-gemm-dz": dZ by a GEMM too;
// dev/cuda/hc_variants.cuh) and for the earlier forward ("hc-gemm-proj", "mhc-gemm-proj": the
// post-mix, then the next sublayer's projection by a GEMM; bf16 production fuses them, fp32
// production is this) and for the forward's pre-mix ("hc-premix-split": HC with the pre-mix in its
// own pass, as mHC; "mhc-premix-fused": mHC with the post-mix + pre-mix kernel, as HC) and for the
// combine kernel's loads ("hc-combine-direct", "mhc-combine-direct": from global memory, not
// staged through cp.async; bit for bit production's results); the fused
// post-mix + projection and post-mix + pre-mix kernels on their own, and the deferred output's
// misuse errors; then the forward+backward time of all D sublayers at N = 16384, d = 1024, D = 48,
// n = 4. Output: CHECK / BENCH lines (doc/cuda.md); exit 1 if a CHECK fails.
// Usage: hc [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli; --quick: the
// small check shapes, no timing; no GPU: prints "skipped: no GPU", exits 0)
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <iterator>

#define TESTING  // the trainer file without its main()
#include "train_gpt_baselines.cu"
#include "dev/cuda/hc_variants.cuh"
#include "dev/cuda/scheme_check.cuh"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;

// Production's kernels with the combine grid cut to at most 2 token slices, so that at the small
// check shapes (where production's grid gives every tile its own slice) a block walks several
// tiles and the fixed-order sum adds several partials of dW_j / dΦ_j ("hc-2slices",
// "mhc-2slices"; checks only).
template <typename T>
struct TwoSlices : GpuHC<T> {
    TwoSlices(const ModelConfig& cfg, bool manifold) : GpuHC<T>(cfg, manifold) {}

   protected:
    void stream_gradient(int j, const T* dx, const T* W, float* gW, cudaStream_t s) override {
        this->combine(j, dx, W, gW, 2, s);
    }
};

// HC / mHC with the post-mix and the next sublayer's projection GEMM as separate passes
// (production before postmix_project_kernel, and production's fp32 path; "hc-gemm-proj",
// "mhc-gemm-proj").
template <typename T>
struct GemmProj : GpuHC<T> {
    GemmProj(const ModelConfig& cfg, bool manifold) : GpuHC<T>(cfg, manifold) {}

   protected:
    bool fused_projection() const override { return false; }
    bool fused_premix() const override { return false; }
};

// HC / mHC with the pre-mix + RMSNorm of sublayer j+1 in its own pass or fused into the post-mix
// of sublayer j (postmix_premix_kernel): "hc-premix-split" (HC production before the fusion),
// "mhc-premix-fused" (mHC with the fused kernel, which production's mHC does not use).
template <typename T>
struct PremixToggle : GpuHC<T> {
    PremixToggle(const ModelConfig& cfg, bool manifold, bool on) : GpuHC<T>(cfg, manifold), on_(on) {}

   protected:
    bool fused_premix() const override { return on_ && std::is_same<T, bf16>::value; }
    bool on_;
};

// HC / mHC with the combine kernel's G, dx and H loaded directly from global memory instead of
// staged through cp.async (production before the staging, and production where combine_staged
// does not hold; "hc-combine-direct", "mhc-combine-direct"): the same values, bit for bit.
template <typename T>
struct CombineDirect : GpuHC<T> {
    CombineDirect(const ModelConfig& cfg, bool manifold) : GpuHC<T>(cfg, manifold) {}

   protected:
    bool staged_combine() const override { return false; }
};

enum class Variant {
    HC, HcTwoSlices, HcGemmDw, HcGemmProj, HcPremixSplit, HcCombineDirect,
    MHC, MhcTwoSlices, MhcGemmDw, MhcGemmDz, MhcGemmProj, MhcPremixFused, MhcCombineDirect
};
constexpr Variant kVariants[] = {Variant::HC,          Variant::HcTwoSlices,   Variant::HcGemmDw,
                                 Variant::HcGemmProj,  Variant::HcPremixSplit, Variant::HcCombineDirect,
                                 Variant::MHC,         Variant::MhcTwoSlices,  Variant::MhcGemmDw,
                                 Variant::MhcGemmDz,   Variant::MhcGemmProj,   Variant::MhcPremixFused,
                                 Variant::MhcCombineDirect};
inline bool is_mhc(Variant v) { return v >= Variant::MHC; }
inline bool checks_only(Variant v) { return v == Variant::HcTwoSlices || v == Variant::MhcTwoSlices; }
inline const char* label(Variant v) {
    switch (v) {
        case Variant::HC: return "hc";
        case Variant::HcTwoSlices: return "hc-2slices";
        case Variant::HcGemmDw: return "hc-gemm-dw";
        case Variant::HcGemmProj: return "hc-gemm-proj";
        case Variant::HcPremixSplit: return "hc-premix-split";
        case Variant::HcCombineDirect: return "hc-combine-direct";
        case Variant::MHC: return "mhc";
        case Variant::MhcTwoSlices: return "mhc-2slices";
        case Variant::MhcGemmDw: return "mhc-gemm-dw";
        case Variant::MhcGemmDz: return "mhc-gemm-dz";
        case Variant::MhcGemmProj: return "mhc-gemm-proj";
        case Variant::MhcPremixFused: return "mhc-premix-fused";
        case Variant::MhcCombineDirect: return "mhc-combine-direct";
    }
    return "?";
}

template <typename T>
static wb::Factory<T> factory(Variant v) {
    return [v](const ModelConfig& c) -> std::unique_ptr<GpuScheme<T>> {
        switch (v) {
            case Variant::HcTwoSlices: return std::unique_ptr<GpuScheme<T>>(new TwoSlices<T>(c, false));
            case Variant::MhcTwoSlices: return std::unique_ptr<GpuScheme<T>>(new TwoSlices<T>(c, true));
            case Variant::HcGemmDw: return std::unique_ptr<GpuScheme<T>>(new HcGemmDw<T>(c));
            case Variant::MhcGemmDw: return std::unique_ptr<GpuScheme<T>>(new MhcGemmDw<T>(c));
            case Variant::MhcGemmDz: return std::unique_ptr<GpuScheme<T>>(new MhcGemmDz<T>(c));
            case Variant::HcGemmProj: return std::unique_ptr<GpuScheme<T>>(new GemmProj<T>(c, false));
            case Variant::MhcGemmProj: return std::unique_ptr<GpuScheme<T>>(new GemmProj<T>(c, true));
            case Variant::HcPremixSplit: return std::unique_ptr<GpuScheme<T>>(new PremixToggle<T>(c, false, false));
            case Variant::MhcPremixFused: return std::unique_ptr<GpuScheme<T>>(new PremixToggle<T>(c, true, true));
            case Variant::HcCombineDirect: return std::unique_ptr<GpuScheme<T>>(new CombineDirect<T>(c, false));
            case Variant::MhcCombineDirect: return std::unique_ptr<GpuScheme<T>>(new CombineDirect<T>(c, true));
            default: return std::unique_ptr<GpuScheme<T>>(new GpuHC<T>(c, is_mhc(v)));
        }
    };
}

// Prints one CHECK line per (name, worst error / its bound) of a kernel check and returns whether
// every ratio is finite and <= 1.
struct BoundLine {
    const char* what;
    double w;
};
static bool print_bound_checks(const char* kernel, bool per_row, const std::string& shape,
                               std::initializer_list<BoundLine> lines) {
    bool ok = true;
    for (const auto& l : lines) {
        const bool pass = std::isfinite(l.w) && l.w <= 1.0;
        std::printf("CHECK hc %s-%s.%s bf16 %s err/bound=%.3e %s\n", per_row ? "hc" : "mhc", kernel, l.what,
                    shape.c_str(), l.w, pass ? "PASS" : "FAIL");
        ok &= pass;
    }
    return ok;
}

// postmix_project_kernel<NS, PER_ROW> on its own (bf16; mHC: PER_ROW false, HC: true), N = 70
// tokens (a partial block of 64) and d = 148 (3, 5 or 10 chunks of C = 64, 32 or 16 channels, the
// last one partial: 5, 5 or 1 groups of 4 channels): against postmix_kernel<bf16, NS> on the same inputs, the streams H_j within
// one bf16 ulp, 2⁻⁷ relative (the same expressions; where the compiler contracts them
// differently, the fp32 sums differ in their last bits and may round apart), the o copy exactly,
// the inverse RMS within 2·m·2⁻²⁴ relative (two fp32 sums of the same m squares, m = d per row
// or n·d per token, in different orders), and P against the projection in double over the
// kernel's own H_j (exact bf16 products; fp32 accumulation of K terms, K = n·d (mHC) or d (HC):
// |err| <= (K + 2)·2⁻²³·Σ|h w|, the sequential bound with truncation (2⁻²³) in place of rounding
// (2⁻²⁴), since the tensor cores align and truncate each k-step's products inside the mma).
template <int NS, bool PER_ROW>
static bool check_postmix_project() {
    using S = hc_detail::PpShape<NS, PER_ROW>;
    constexpr int R = S::R, LDP = hc_detail::proj_ld(R), CW = 2 * NS + NS * NS;
    const int N = 70, d = 148;
    const int64_t nd = (int64_t)NS * d, K = PER_ROW ? d : nd, rows = PER_ROW ? (int64_t)N * NS : N;
    const uint64_t seed = init_stream(0x9e11 + NS + (PER_ROW ? 100 : 0), 0);
    std::vector<float> H(N * nd), o((size_t)N * d), coef((size_t)N * CW), w(R * K);
    uint64_t k = 0;
    for (auto& v : H) v = (float)stream_uniform(seed, k++) * 2 - 1;
    for (auto& v : o) v = (float)stream_uniform(seed, k++) * 2 - 1;
    for (auto& v : coef) v = (float)stream_uniform(seed, k++) * 1.5f - 0.5f;
    for (auto& v : w) v = (float)stream_uniform(seed, k++) * 0.2f - 0.1f;
    DeviceBuffer<bf16> dH(N * nd), dHn(N * nd), dHr(N * nd), dO((int64_t)N * d), dOc((int64_t)N * d), dW(R * K);
    DeviceBuffer<float> dC((int64_t)N * CW), dP(rows * LDP), dRs(rows), dRr(rows);
    upload(dH.ptr, H.data(), dH.n);
    upload(dO.ptr, o.data(), dO.n);
    upload(dC.ptr, coef.data(), dC.n);
    upload(dW.ptr, w.data(), dW.n);
    const float eps = 1e-5f;
    auto kern = hc_detail::postmix_project_kernel<NS, PER_ROW>;
    ensure_dynamic_smem(kern, S::smem);
    kern<<<(unsigned)ceil_div(N, hc_detail::kPpTokens), hc_detail::kPpThreads, S::smem>>>(
        dHn.ptr, dRs.ptr, dP.ptr, dOc.ptr, dH.ptr, dO.ptr, dC.ptr, dW.ptr, N, d, LDP, eps);
    LDM_LAUNCH_CHECK();
    hc_detail::postmix_kernel<bf16, NS><<<N, hc_detail::kThreads>>>(dHr.ptr, dRr.ptr, nullptr, dH.ptr, dO.ptr, dC.ptr,
                                                                    d, eps, PER_ROW);
    LDM_LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> hn = download(dHn.ptr, dHn.n), hr = download(dHr.ptr, dHr.n);
    const std::vector<float> oc = download(dOc.ptr, dOc.n), P = download(dP.ptr, dP.n);
    const std::vector<float> rs = download(dRs.ptr, dRs.n), rr = download(dRr.ptr, dRr.n);
    const std::vector<float> wb_ = download(dW.ptr, dW.n), ob = download(dO.ptr, dO.n);
    double wh = 0, wo = 0, wr = 0, wp = 0;  // worst error / its bound
    for (size_t i = 0; i < hn.size(); i++)
        wh = std::max(wh, std::fabs((double)hn[i] - hr[i]) / (std::ldexp(std::max(std::fabs(hr[i]), 1e-30f), -7)));
    for (size_t i = 0; i < oc.size(); i++) wo = std::max(wo, oc[i] == ob[i] ? 0.0 : INFINITY);
    for (int64_t q = 0; q < rows; q++) wr = std::max(wr, std::fabs((double)rs[q] - rr[q]) / (rr[q] * 2.0 * K * 0x1p-24));
    for (int64_t q = 0; q < rows; q++)  // projected row q: K values of H_j from q·K on (token-major either way)
        for (int r = 0; r < R; r++) {
            double ref = 0, mag = 0;
            for (int64_t e = 0; e < K; e++) {
                const double pr = (double)hn[q * K + e] * wb_[r * K + e];
                ref += pr;
                mag += std::fabs(pr);
            }
            const double bound = (K + 2) * 0x1p-23 * mag + 1e-30;
            wp = std::max(wp, std::fabs(P[(size_t)q * LDP + r] - ref) / bound);
        }
    return print_bound_checks("postmix-project", PER_ROW, strprintf("N%dd%dn%d", N, d, NS),
                              {{"Hn", wh}, {"ocopy", wo}, {"rsn", wr}, {"P", wp}});
}

// postmix_premix_kernel<NS, PER_ROW> on its own (bf16; mHC: PER_ROW false, HC: true), N = 21
// tokens (partial blocks of 8 or 16) and d = 200 (the k-steps' zero padding: DP = 208): H_j, the
// o copy, the inverse RMS and P as in check_postmix_project (against postmix_kernel and the
// projection in double); then, with the pre-mix weights a_i that the coefficient kernel
// (hc_coef_kernel / mhc_coef_kernel) forms from the kernel's own P and inverse RMS: x against
// Σ_i a_i H_j[i] in double over the kernel's own H_j, within the bf16 rounding 2⁻⁸·|x| plus the
// fp32 sum's n roundings and a_i's own (its expression may be contracted differently in the two
// kernels): (n+3)·2⁻²⁴·Σ|a h|; rstd against 1/sqrt(mean(x²) + eps) in double over the kernel's
// own x, within (d + 4)·2⁻²⁴ relative; xn against w·x·rstd in double over the kernel's own x and
// rstd, within (2⁻⁸ + 2⁻²²) relative (one bf16 rounding of a two-rounding fp32 product).
template <int NS, bool PER_ROW>
static bool check_postmix_premix() {
    using S = hc_detail::PnShape<NS, PER_ROW>;
    constexpr int R = S::R, LDP = hc_detail::proj_ld(R), CW = 2 * NS + NS * NS;
    const int N = 21, d = 200, iters = 20;
    const int64_t nd = (int64_t)NS * d, K = PER_ROW ? d : nd, rows = PER_ROW ? (int64_t)N * NS : N;
    const int nq = PER_ROW ? 2 + 2 * NS + NS * NS : 3 + 2 * NS + NS * NS;  // the sublayer's fp32 scalars
    const uint64_t seed = init_stream(0x9e21 + NS + (PER_ROW ? 100 : 0), 0);
    std::vector<float> H(N * nd), o((size_t)N * d), coef((size_t)N * CW), w(R * K), q(nq), wn(d);
    uint64_t k = 0;
    for (auto& v : H) v = (float)stream_uniform(seed, k++) * 2 - 1;
    for (auto& v : o) v = (float)stream_uniform(seed, k++) * 2 - 1;
    for (auto& v : coef) v = (float)stream_uniform(seed, k++) * 1.5f - 0.5f;
    for (auto& v : w) v = (float)stream_uniform(seed, k++) * 0.2f - 0.1f;
    for (auto& v : q) v = (float)stream_uniform(seed, k++) * 1.6f - 0.8f;
    for (auto& v : wn) v = (float)stream_uniform(seed, k++) + 0.5f;
    DeviceBuffer<bf16> dH(N * nd), dHn(N * nd), dHr(N * nd), dO((int64_t)N * d), dOc((int64_t)N * d), dW(R * K),
        dWn(d), dX((int64_t)N * d), dXn((int64_t)N * d);
    DeviceBuffer<float> dC((int64_t)N * CW), dC2((int64_t)N * CW), dP(rows * LDP), dRs(rows), dRr(rows), dQ(nq),
        dRstd(N), dWork((int64_t)N * (sinkhorn_work_size(NS, iters) + 2 * NS * NS));
    upload(dH.ptr, H.data(), dH.n);
    upload(dO.ptr, o.data(), dO.n);
    upload(dC.ptr, coef.data(), dC.n);
    upload(dW.ptr, w.data(), dW.n);
    upload(dQ.ptr, q.data(), dQ.n);
    upload(dWn.ptr, wn.data(), dWn.n);
    const float eps = 1e-5f;
    auto kern = hc_detail::postmix_premix_kernel<NS, PER_ROW>;
    const size_t smem = S::smem(d);
    ensure_dynamic_smem(kern, smem);
    kern<<<(unsigned)ceil_div(N, S::M), hc_detail::kPnThreads, smem>>>(
        dHn.ptr, dRs.ptr, dP.ptr, dOc.ptr, dX.ptr, dXn.ptr, dRstd.ptr, dH.ptr, dO.ptr, dC.ptr, dW.ptr, dQ.ptr, dWn.ptr,
        N, d, LDP, eps, eps);
    LDM_LAUNCH_CHECK();
    hc_detail::postmix_kernel<bf16, NS><<<N, hc_detail::kThreads>>>(dHr.ptr, dRr.ptr, nullptr, dH.ptr, dO.ptr, dC.ptr,
                                                                    d, eps, PER_ROW);
    LDM_LAUNCH_CHECK();
    if (PER_ROW)
        hc_detail::hc_coef_kernel<NS><<<N, 1>>>(dC2.ptr, dP.ptr, dRs.ptr, dQ.ptr, N);
    else
        hc_detail::mhc_coef_kernel<NS><<<N, 1>>>(dC2.ptr, dWork.ptr, dP.ptr, dRs.ptr, dQ.ptr, N, iters,
                                                 sinkhorn_work_size(NS, iters) + 2 * NS * NS);
    LDM_LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> hn = download(dHn.ptr, dHn.n), hr = download(dHr.ptr, dHr.n);
    const std::vector<float> oc = download(dOc.ptr, dOc.n), P = download(dP.ptr, dP.n);
    const std::vector<float> rs = download(dRs.ptr, dRs.n), rr = download(dRr.ptr, dRr.n);
    const std::vector<float> wb_ = download(dW.ptr, dW.n), ob = download(dO.ptr, dO.n), wnb = download(dWn.ptr, d);
    const std::vector<float> c2 = download(dC2.ptr, dC2.n), xg = download(dX.ptr, dX.n), xng = download(dXn.ptr, dXn.n);
    const std::vector<float> rstd = download(dRstd.ptr, N);
    double wh = 0, wo = 0, wr = 0, wp = 0, wx = 0, wrs = 0, wxn = 0;  // worst error / its bound
    for (size_t i = 0; i < hn.size(); i++)
        wh = std::max(wh, std::fabs((double)hn[i] - hr[i]) / (std::ldexp(std::max(std::fabs(hr[i]), 1e-30f), -7)));
    for (size_t i = 0; i < oc.size(); i++) wo = std::max(wo, oc[i] == ob[i] ? 0.0 : INFINITY);
    for (int64_t r = 0; r < rows; r++) wr = std::max(wr, std::fabs((double)rs[r] - rr[r]) / (rr[r] * 2.0 * K * 0x1p-24));
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < R; c++) {
            double ref = 0, mag = 0;
            for (int64_t e = 0; e < K; e++) {
                const double pr = (double)hn[r * K + e] * wb_[c * K + e];
                ref += pr;
                mag += std::fabs(pr);
            }
            wp = std::max(wp, std::fabs(P[(size_t)r * LDP + c] - ref) / ((K + 2) * 0x1p-23 * mag + 1e-30));
        }
    for (int t = 0; t < N; t++) {
        double ss = 0;
        for (int c = 0; c < d; c++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < NS; i++) {
                const double pr = (double)c2[(size_t)t * CW + i] * hn[((size_t)t * NS + i) * d + c];
                ref += pr;
                mag += std::fabs(pr);
            }
            const double xv = xg[(size_t)t * d + c];
            wx = std::max(wx, std::fabs(xv - ref) / (0x1p-8 * std::fabs(ref) + (NS + 3) * 0x1p-24 * mag + 1e-30));
            ss += xv * xv;
        }
        const double rref = 1.0 / std::sqrt(ss / d + eps);
        wrs = std::max(wrs, std::fabs(rstd[t] - rref) / (rref * (d + 4) * 0x1p-24));
        for (int c = 0; c < d; c++) {
            const double ref = (double)wnb[c] * xg[(size_t)t * d + c] * rstd[t];
            wxn = std::max(wxn, std::fabs(xng[(size_t)t * d + c] - ref) / ((0x1p-8 + 0x1p-22) * std::fabs(ref) + 1e-30));
        }
    }
    return print_bound_checks("postmix-premix", PER_ROW, strprintf("N%dd%dn%d", N, d, NS),
                              {{"Hn", wh}, {"ocopy", wo}, {"rsn", wr}, {"P", wp}, {"x", wx}, {"rstd", wrs}, {"xn", wxn}});
}

// GpuHC's deferred output (HC in bf16, where the fused post-mix + pre-mix applies): a call other
// than input_norm(j+1) after output(j) is an ldm::Error (readout; input_norm of another sublayer;
// output again), begin() clears a pending output, and the backbone's order runs.
static bool check_deferred_output() {
    const wb::Shape sh{1, 5, 64, 1, 4, 8};  // D = 2: output(1) is deferred, output(2) is not
    const ModelConfig c = wb::make_config("hc", sh);
    int64_t P = 0;
    for (const auto& s : scheme_param_specs(c)) P = std::max(P, s.offset + s.numel);
    const int64_t N = (int64_t)sh.B * sh.T, Nd = N * sh.d;
    DeviceBuffer<bf16> params(P), e(Nd), x(Nd), xn(Nd), o(Nd), y(Nd), wn(sh.d);
    DeviceBuffer<float> master(P), grads(P), rstd(N);
    fill(params.ptr, P, 0.f, 0);
    fill(master.ptr, P, 0.f, 0);
    fill(e.ptr, Nd, 0.5f, 0);
    fill(o.ptr, Nd, 0.25f, 0);
    fill(wn.ptr, sh.d, 1.f, 0);
    GpuHC<bf16> s(c, false);
    s.bind(params.ptr, master.ptr, grads.ptr);
    s.resize(sh.B, sh.T);
    const float eps = 1e-5f;
    auto throws = [](auto&& f) {
        try {
            f();
        } catch (const Error&) {
            return true;
        }
        return false;
    };
    auto start = [&] {  // begin, sublayer 1's input, its output (deferred)
        s.begin(e.ptr, 0);
        s.input_norm(1, x.ptr, xn.ptr, rstd.ptr, wn.ptr, eps, 0);
        s.output(1, o.ptr, 0);
    };
    start();
    const bool readout = throws([&] { s.readout(y.ptr, 0); });
    start();
    const bool other = throws([&] { s.input_norm(3, x.ptr, xn.ptr, rstd.ptr, wn.ptr, eps, 0); });
    start();
    const bool again = throws([&] { s.output(2, o.ptr, 0); });
    start();
    const bool order = !throws([&] {
        s.input_norm(2, x.ptr, xn.ptr, rstd.ptr, wn.ptr, eps, 0);
        s.output(2, o.ptr, 0);
        s.readout(y.ptr, 0);
    });
    CUDA_CHECK(cudaDeviceSynchronize());
    const struct { const char* what; bool pass; } lines[] = {
        {"readout-after-deferred-output-throws", readout}, {"other-input-norm-throws", other},
        {"second-output-throws", again}, {"backbone-order-runs", order}};
    bool ok = true;
    for (const auto& l : lines) {
        std::printf("CHECK hc hc-deferred-output.%s bf16 %s %s\n", l.what, sh.str().c_str(), l.pass ? "PASS" : "FAIL");
        ok &= l.pass;
    }
    return ok;
}

template <typename T>
static bool run_checks(wb::Checks which, double tol_act, double tol_grad) {
    struct Case {
        wb::Shape shape;
        uint64_t seed;
    };
    const std::vector<Case> cases = {
        {{2, 33, 67, 3, 4, 8}, 11},    // odd N (66: mHC combine token tiles 32, 32, 2) and d, D = 6 > n (A_m0 wraps)
        {{1, 7, 128, 2, 3, 8}, 12},    // n = 3 (mHC combine blocks of 64 × 3 threads), an odd token tile
        {{1, 5, 40, 1, 8, 8}, 15},     // n = 8 (mHC combine: 32 channels per block, a partial one; R = 80)
        {{1, 9, 33, 1, 2, 8}, 16},     // n = 2
        {{1, 3, 600, 2, 4, 8}, 13},    // d > 2 * 256: two channel steps per batch and a partial one (kSteps)
        {{3, 50, 1024, 2, 4, 8}, 14},  // realistic d
    };
    bool ok = true;
    if (std::is_same<T, bf16>::value) ok &= check_deferred_output();
    if (std::is_same<T, bf16>::value)  // (every n the scheme supports)
        for (bool per_row : {false, true}) {
            auto one = [&](auto c) {
                constexpr int NS = decltype(c)::value;
                return per_row ? check_postmix_project<NS, true>() & check_postmix_premix<NS, true>()
                               : check_postmix_project<NS, false>() & check_postmix_premix<NS, false>();
            };
            ok &= one(std::integral_constant<int, 1>{}) & one(std::integral_constant<int, 2>{}) &
                  one(std::integral_constant<int, 3>{}) & one(std::integral_constant<int, 4>{}) &
                  one(std::integral_constant<int, 8>{});
        }
    for (size_t k = 0; k < cases.size(); k++) {
        if (which != wb::Checks::Full && k == cases.size() - 1) break;
        // Race: case 0 (66 tokens, three quarters of the emulated work) for production only.
        const bool all_variants = !(which == wb::Checks::Race && k == 0);
        std::vector<float> got[std::size(kVariants)];
        for (size_t vi = 0; vi < std::size(kVariants); vi++) {
            const Variant v = kVariants[vi];
            if (!all_variants && v != Variant::HC && v != Variant::MHC) continue;
            const bool m = is_mhc(v);
            ok &= wb::check_scheme<T>("hc", m ? "mhc" : "hc", cases[k].shape, factory<T>(v), tol_act, tol_grad,
                                      cases[k].seed, m ? 0.1 : 0.3, label(v), &got[vi]);
        }
        // The staged combine (production where d·sizeof(T) % 16 == 0) moves the values the direct
        // loads read, into the same expressions: every result bit for bit the same.
        if (!all_variants) continue;
        for (const auto& pr : {std::make_pair(Variant::HC, Variant::HcCombineDirect),
                               std::make_pair(Variant::MHC, Variant::MhcCombineDirect)}) {
            const auto idx = [](Variant v) { return (size_t)(std::find(std::begin(kVariants), std::end(kVariants), v) -
                                                              std::begin(kVariants)); };
            const std::vector<float>& a = got[idx(pr.first)];
            const std::vector<float>& b = got[idx(pr.second)];
            const bool same = a.size() == b.size() && !a.empty() &&
                              std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
            std::printf("CHECK hc %s.bitwise=%s %s %s staged=%d %s\n", label(pr.second), label(pr.first),
                        dtype_name<T>(), cases[k].shape.str().c_str(),
                        (int)((int64_t)cases[k].shape.d * (int64_t)sizeof(T) % 16 == 0),
                        same ? "PASS" : "FAIL  (not bit for bit the same)");
            ok &= same;
        }
    }
    return ok;
}

template <typename T>
static void run_bench() {
    const wb::Shape big{8, 2048, 1024, 24, 4, 8};
    const double n = 4, d = 1024, D = 48, tb = sizeof(T);
    for (Variant v : kVariants) {
        if (checks_only(v)) continue;  // a check of production's kernels, not a contender
        // Estimated traffic per sublayer and token (doc/cuda.md): forward (4n+3)·d·tb (o_j is
        // written by the trainer's GEMM into the scheme's O_j: output_buffer), (3n+3)·d·tb in bf16
        // (the post-mix forms the next projection: H_j is not read again; not *-gemm-proj); backward
        // (2n+4)·d·tb (production HC and mHC at n <= 4, *-gemm-proj too: the weight gradient and
        // dL/do_{j-1} in the combine kernel, the coefficient dots in one pass, plus the weight
        // gradient slices' fp32 partials written and read once per sublayer), (4n+4)·d·tb (the
        // earlier paths: post_backward_kernel reads H_{j-1} once more, and the dW GEMM once again:
        // hc-gemm-dw, mhc-gemm-dw) or (6n+4)·d·tb (mhc-gemm-dz: dZ written and read as well);
        // + 3·n·d·tb (stream gradients, type T: read twice, written once).
        const bool gemm_dw = v == Variant::HcGemmDw || v == Variant::MhcGemmDw;
        double own = v == Variant::MhcGemmDz ? 10 * n + 7 : gemm_dw ? 8 * n + 7 : 6 * n + 7;
        if (v != Variant::HcGemmProj && v != Variant::MhcGemmProj && std::is_same<T, bf16>::value) own -= n;
        // (2n+3)·d·tb where the pre-mix does not read H_j back either (bf16 HC but hc-gemm-proj and
        // hc-premix-split, and mhc-premix-fused; d = 1024 fits). Their weight is read from L2 per
        // block, not counted: HC (n+2)·d·2 bytes per 8 tokens, mHC (2n+n²)·n·d·2 per 16.
        const bool premix = v == Variant::MhcPremixFused ||
                            (!is_mhc(v) && v != Variant::HcGemmProj && v != Variant::HcPremixSplit);
        if (premix && std::is_same<T, bf16>::value) own -= n;
        double part = 0;
        if (v == Variant::HC || v == Variant::MHC || v == Variant::HcGemmProj || v == Variant::MhcGemmProj ||
            v == Variant::HcPremixSplit || v == Variant::MhcPremixFused || v == Variant::HcCombineDirect ||
            v == Variant::MhcCombineDirect) {
            const double wsize = is_mhc(v) ? (2 * n + n * n) * n * d : (n + 2) * d;
            const double slices = hc_detail::combine_grid<4>(big.B * big.T, (int)d).y;
            part = 2 * slices * wsize * 4 / (big.B * big.T);
        }
        const double bytes = D * (own * d * tb + 3 * n * d * tb + part);
        wb::bench_scheme<T>("hc", is_mhc(v) ? "mhc" : "hc", big, factory<T>(v), bytes, 20, label(v));
    }
}

int main(int argc, char** argv) {
    wb::Cli cli;
    cli.quick_times_nothing = true;
    if (const int rc = cli.parse(argc, argv, "hc",
                                 "HC and mHC (GpuHC) forward and backward over D sublayers, every variant",
                                 "the small CHECK shapes, no BENCH");
        rc >= 0)
        return rc;
    exit_if_no_gpu("hc");
    const bool quick = cli.quick;
    try {
        std::printf("# %s\n", device_description().c_str());
        const wb::Checks which = quick ? wb::Checks::Quick : wb::Checks::Full;
        bool ok = true;
        if (cli.check) {
            ok &= run_checks<float>(which, 1e-4, 1e-4);
            ok &= run_checks<bf16>(which, 3e-2, 5e-2);
        }
        if (!quick && cli.bench) {
            run_bench<bf16>();
            run_bench<float>();
        }
        std::printf("hc: %s\n", !cli.check ? "no checks run" : ok ? "all checks passed" : "SOME CHECKS FAILED");
        return ok ? 0 : 1;
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "hc: error: %s\n", ex.what());
        return 1;
    }
}
