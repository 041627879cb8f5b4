// dev/cuda/infer.cu — workbench for the inference kernels of cuda/infer.cuh: kv_cache_append
// (new k, v heads of the packed qkvr rows into the [B, max_T, kv_dim] cache at positions len ..
// len+n-1) and cached_attention_forward (each new query row against the cache up to its own
// position; GQA; 4 warps per row, online softmax merged in order) against the host reference
// cached_attention_row_ref (cuda/infer_math.h, the same decomposition) on the same T-rounded
// inputs; decode (n = 1) and chunked (n > 1) steps, fp32 and bf16. Then decode timing on
// llama-400m-like (B 8, nh = nkv = 16, hd 64, 2048 cached positions) and qwen3-like (B 4, nh 16,
// nkv 8, hd 128, 8192 positions) caches: bytes = the K and V rows read.
// Usage: build/cuda/infer [--quick] [--check-only | --bench-only] [--help] (workbench.cuh Cli).
// Output format: doc/cuda.md. Not yet run on a GPU.
#include "cuda/infer.cuh"
#include "dev/cuda/workbench.cuh"

using namespace ldm;
using namespace ldm::gpu;
using wb::Report;
using wb::Rng;

struct Shape {
    int B, n, len, max_T, nh, nkv, hd;
    std::string str() const {
        return strprintf("B=%d,n=%d,len=%d,max_T=%d,nh=%d,nkv=%d,hd=%d", B, n, len, max_T, nh, nkv, hd);
    }
};

// The correctness cases of this workbench (also run under CPU emulation by test_emu_infer).
const Shape kCheckShapes[6] = {
    {1, 1, 0, 4, 2, 1, 8},        // first position: a single key
    {2, 1, 5, 9, 4, 2, 16},       // decode, GQA 2:1
    {3, 3, 7, 12, 6, 3, 6},       // chunk of 3 new tokens, hd not a multiple of 32
    {2, 1, 130, 200, 4, 4, 64},   // longer cache, hd 64
    {1, 5, 40, 64, 8, 2, 128},    // chunk, GQA 4:1, hd 128
    {1, 1, 300, 301, 2, 1, 256},  // hd 256 (the maximum), cache full
};

// wb::to_device, kept out of line (inlined into check() GCC 12 reports a bogus
// -Walloc-size-larger-than on the host-side conversion vector).
template <typename T>
__attribute__((noinline)) static DeviceBuffer<T> to_dev(const std::vector<float>& v) {
    return wb::to_device<T>(v);
}

template <typename T>
static void check(Report& R, Rng& rng, const Shape& S) {
    const char* dt = dtype_name<T>();
    const std::string shape = S.str();
    const int64_t N = (int64_t)S.B * S.n, C3 = (int64_t)(S.nh + 2 * S.nkv) * S.hd, kvd = (int64_t)S.nkv * S.hd,
                  qd = (int64_t)S.nh * S.hd, cache = (int64_t)S.B * S.max_T * kvd;
    if (N <= 0 || C3 <= 0 || cache <= 0 || N * C3 > (1ll << 40) || cache > (1ll << 40))
        throw Error("infer workbench: bad shape " + shape);
    std::vector<float> qkvr = wb::round_to<T>(wb::random_vec(rng, N * C3));
    std::vector<float> kc = wb::round_to<T>(wb::random_vec(rng, cache)), vc = wb::round_to<T>(wb::random_vec(rng, cache));
    // host append
    std::vector<float> rk = kc, rv = vc;
    for (int64_t bt = 0; bt < N; bt++) {
        const int64_t b = bt / S.n, t = bt % S.n;
        for (int64_t c = 0; c < kvd; c++) {
            rk[(size_t)((b * S.max_T + S.len + t) * kvd + c)] = qkvr[(size_t)(bt * C3 + qd + c)];
            rv[(size_t)((b * S.max_T + S.len + t) * kvd + c)] = qkvr[(size_t)(bt * C3 + qd + kvd + c)];
        }
    }
    // host attention (the kernel's decomposition: 4 parts)
    std::vector<float> ref((size_t)(N * qd));
    const float scale = 1.f / std::sqrt((float)S.hd);
    const int G = S.nh / S.nkv;
    for (int64_t bt = 0; bt < N; bt++) {
        const int64_t b = bt / S.n, t = bt % S.n;
        for (int h = 0; h < S.nh; h++) {
            const int64_t g = h / G;
            cached_attention_row_ref(ref.data() + bt * qd + (int64_t)h * S.hd, qkvr.data() + bt * C3 + (int64_t)h * S.hd,
                                     rk.data() + b * S.max_T * kvd + g * S.hd, rv.data() + b * S.max_T * kvd + g * S.hd,
                                     kvd, (int)(S.len + t + 1), S.hd, scale, 4);
        }
    }
    auto d_qkvr = to_dev<T>(qkvr);
    auto d_k = to_dev<T>(kc);
    auto d_v = to_dev<T>(vc);
    DeviceBuffer<T> out(N * qd);
    fill(out.get(), N * qd, NAN, 0);
    kv_cache_append<T>(d_k.get(), d_v.get(), d_qkvr.get(), S.B, S.n, S.len, S.max_T, S.nh, S.nkv, S.hd, 0);
    cached_attention_forward<T>(out.get(), d_qkvr.get(), d_k.get(), d_v.get(), S.B, S.n, S.len, S.max_T, S.nh, S.nkv,
                                S.hd, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    R.check("infer", "kv_append_k", dt, shape, download(d_k.get(), cache), rk, 0.0);
    R.check("infer", "kv_append_v", dt, shape, download(d_v.get(), cache), rv, 0.0);
    const std::vector<float> got = download(out.get(), N * qd);
    R.check("infer", "cached_attention", dt, shape, got, ref, wb::tol<T>());
    cached_attention_forward<T>(out.get(), d_qkvr.get(), d_k.get(), d_v.get(), S.B, S.n, S.len, S.max_T, S.nh, S.nkv,
                                S.hd, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    R.check_same("infer", "cached_attention", dt, shape, download(out.get(), N * qd), got);
}

template <typename T>
static void bench(Report& R, const Shape& S) {
    const char* dt = dtype_name<T>();
    const int64_t N = (int64_t)S.B * S.n, C3 = (int64_t)(S.nh + 2 * S.nkv) * S.hd, kvd = (int64_t)S.nkv * S.hd,
                  cache = (int64_t)S.B * S.max_T * kvd;
    DeviceBuffer<T> qkvr(N * C3), kc(cache), vc(cache), out(N * (int64_t)S.nh * S.hd);
    fill(qkvr.get(), qkvr.n, 0.1f, 0);
    fill(kc.get(), kc.n, 0.2f, 0);
    fill(vc.get(), vc.n, 0.3f, 0);
    const double bytes = 2.0 * (double)S.B * (S.len + S.n) * kvd * sizeof(T);
    float ms = time_median_ms(
        [&] {
            cached_attention_forward<T>(out.get(), qkvr.get(), kc.get(), vc.get(), S.B, S.n, S.len, S.max_T, S.nh,
                                        S.nkv, S.hd, 0);
        },
        wb::kWarmup, wb::kReps);
    R.bench("infer", "cached_attention", dt, S.str(), ms, bytes, 4.0 * S.B * S.n * S.nh * (double)(S.len + S.n) * S.hd);
    ms = time_median_ms(
        [&] { kv_cache_append<T>(kc.get(), vc.get(), qkvr.get(), S.B, S.n, S.len, S.max_T, S.nh, S.nkv, S.hd, 0); },
        wb::kWarmup, wb::kReps);
    R.bench("infer", "kv_append", dt, S.str(), ms, 4.0 * N * kvd * sizeof(T), -1);
}

int main(int argc, char** argv) {
    wb::Cli cli;
    if (const int rc = cli.parse(argc, argv, "infer", "KV-cache append and cached attention (decode and chunked)",
                                 "4 CHECK shapes; BENCH bf16 llama-400m decode only");
        rc >= 0)
        return rc;
    exit_if_no_gpu("infer");
    const bool quick = cli.quick;
    try {
        std::printf("infer: %s\n", device_description().c_str());
        Report R;
        Rng rng(11);
        for (int i = 0; cli.check && i < (quick ? 4 : 6); i++) {
            check<float>(R, rng, kCheckShapes[i]);
            check<bf16>(R, rng, kCheckShapes[i]);
        }
        if (cli.bench) {
            bench<bf16>(R, {8, 1, 2047, 2048, 16, 16, 64});
            if (!quick) {
                bench<float>(R, {8, 1, 2047, 2048, 16, 16, 64});
                bench<bf16>(R, {4, 1, 8191, 8192, 16, 8, 128});
            }
        }
        return R.finish("infer");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "infer: error: %s\n", e.what());
        return 1;
    }
}
