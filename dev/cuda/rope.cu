// dev/cuda/rope.cu — workbench for cuda/rope.cuh: qknorm_rope_forward / qknorm_rope_backward
// ("v2" = production, warp per head; "v1" = the workbench-only thread-per-head kernels below,
// slower: doc/cuda.md "Kernel variants"), with and without QK-norm, also in place, against the
// CPU path of cpu/model.cpp (cpu::rmsnorm_forward/backward on the [N·heads, hd] view, then
// cpu::rope_forward/backward, tables from cpu::rope_tables); then timing on llama-400m-like
// (nh = nkv = 16, hd = 64, no norm) and qwen3-like (nh 16, nkv 8, hd 128, QK-norm) batches.
// Usage: build/cuda/rope [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli).
// Output format: doc/cuda.md.
#include "cuda/rope.cuh"
#include "cpu/ops.h"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;
using wb::Report;
using wb::Rng;

// ---- v1 (workbench only): one thread per (token, head), same math as the warp kernels -------
template <typename T, bool NORM>
__global__ void qknorm_rope_forward_thread_kernel(T* out, float* rstd, const T* in, const T* q_w,
                                                  const T* k_w, const float* cos_t,
                                                  const float* sin_t, int64_t N, int T_, int nh,
                                                  int nkv, int hd, float eps, bool copy_v) {
    const int Hall = nh + 2 * nkv, Hr = nh + nkv, half = hd / 2;
    const int64_t gid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (gid >= N * Hall) return;
    const int64_t n = gid / Hall;
    const int h = (int)(gid - n * Hall);
    const int64_t base = n * Hall * hd + (int64_t)h * hd;
    const T* x = in + base;
    T* y = out + base;
    if (h >= Hr) {  // v head
        if (copy_v)
            for (int c = 0; c < hd; c++) y[c] = x[c];
        return;
    }
    float s = 1.f;
    if (NORM) {
        float ss = 0.f;
        for (int c = 0; c < hd; c++) {
            const float v = to_f(x[c]);
            ss += v * v;
        }
        s = rms_scale(ss, hd, eps);
        if (rstd) rstd[n * Hr + h] = s;
    }
    const T* w = h < nh ? q_w : k_w;
    const int64_t t = n % T_;
    const float* ct = cos_t + t * half;
    const float* st = sin_t + t * half;
    for (int i = 0; i < half; i++) {
        float x1 = to_f(x[i]), x2 = to_f(x[i + half]);
        if (NORM) {
            x1 = to_f(w[i]) * (x1 * s);
            x2 = to_f(w[i + half]) * (x2 * s);
        }
        float y1, y2;
        rope_rotate(x1, x2, ct[i], st[i], &y1, &y2);
        y[i] = from_f<T>(y1);
        y[i + half] = from_f<T>(y2);
    }
}

template <typename T, bool NORM>
__global__ void qknorm_rope_backward_thread_kernel(T* din, const T* dout, const T* in,
                                                   const float* rstd, const T* q_w, const T* k_w,
                                                   const float* cos_t, const float* sin_t,
                                                   int64_t N, int T_, int nh, int nkv, int hd) {
    const int Hall = nh + 2 * nkv, Hr = nh + nkv, half = hd / 2;
    const int64_t gid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (gid >= N * Hall) return;
    const int64_t n = gid / Hall;
    const int h = (int)(gid - n * Hall);
    const int64_t base = n * Hall * hd + (int64_t)h * hd;
    const T* dy = dout + base;
    T* dx = din + base;
    if (h >= Hr) {
        for (int c = 0; c < hd; c++) dx[c] = dy[c];
        return;
    }
    const int64_t t = n % T_;
    const float* ct = cos_t + t * half;
    const float* st = sin_t + t * half;
    const T* x = in + base;
    const T* w = h < nh ? q_w : k_w;
    float s = 1.f, kk = 0.f;
    if (NORM) {
        s = rstd[n * Hr + h];
        float dot = 0.f;
        for (int i = 0; i < half; i++) {
            float g1, g2;
            rope_rotate_back(to_f(dy[i]), to_f(dy[i + half]), ct[i], st[i], &g1, &g2);
            dot += to_f(w[i]) * g1 * to_f(x[i]) + to_f(w[i + half]) * g2 * to_f(x[i + half]);
        }
        kk = s * s * s * dot / (float)hd;
    }
    for (int i = 0; i < half; i++) {
        float g1, g2;
        rope_rotate_back(to_f(dy[i]), to_f(dy[i + half]), ct[i], st[i], &g1, &g2);
        if (NORM) {
            g1 = s * to_f(w[i]) * g1 - kk * to_f(x[i]);
            g2 = s * to_f(w[i + half]) * g2 - kk * to_f(x[i + half]);
        }
        dx[i] = from_f<T>(g1);
        dx[i + half] = from_f<T>(g2);
    }
}

// The launchers by variant (1 = the thread kernels above, 2 = production), same contracts as
// qknorm_rope_forward / qknorm_rope_backward.
template <typename T>
static void forward_variant(int v, T* out, float* rstd, const T* in, const T* q_w, const T* k_w,
                            const float* cos_t, const float* sin_t, int64_t N, int T_, int nh,
                            int nkv, int hd, float eps, cudaStream_t s) {
    if (v == 2)
        return qknorm_rope_forward<T>(out, rstd, in, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd,
                                      eps, s);
    if (N <= 0) return;
    const unsigned blocks = (unsigned)ceil_div(N * (nh + 2 * nkv), 256);
    if (q_w)
        qknorm_rope_forward_thread_kernel<T, true><<<blocks, 256, 0, s>>>(
            out, rstd, in, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd, eps, out != in);
    else
        qknorm_rope_forward_thread_kernel<T, false><<<blocks, 256, 0, s>>>(
            out, rstd, in, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd, eps, out != in);
    LDM_LAUNCH_CHECK();
}
template <typename T>
static void backward_variant(int v, T* din, float* dq_w, float* dk_w, float* scratch,
                             const T* dout, const T* in, const float* rstd, const T* q_w,
                             const T* k_w, const float* cos_t, const float* sin_t, int64_t N,
                             int T_, int nh, int nkv, int hd, cudaStream_t s) {
    if (v == 2)
        return qknorm_rope_backward<T>(din, dq_w, dk_w, scratch, dout, in, rstd, q_w, k_w, cos_t,
                                       sin_t, N, T_, nh, nkv, hd, s);
    if (N <= 0) return;
    const unsigned blocks = (unsigned)ceil_div(N * (nh + 2 * nkv), 256);
    if (q_w)
        qknorm_rope_backward_thread_kernel<T, true><<<blocks, 256, 0, s>>>(
            din, dout, in, rstd, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd);
    else
        qknorm_rope_backward_thread_kernel<T, false><<<blocks, 256, 0, s>>>(
            din, dout, in, rstd, q_w, k_w, cos_t, sin_t, N, T_, nh, nkv, hd);
    LDM_LAUNCH_CHECK();
    if (q_w)
        qk_norm_weight_grads<T>(dq_w, dk_w, scratch, dout, in, rstd, cos_t, sin_t, N, T_, nh, nkv,
                                hd, s);
}

struct Shape {
    int B, T, nh, nkv, hd;
    int64_t N() const { return (int64_t)B * T; }
    int W() const { return (nh + 2 * nkv) * hd; }
    std::string str(bool norm) const {
        return strprintf("B=%d,T=%d,nh=%d,nkv=%d,hd=%d,qknorm=%d", B, T, nh, nkv, hd, (int)norm);
    }
};

// Columns [c0, c0 + cols) of each row of a [N, W] matrix.
static std::vector<float> cols_of(const std::vector<float>& m, int64_t N, int W, int c0, int cols) {
    std::vector<float> o((size_t)(N * cols));
    for (int64_t n = 0; n < N; n++)
        for (int c = 0; c < cols; c++) o[(size_t)(n * cols + c)] = m[(size_t)(n * W + c0 + c)];
    return o;
}
static void put_cols(std::vector<float>& m, const std::vector<float>& src, int64_t N, int W, int c0,
                     int cols) {
    for (int64_t n = 0; n < N; n++)
        for (int c = 0; c < cols; c++) m[(size_t)(n * W + c0 + c)] = src[(size_t)(n * cols + c)];
}

template <typename T>
static void check(Report& R, Rng& rng, const Shape& S, bool norm) {
    const char* dt = dtype_name<T>();
    const std::string shape = S.str(norm);
    const int64_t N = S.N();
    const int W = S.W(), qd = S.nh * S.hd, kvd = S.nkv * S.hd, Hr = S.nh + S.nkv, half = S.hd / 2;
    const float eps = 1e-6f;
    std::vector<float> cos_t((size_t)S.T * half), sin_t((size_t)S.T * half);
    cpu::rope_tables<float>(cos_t.data(), sin_t.data(), S.T, S.hd, 1e4);
    std::vector<float> in = wb::round_to<T>(wb::random_vec(rng, N * W));
    std::vector<float> qw = wb::round_to<T>(wb::random_vec(rng, S.hd, 0.2f, 1.f));
    std::vector<float> kw = wb::round_to<T>(wb::random_vec(rng, S.hd, 0.2f, 1.f));

    // CPU forward (model.cpp order)
    std::vector<float> q = cols_of(in, N, W, 0, qd), k = cols_of(in, N, W, qd, kvd);
    std::vector<float> qn = q, kn = k, rq((size_t)N * S.nh, 1.f), rk((size_t)N * S.nkv, 1.f);
    if (norm) {
        cpu::rmsnorm_forward<float>(qn.data(), rq.data(), q.data(), qw.data(), (int)(N * S.nh), S.hd,
                                    eps);
        cpu::rmsnorm_forward<float>(kn.data(), rk.data(), k.data(), kw.data(), (int)(N * S.nkv),
                                    S.hd, eps);
    }
    std::vector<float> qr(qn.size()), kr(kn.size());
    cpu::rope_forward<float>(qr.data(), qn.data(), cos_t.data(), sin_t.data(), (int)N, S.T, S.nh,
                             S.hd);
    cpu::rope_forward<float>(kr.data(), kn.data(), cos_t.data(), sin_t.data(), (int)N, S.T, S.nkv,
                             S.hd);
    std::vector<float> ref_out = in, ref_rstd((size_t)N * Hr);
    put_cols(ref_out, qr, N, W, 0, qd);
    put_cols(ref_out, kr, N, W, qd, kvd);
    for (int64_t n = 0; n < N; n++)
        for (int h = 0; h < Hr; h++)
            ref_rstd[(size_t)(n * Hr + h)] =
                h < S.nh ? rq[(size_t)(n * S.nh + h)] : rk[(size_t)(n * S.nkv + h - S.nh)];

    auto d_in = wb::to_device<T>(in);
    auto d_qw = wb::to_device<T>(qw);
    auto d_kw = wb::to_device<T>(kw);
    auto d_cos = wb::to_device<float>(cos_t);
    auto d_sin = wb::to_device<float>(sin_t);
    DeviceBuffer<T> out(N * W);
    DeviceBuffer<float> rstd(N * Hr);
    for (int v = 1; v <= 2; v++)
        for (int inplace = 0; inplace <= (norm ? 0 : 1); inplace++) {
            if (inplace)
                upload(out.get(), in.data(), N * W);
            else
                fill(out.get(), N * W, NAN, 0);
            fill(rstd.get(), N * Hr, NAN, 0);
            forward_variant<T>(v, out.get(), norm ? rstd.get() : nullptr,
                               inplace ? out.get() : d_in.get(), norm ? d_qw.get() : nullptr,
                               norm ? d_kw.get() : nullptr, d_cos.get(), d_sin.get(), N, S.T, S.nh,
                               S.nkv, S.hd, eps, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const std::string var = strprintf("forward_v%d%s", v, inplace ? "_inplace" : "");
            R.check("rope", var, dt, shape, download(out.get(), N * W), ref_out, wb::tol<T>());
            if (norm)
                R.check("rope", var + "_rstd", dt, shape, download(rstd.get(), N * Hr), ref_rstd,
                        wb::tol<float>());
        }

    // CPU backward
    std::vector<float> dout = wb::round_to<T>(wb::random_vec(rng, N * W));
    std::vector<float> dqw0 = wb::random_vec(rng, S.hd), dkw0 = wb::random_vec(rng, S.hd);
    std::vector<float> dqr = cols_of(dout, N, W, 0, qd), dkr = cols_of(dout, N, W, qd, kvd);
    std::vector<float> dqn(q.size(), 0.f), dkn(k.size(), 0.f);
    cpu::rope_backward<float>(dqn.data(), dqr.data(), cos_t.data(), sin_t.data(), (int)N, S.T, S.nh,
                              S.hd);
    cpu::rope_backward<float>(dkn.data(), dkr.data(), cos_t.data(), sin_t.data(), (int)N, S.T,
                              S.nkv, S.hd);
    std::vector<float> dq = dqn, dk = dkn, rdqw = dqw0, rdkw = dkw0;
    if (norm) {
        std::fill(dq.begin(), dq.end(), 0.f);
        std::fill(dk.begin(), dk.end(), 0.f);
        cpu::rmsnorm_backward<float>(dq.data(), rdqw.data(), dqn.data(), q.data(), qw.data(),
                                     rq.data(), (int)(N * S.nh), S.hd);
        cpu::rmsnorm_backward<float>(dk.data(), rdkw.data(), dkn.data(), k.data(), kw.data(),
                                     rk.data(), (int)(N * S.nkv), S.hd);
    }
    std::vector<float> ref_din = dout;
    put_cols(ref_din, dq, N, W, 0, qd);
    put_cols(ref_din, dk, N, W, qd, kvd);

    auto d_dout = wb::to_device<T>(dout);
    upload(rstd.get(), ref_rstd.data(), N * Hr);
    DeviceBuffer<T> din(N * W);
    DeviceBuffer<float> scratch(qknorm_rope_backward_scratch(N, S.nh, S.nkv, S.hd));
    for (int v = 1; v <= 2; v++) {
        fill(din.get(), N * W, NAN, 0);
        auto dqw = wb::to_device<float>(dqw0);
        auto dkw = wb::to_device<float>(dkw0);
        backward_variant<T>(v, din.get(), dqw.get(), dkw.get(), scratch.get(), d_dout.get(),
                            d_in.get(), norm ? rstd.get() : nullptr, norm ? d_qw.get() : nullptr,
                            norm ? d_kw.get() : nullptr, d_cos.get(), d_sin.get(), N, S.T, S.nh,
                            S.nkv, S.hd, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::string var = strprintf("backward_v%d", v);
        R.check("rope", var + "_din", dt, shape, download(din.get(), N * W), ref_din, wb::tol<T>());
        if (norm) {
            R.check("rope", var + "_dq_w", dt, shape, download(dqw.get(), S.hd), rdqw, wb::tol<T>());
            R.check("rope", var + "_dk_w", dt, shape, download(dkw.get(), S.hd), rdkw, wb::tol<T>());
            std::vector<float> q1 = download(dqw.get(), S.hd);
            upload(dqw.get(), dqw0.data(), S.hd);
            backward_variant<T>(v, din.get(), dqw.get(), nullptr, scratch.get(), d_dout.get(),
                                d_in.get(), rstd.get(), d_qw.get(), d_kw.get(), d_cos.get(),
                                d_sin.get(), N, S.T, S.nh, S.nkv, S.hd, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            R.check_same("rope", var + "_dq_w", dt, shape, download(dqw.get(), S.hd), q1);
        }
    }
    if (!norm) {  // production in place (the trainer without QK-norm): bit for bit the out-of-place
                  // result, the v heads left as they were (== dout)
        const std::vector<float> out_of_place = download(din.get(), N * W);
        upload(din.get(), dout.data(), N * W);
        backward_variant<T>(2, din.get(), nullptr, nullptr, scratch.get(), din.get(), d_in.get(), nullptr,
                            nullptr, nullptr, d_cos.get(), d_sin.get(), N, S.T, S.nh, S.nkv, S.hd, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        R.check_same("rope", "backward_v2_inplace_din", dt, shape, download(din.get(), N * W), out_of_place);
    }
}

template <typename T>
static void bench(Report& R, const Shape& S, bool norm) {
    const char* dt = dtype_name<T>();
    const std::string shape = S.str(norm);
    const int64_t N = S.N();
    const int W = S.W(), Hr = S.nh + S.nkv, half = S.hd / 2;
    DeviceBuffer<T> in(N * W), out(N * W), dout(N * W), din(N * W), qw(S.hd), kw(S.hd);
    DeviceBuffer<float> rstd(N * Hr), cs((int64_t)S.T * half), sn((int64_t)S.T * half), dqw(S.hd),
        dkw(S.hd), scratch(qknorm_rope_backward_scratch(N, S.nh, S.nkv, S.hd));
    fill(in.get(), in.n, 0.5f, 0);
    fill(dout.get(), dout.n, 0.1f, 0);
    fill(qw.get(), qw.n, 1.f, 0);
    fill(kw.get(), kw.n, 1.f, 0);
    fill(cs.get(), cs.n, 0.6f, 0);
    fill(sn.get(), sn.n, 0.8f, 0);
    fill(rstd.get(), rstd.n, 1.f, 0);
    fill(dqw.get(), dqw.n, 0.f, 0);
    fill(dkw.get(), dkw.n, 0.f, 0);
    const double bytes = 2.0 * N * W * sizeof(T);
    for (int v = 1; v <= 2; v++) {
        float ms = time_median_ms(
            [&] { forward_variant<T>(v, out.get(), rstd.get(), in.get(), norm ? qw.get() : nullptr,
                                     kw.get(), cs.get(), sn.get(), N, S.T, S.nh, S.nkv, S.hd,
                                     1e-6f, 0); },
            wb::kWarmup, wb::kReps);
        R.bench("rope", strprintf("forward_v%d", v), dt, shape, ms, bytes, -1);
        ms = time_median_ms(
            [&] { backward_variant<T>(v, din.get(), dqw.get(), dkw.get(), scratch.get(), dout.get(),
                                      in.get(), rstd.get(), norm ? qw.get() : nullptr, kw.get(),
                                      cs.get(), sn.get(), N, S.T, S.nh, S.nkv, S.hd, 0); },
            wb::kWarmup, wb::kReps);
        R.bench("rope", strprintf("backward_v%d", v), dt, shape, ms,
                bytes * (norm ? 1.5 : 1.0), -1);
    }
    if (!norm) {  // production's in-place backward: q and k read and written, v untouched
        const float ms = time_median_ms(
            [&] { backward_variant<T>(2, dout.get(), nullptr, nullptr, scratch.get(), dout.get(), in.get(), nullptr,
                                      nullptr, nullptr, cs.get(), sn.get(), N, S.T, S.nh, S.nkv, S.hd, 0); },
            wb::kWarmup, wb::kReps);
        R.bench("rope", "backward_v2_inplace", dt, shape, ms, 2.0 * N * (S.nh + S.nkv) * S.hd * sizeof(T), -1);
    }
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "rope", "QK-norm + RoPE forward and backward (v1, v2 = production)",
                                 "2 CHECK shapes; BENCH bf16 llama-400m only");
        rc >= 0)
        return rc;
    exit_if_no_gpu("rope");
    const bool quick = cli.quick;
    try {
        std::printf("rope: %s\n", device_description().c_str());
        Report R;
        Rng rng(5);
        if (cli.check) {
            const Shape small[] = {{2, 13, 4, 2, 8}, {3, 37, 3, 1, 6}, {2, 64, 16, 8, 128}};
            for (int i = 0; i < (quick ? 2 : 3); i++)
                for (int norm = 0; norm <= 1; norm++) {
                    check<float>(R, rng, small[i], norm != 0);
                    check<bf16>(R, rng, small[i], norm != 0);
                }
        }
        if (cli.bench) {
            bench<bf16>(R, {8, 2048, 16, 16, 64}, false);
            if (!quick) {
                bench<float>(R, {8, 2048, 16, 16, 64}, false);
                bench<bf16>(R, {8, 2048, 16, 8, 128}, true);
            }
        }
        return R.finish("rope");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rope: error: %s\n", e.what());
        return 1;
    }
}
