// dev/cuda/workbench.cuh — helpers for the dev/cuda workbenches: the command line they all take
// (Cli); for the matmul / embedding / rmsnorm / rope / swiglu / infer workbenches also random
// inputs, rounding to the activation type, CHECK / BENCH lines in the format of doc/cuda.md
// (workbench output convention), and a failure count for the exit code.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common.cuh"

namespace ldm {
namespace gpu {
namespace wb {

// Deterministic xorshift generator; uniform() in [-1, 1).
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    float uniform() { return (float)((next() >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f; }
};

// n values offset + scale·u, u uniform in [-1, 1); never exactly 0 when offset == 0.
inline std::vector<float> random_vec(Rng& r, int64_t n, float scale = 1.f, float offset = 0.f) {
    std::vector<float> v((size_t)n);
    for (auto& x : v) {
        float u = r.uniform();
        if (offset == 0.f && u == 0.f) u = 0.5f;
        x = offset + scale * u;
    }
    return v;
}

// The values T would hold (round to nearest even for bf16), back in fp32.
template <typename T>
inline std::vector<float> round_to(const std::vector<float>& v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = to_f(from_f<T>(v[i]));
    return o;
}

// Device buffer of T holding v (rounded to T).
template <typename T>
inline DeviceBuffer<T> to_device(const std::vector<float>& v) {
    DeviceBuffer<T> b((int64_t)v.size());
    if (!v.empty()) upload(b.get(), v.data(), (int64_t)v.size());
    return b;
}

// Tolerance on the relative error ||got - ref|| / ||ref||: fp32 tight, bf16 loose.
template <typename T>
inline double tol();
template <>
inline double tol<float>() { return 1e-4; }
template <>
inline double tol<bf16>() { return 2e-2; }

struct Report {
    int checks = 0, fails = 0;
    // Prints a CHECK line comparing got with ref; counts failures (also on non-finite values or
    // size mismatch).
    bool check(const char* family, const std::string& variant, const char* dtype,
               const std::string& shape, const std::vector<float>& got,
               const std::vector<float>& ref, double tolerance) {
        Compare c;
        bool ok = got.size() == ref.size();
        if (ok) c = compare(got.data(), ref.data(), (int64_t)got.size());
        ok = ok && c.finite && c.rel <= tolerance;
        std::printf("CHECK %s %s %s %s rel=%.3e max_abs=%.3e %s\n", family, variant.c_str(), dtype,
                    shape.c_str(), c.rel, c.max_abs, ok ? "PASS" : "FAIL");
        std::fflush(stdout);
        checks++;
        if (!ok) fails++;
        return ok;
    }
    // Determinism: prints a CHECK line with variant "<variant>_repeat" that passes only when a
    // and b (two runs from the same inputs) are bit-identical.
    bool check_same(const char* family, const std::string& variant, const char* dtype,
                    const std::string& shape, const std::vector<float>& a,
                    const std::vector<float>& b) {
        bool ok = a.size() == b.size() &&
                  (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        double max_abs = 0;
        if (a.size() == b.size())
            for (size_t i = 0; i < a.size(); i++)
                max_abs = std::max(max_abs, (double)std::fabs(a[i] - b[i]));
        std::printf("CHECK %s %s_repeat %s %s rel=- max_abs=%.3e %s\n", family, variant.c_str(),
                    dtype, shape.c_str(), max_abs, ok ? "PASS" : "FAIL");
        std::fflush(stdout);
        checks++;
        if (!ok) fails++;
        return ok;
    }
    // Prints a BENCH line; bytes / flops <= 0 print "-".
    void bench(const char* family, const std::string& variant, const char* dtype,
               const std::string& shape, float ms, double bytes, double flops) {
        char gbs[32] = "-", tfs[32] = "-";
        if (bytes > 0) std::snprintf(gbs, sizeof gbs, "%.1f", bytes / (ms * 1e-3) / 1e9);
        if (flops > 0) std::snprintf(tfs, sizeof tfs, "%.1f", flops / (ms * 1e-3) / 1e12);
        std::printf("BENCH %s %s %s %s ms=%.4f GB/s=%s TFLOP/s=%s\n", family, variant.c_str(),
                    dtype, shape.c_str(), ms, gbs, tfs);
        std::fflush(stdout);
    }
    int finish(const char* family) const {
        std::printf("%s: %d checks, %d failed\n", family, checks, fails);
        return fails ? 1 : 0;
    }
};

// The command line every workbench takes (doc/cuda.md "Workbench convention"):
//   --quick        the workbench's smaller run (parse's `quick_means` says what it leaves out)
//   --check-only   the CHECK lines only: no timing
//   --bench-only   the BENCH lines only: no CPU reference, so timings without a correctness check
//   --help, -h     the usage on stdout
// plus the workbench's own flags that take a value (`value_flags`, e.g. --nccl-id-file PATH).
struct Cli {
    bool quick = false, check = true, bench = true;
    // Set before parse where --quick times nothing: --quick with --bench-only is then refused.
    bool quick_times_nothing = false;
    std::vector<std::pair<std::string, std::string>> values;  // (flag, value) of the value flags given

    // Parses argv[1..]. Returns -1 to go on; 0 after --help (usage on stdout); 2 after a flag it
    // does not know, a value flag without its value, --check-only with --bench-only, or --quick
    // with --bench-only where quick_times_nothing (the error and the usage on stderr). `about`: one
    // line on what the workbench checks and times.
    int parse(int argc, char** argv, const char* name, const char* about, const char* quick_means,
              const std::vector<std::string>& value_flags = {}, const char* value_usage = "") {
        auto usage = [&](FILE* f) {
            std::fprintf(f,
                         "usage: %s [--quick] [--check-only | --bench-only] %s[--help]\n"
                         "  %s\n"
                         "  CHECK lines compare each kernel variant with its CPU reference, BENCH lines time it\n"
                         "  (doc/cuda.md \"Workbench convention\"); without flags: every CHECK, then every BENCH.\n"
                         "  --quick       %s\n"
                         "  --check-only  the CHECK lines only (no timing)\n"
                         "  --bench-only  the BENCH lines only (no CPU reference: timings without a check)\n"
                         "  --help, -h    this text\n"
                         "exit status: 0 every CHECK passed (or no GPU: \"skipped: no GPU\"), 1 a CHECK failed or an\n"
                         "error, 2 a bad command line\n",
                         name, value_usage, about, quick_means);
        };
        bool check_only = false, bench_only = false;
        for (int i = 1; i < argc; i++) {
            const std::string a = argv[i];
            if (a == "--help" || a == "-h") {
                usage(stdout);
                return 0;
            }
            std::string err;
            if (a == "--quick") quick = true;
            else if (a == "--check-only") check_only = true;
            else if (a == "--bench-only") bench_only = true;
            else if (std::find(value_flags.begin(), value_flags.end(), a) != value_flags.end()) {
                if (i + 1 < argc) values.emplace_back(a, argv[++i]);
                else err = a + " needs a value";
            } else err = "unknown argument '" + a + "'";
            if (err.empty() && check_only && bench_only) err = "--check-only and --bench-only exclude each other";
            if (err.empty() && quick && bench_only && quick_times_nothing)
                err = "--quick times nothing here, so --quick --bench-only would run nothing";
            if (!err.empty()) {
                std::fprintf(stderr, "%s: error: %s\n", name, err.c_str());
                usage(stderr);
                return 2;
            }
        }
        check = !bench_only;
        bench = !check_only;
        if (!check) std::printf("%s: --bench-only: no CHECK runs (timings only)\n", name);
        if (!bench) std::printf("%s: --check-only: no BENCH runs\n", name);
        std::fflush(stdout);
        return -1;
    }
    // The last value given for `flag`, else `dflt`.
    std::string value(const std::string& flag, const std::string& dflt = "") const {
        std::string v = dflt;
        for (const auto& fv : values)
            if (fv.first == flag) v = fv.second;
        return v;
    }
};

// Timing defaults: median of 20 after 3 warm-up calls (doc/cuda.md convention).
constexpr int kWarmup = 3, kReps = 20;

}  // namespace wb
}  // namespace gpu
}  // namespace ldm
