// dev/bench_scheme.cpp — cost of each depth-aggregation scheme of the CPU reference (issue #20,
// spec performance.md "On the CPU"): the scheme alone and the whole model step, per scheme.
//
//   build/bench_scheme [--preset small] [--d-model D] [--n-layer L] [-T T] [-B B] [--vocab V]
//                      [--schemes preln,hc,...] [--reps R] [--threads N] [--dtype fp32|fp64]
//                      [--no-model] [--json]
//
// Per scheme: "scheme fwd/bwd" drives the Scheme interface alone (resize, begin, input/output of
// every sublayer, readout, then the backward sequence) on fixed random tensors; "model fwd/bwd"
// is cpu::Model forward + backward (no optimizer) on random tokens. Each number is the median of
// R repetitions after one warm-up; wall ms and process CPU ms (all threads). Variants: preln hc
// mhc attnres-full attnres-block ldm (rls, store) ldm-unwind ldm-delta ldm-outer
// ldm-outer-unwind ldm-nores ldm-window. Exit status 1 with "error: ..." on bad flags.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "core/cli.h"
#include "core/common.h"
#include "core/config.h"
#include "cpu/model.h"
#include "cpu/ops.h"
#include "cpu/scheme.h"

namespace {

using namespace ldm;

double cpu_seconds() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct Timing {
    std::vector<double> wall, cpu;
    void add(double w, double c) { wall.push_back(w * 1e3); cpu.push_back(c * 1e3); }
    double wall_ms() const { return wall.empty() ? 0 : ldm::median(wall); }
    double cpu_ms() const { return cpu.empty() ? 0 : ldm::median(cpu); }
};

template <class F>
void timed(Timing& t, F&& f) {
    const double w0 = omp_get_wtime(), c0 = cpu_seconds();
    f();
    t.add(omp_get_wtime() - w0, cpu_seconds() - c0);
}

// The configuration of a variant name on top of the base model.
ModelConfig variant(ModelConfig c, const std::string& v) {
    c.scheme = v.rfind("ldm", 0) == 0 ? "ldm" : v;
    if (v == "ldm-unwind") c.ldm_mode = "unwind";
    else if (v == "ldm-delta") c.ldm_rule = "delta";
    else if (v == "ldm-outer") c.ldm_rule = "outer";
    else if (v == "ldm-outer-unwind") c.ldm_rule = "outer", c.ldm_mode = "unwind";
    else if (v == "ldm-nores") c.ldm_residual = false;
    else if (v == "ldm-window") c.ldm_mode = "window";
    else if (c.scheme == "ldm" && v != "ldm") throw Error("unknown variant '" + v + "'");
    c.validate();
    return c;
}

template <typename R>
struct Row {
    std::string name;
    Timing sf, sb, mf, mb;
};

// The timed passes (not inlined, so a profiler can select them: valgrind --tool=callgrind
// --toggle-collect='*scheme_forward*' ...).
template <typename R>
__attribute__((noinline)) void scheme_forward(cpu::Scheme<R>& S, int B, int T, int D, size_t nd, const R* e,
                                              const R* os, R* x) {
    S.resize(B, T);
    S.begin(e);
    for (int j = 1; j <= D; j++) {
        S.input(j, x);
        S.output(j, os + (size_t)(j - 1) * nd);
    }
    S.readout(x);
}
template <typename R>
__attribute__((noinline)) void scheme_backward(cpu::Scheme<R>& S, int D, size_t nd, const R* dy, const R* dxs,
                                               R* d_o, R* de) {
    S.readout_backward(dy);
    for (int j = D; j >= 1; j--) {
        S.output_backward(j, d_o);
        S.input_backward(j, dxs + (size_t)(j - 1) * nd);
    }
    S.begin_backward(de);
}
template <typename R>
__attribute__((noinline)) void model_step(cpu::Model<R>& m, const int32_t* tok, const int32_t* tgt, int B, int T,
                                          Timing& tf, Timing& tb) {
    timed(tf, [&] { m.forward(tok, tgt, B, T); });
    timed(tb, [&] { m.backward(1.0); });
}

template <typename R>
void bench_scheme(const ModelConfig& cfg, int B, int T, int reps, Row<R>& row) {
    const int N = B * T, d = cfg.d_model, D = cfg.n_sublayers();
    std::vector<ParamSpec> ss = scheme_param_specs(cfg);
    int64_t np = 0;
    for (const auto& s : ss) np = std::max(np, s.offset + s.numel);
    std::vector<R> params((size_t)np), grads((size_t)np);
    std::unique_ptr<cpu::Scheme<R>> S = cpu::make_scheme<R>(cfg);
    S->init_params(params.data(), 1, 0);
    S->bind(np ? params.data() : nullptr, np ? grads.data() : nullptr);
    std::mt19937_64 rng(7);
    std::normal_distribution<double> nd(0.0, 1.0);
    auto randv = [&](size_t n, double s) {
        std::vector<R> v(n);
        for (auto& x : v) x = (R)(s * nd(rng));
        return v;
    };
    const size_t nd_ = (size_t)N * d;
    std::vector<R> e = randv(nd_, 1.0), os = randv(nd_ * D, 1.0), dxs = randv(nd_ * D, 1e-3),
                   dy = randv(nd_, 1e-3), x(nd_), d_o(nd_), de(nd_);
    for (int r = 0; r <= reps; r++) {
        Timing tf, tb;
        timed(tf, [&] { scheme_forward(*S, B, T, D, nd_, e.data(), os.data(), x.data()); });
        timed(tb, [&] { scheme_backward(*S, D, nd_, dy.data(), dxs.data(), d_o.data(), de.data()); });
        if (r == 0) continue;  // warm-up
        row.sf.add(tf.wall[0] / 1e3, tf.cpu[0] / 1e3);
        row.sb.add(tb.wall[0] / 1e3, tb.cpu[0] / 1e3);
    }
}

template <typename R>
void bench_model(const ModelConfig& cfg, int B, int T, int reps, Row<R>& row) {
    cpu::Model<R> m(cfg);
    m.init(1);
    std::mt19937 rng(11);
    std::vector<int32_t> tok((size_t)B * T), tgt((size_t)B * T);
    for (auto& t : tok) t = (int32_t)(rng() % cfg.vocab_size);
    for (auto& t : tgt) t = (int32_t)(rng() % cfg.vocab_size);
    for (int r = 0; r <= reps; r++) {
        Timing tf, tb;
        m.zero_grad();
        model_step(m, tok.data(), tgt.data(), B, T, tf, tb);
        if (r == 0) continue;
        row.mf.add(tf.wall[0] / 1e3, tf.cpu[0] / 1e3);
        row.mb.add(tb.wall[0] / 1e3, tb.cpu[0] / 1e3);
    }
}

template <typename R>
int run(const ModelConfig& base, const std::vector<std::string>& names, int B, int T, int reps,
        bool model, bool json) {
    std::vector<Row<R>> rows;
    for (const auto& v : names) {
        Row<R> row;
        row.name = v;
        ModelConfig c = variant(base, v);
        bench_scheme<R>(c, B, T, reps, row);
        if (model) bench_model<R>(c, B, T, reps, row);
        rows.push_back(row);
        std::fflush(stdout);
    }
    const double pre = rows[0].mf.wall_ms() + rows[0].mb.wall_ms();
    std::printf("%-18s %9s %9s %9s | %9s %9s %9s %7s | cpu ms: %8s %8s\n", "scheme", "sch fwd", "sch bwd",
                "sch tot", "mod fwd", "mod bwd", "mod tot", "ratio", "sch tot", "mod tot");
    for (const auto& r : rows) {
        const double st = r.sf.wall_ms() + r.sb.wall_ms(), mt = r.mf.wall_ms() + r.mb.wall_ms();
        std::printf("%-18s %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f %7.3f | cpu ms: %8.2f %8.2f\n",
                    r.name.c_str(), r.sf.wall_ms(), r.sb.wall_ms(), st, r.mf.wall_ms(), r.mb.wall_ms(), mt,
                    pre > 0 ? mt / pre : 0.0, r.sf.cpu_ms() + r.sb.cpu_ms(), r.mf.cpu_ms() + r.mb.cpu_ms());
        if (json)
            std::printf("BENCH_SCHEME {\"scheme\":\"%s\",\"B\":%d,\"T\":%d,\"threads\":%d,\"scheme_fwd_ms\":%.4f,"
                        "\"scheme_bwd_ms\":%.4f,\"model_fwd_ms\":%.4f,\"model_bwd_ms\":%.4f,"
                        "\"scheme_cpu_ms\":%.4f,\"model_cpu_ms\":%.4f}\n",
                        r.name.c_str(), B, T, omp_get_max_threads(), r.sf.wall_ms(), r.sb.wall_ms(), r.mf.wall_ms(),
                        r.mb.wall_ms(), r.sf.cpu_ms() + r.sb.cpu_ms(), r.mf.cpu_ms() + r.mb.cpu_ms());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        std::string preset = "small", schemes = "preln,hc,mhc,attnres-full,attnres-block,ldm,ldm-unwind,ldm-delta,ldm-outer",
                    dtype = "fp32";
        int d_model = 0, n_layer = 0, T = 256, B = 4, vocab = 50257, reps = 5, threads = 0;
        bool no_model = false, json = false;
        ArgParser ap("bench_scheme", "time each depth-aggregation scheme alone and in the model step (CPU)");
        ap.add("--preset", &preset, "model preset");
        ap.add("--d-model", &d_model, "override: width d (0 = preset)");
        ap.add("--n-layer", &n_layer, "override: blocks (0 = preset)");
        ap.add("-T,--seq-len", &T, "tokens per sequence");
        ap.add("-B,--batch-size", &B, "sequences");
        ap.add("--vocab", &vocab, "vocabulary size (257 = byte level, 50257 = GPT-2)");
        ap.add("--schemes", &schemes, "comma-separated variants (the first is the ratio's reference)");
        ap.add("--reps", &reps, "timed repetitions (median) after one warm-up");
        ap.add("--threads", &threads, "OpenMP threads (0 = all cores)");
        ap.add("--dtype", &dtype, "fp32|fp64");
        ap.add("--no-model", &no_model, "time the schemes alone only");
        ap.add("--json", &json, "also print one BENCH_SCHEME json line per scheme");
        if (!ap.parse(argc, argv)) return 0;
        if (B <= 0 || T <= 0 || reps <= 0) throw Error("-B, -T, --reps must be > 0");
        check_threads_flag(threads);
        if (dtype != "fp32" && dtype != "fp64") throw Error("--dtype must be fp32 or fp64, got '" + dtype + "'");
        if (threads > 0) omp_set_num_threads(threads);
        ModelConfig base = preset_config(preset, vocab);
        if (d_model) base.d_model = d_model;
        if (n_layer) base.n_layer = n_layer;
        base.seq_len = T;
        std::vector<std::string> names;
        for (size_t p = 0; p <= schemes.size();) {
            size_t q = schemes.find(',', p);
            if (q == std::string::npos) q = schemes.size();
            if (q > p) names.push_back(schemes.substr(p, q - p));
            p = q + 1;
        }
        if (names.empty()) throw Error("--schemes is empty");
        for (const auto& v : names) variant(base, v);  // check every name before timing
        std::printf("bench_scheme: %s d=%d layers=%d T=%d B=%d V=%d %s threads=%d reps=%d\n", preset.c_str(),
                    base.d_model, base.n_layer, T, B, vocab, dtype.c_str(), omp_get_max_threads(), reps);
        return dtype == "fp32" ? run<float>(base, names, B, T, reps, !no_model, json)
                               : run<double>(base, names, B, T, reps, !no_model, json);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
