// test/gpu_compare.h — helpers for the GPU tests (test/test_gpu_*.cpp): find and probe a GPU
// trainer binary, load LDMDEBUG debug states (core/checkpoint.h) and compare a GPU dump with a CPU
// one tensor by tensor with per-tensor tolerances, printing a table. Header-only; the tests never
// link CUDA (they run the GPU trainers as subprocesses).
//
// Typical use (see test/test_gpu_train.cpp):
//   std::string gpu = gpu_trainer_or_skip("train_gpt_baselines");  // "" -> WARN "skipped: no GPU"
//   if (gpu.empty()) return;
//   ... run train_cpu --dump-debug-state a.dbg and gpu --dump-debug-state b.dbg --dtype fp32 ...
//   DebugState c = load_debug_state(a), g = load_debug_state(b);
//   CompareReport r = compare_debug_states(g, c, DebugTolerances::fp32());
//   INFO(r.table); CHECK(r.pass);
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/common.h"
#include "core/config.h"
#include "test/test_train_shards.h"

// Path of build*/cuda/<name> next to this test's build dir.
inline std::string gpu_binary_path(const std::string& name) { return build_dir_of_test() + "/cuda/" + name; }

// Returns the GPU trainer's path when it exists and `--gpu-info` succeeds (exit 0: a usable GPU);
// otherwise WARNs "skipped: no GPU (...)" visibly and returns "" (the caller returns, test passes).
inline std::string gpu_trainer_or_skip(const std::string& name) {
    const std::string p = gpu_binary_path(name);
    if (!ldm::file_exists(p)) {
        WARN("skipped: no GPU (" << p << " is not built: no nvcc on this machine?)");
        return "";
    }
    RunResult r = run_cmd("'" + p + "' --gpu-info");
    if (r.status != 0) {
        WARN("skipped: no GPU (" << name << " --gpu-info exited " << r.status << ": " << r.out << ")");
        return "";
    }
    WARN("GPU: " << r.out);
    return p;
}

// A debug state file (LDMDEBUG) in fp32 on the host (f64 dumps are converted).
struct DebugState {
    ldm::ModelConfig cfg;
    std::string dtype;
    int B = 0, T = 0;
    double loss = 0;
    std::vector<ldm::ParamSpec> specs;
    std::vector<float> params, logits, grads;
    std::vector<int32_t> inputs, targets;
};

inline std::vector<float> debug_tensor_f32(const ldm::CkptTensor& t) {
    std::vector<float> out;
    if (t.dtype == "f32") {
        out.resize(t.bytes.size() / 4);
        std::memcpy(out.data(), t.bytes.data(), out.size() * 4);
    } else if (t.dtype == "f64") {
        std::vector<double> d(t.bytes.size() / 8);
        std::memcpy(d.data(), t.bytes.data(), d.size() * 8);
        out.assign(d.begin(), d.end());
    } else {
        throw ldm::Error("debug state: tensor " + t.name + " has dtype " + t.dtype + ", expected f32/f64");
    }
    return out;
}

inline DebugState load_debug_state(const std::string& path) {
    ldm::Container c = ldm::read_container(path, "LDMDEBUG", "debug state");
    DebugState s;
    s.cfg = ldm::config_from_json(c.header.at("config"));
    s.dtype = c.header.at("dtype").get<std::string>();
    s.B = c.header.at("B").get<int>();
    s.T = c.header.at("T").get<int>();
    s.loss = c.header.at("loss").get<double>();
    s.specs = ldm::param_specs(s.cfg);
    s.params = debug_tensor_f32(c.tensor("params", path));
    s.logits = debug_tensor_f32(c.tensor("logits", path));
    s.grads = debug_tensor_f32(c.tensor("grads", path));
    for (const char* name : {"inputs", "targets"}) {
        const ldm::CkptTensor& t = c.tensor(name, path);
        std::vector<int32_t>& dst = std::string(name) == "inputs" ? s.inputs : s.targets;
        dst.resize(t.bytes.size() / 4);
        std::memcpy(dst.data(), t.bytes.data(), dst.size() * 4);
    }
    return s;
}

// Relative L2 error ||a - b|| / ||b|| (0 when both are 0) and the largest absolute difference.
struct Diff {
    double rel = 0, max_abs = 0, norm_b = 0, norm_diff = 0;
    bool finite = true;
};
inline Diff diff(const float* a, const float* b, int64_t n) {
    Diff d;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = a[i], y = b[i];
        if (!std::isfinite(x) || !std::isfinite(y)) d.finite = false;
        num += (x - y) * (x - y);
        den += y * y;
        d.max_abs = std::max(d.max_abs, std::fabs(x - y));
    }
    d.norm_b = std::sqrt(den);
    d.norm_diff = std::sqrt(num);
    d.rel = den > 0 ? d.norm_diff / d.norm_b : (num > 0 ? INFINITY : 0.0);
    return d;
}

// Tolerances of a GPU-vs-CPU comparison (relative L2 per tensor). grad(name) gives the bound of
// one parameter's gradient. A gradient tensor also passes when its whole difference is below
// `floor_frac` x tolerance x (largest |gradient| of the model) x sqrt(numel): tensors whose
// gradient is ~0 (e.g. padded vocabulary rows, tiny-init scheme gates) are compared absolutely.
struct DebugTolerances {
    double loss = 1e-5, logits = 1e-4;
    std::function<double(const std::string&)> grad = [](const std::string&) { return 1e-4; };
    double floor_frac = 1e-3;
    // fp32 GPU vs fp32 CPU: same math, different summation orders (flash attention, cuBLASLt).
    static DebugTolerances fp32() { return DebugTolerances{}; }
    // bf16 GPU vs fp32 CPU: bf16 activations and working weights (8 significant bits).
    // Matrices 3e-2; 1-D tensors (norm weights, biases) sum over all tokens of bf16 products: 5e-2.
    // The absolute floor is 1e-2 (not 1e-3) of tol x max|g|: a bf16 rounding error of 2^-9 of
    // every activation reaches every gradient with the size of the largest contributions, so a
    // tensor whose exact gradient nearly cancels (e.g. HC's A_m0 over 3-4 streams: 1e-4 of the
    // largest gradient) has a relative error far above tol without any bug; the same rule as the
    // scheme workbenches (dev/cuda/scheme_check.cuh: against max(own norm, 1e-2 of the largest)).
    static DebugTolerances bf16() {
        DebugTolerances t;
        t.floor_frac = 1e-2;
        t.loss = 1e-2;
        t.logits = 3e-2;
        t.grad = [](const std::string& name) {
            const bool vec = name.find("norm.w") != std::string::npos || name.find(".b") != std::string::npos;
            return vec ? 5e-2 : 3e-2;
        };
        return t;
    }
};

struct CompareReport {
    bool pass = true;
    std::string table;   // one line per compared item
    double worst_grad_rel = 0;
    std::string worst_grad;
};

// Compares loss, logits (the real V columns) and every gradient tensor of `got` (GPU) against
// `ref` (CPU). Both must have the same config, B, T, inputs and targets.
inline CompareReport compare_debug_states(const DebugState& got, const DebugState& ref, const DebugTolerances& tol) {
    CompareReport r;
    auto line = [&](const std::string& name, double rel, double max_abs, double bound, bool ok) {
        r.table += ldm::strprintf("%-34s rel=%.3e max_abs=%.3e tol=%.1e %s\n", name.c_str(), rel, max_abs, bound,
                                  ok ? "PASS" : "FAIL");
        r.pass = r.pass && ok;
    };
    if (ldm::config_diff(got.cfg, ref.cfg) != "" || got.B != ref.B || got.T != ref.T || got.inputs != ref.inputs ||
        got.targets != ref.targets || got.grads.size() != ref.grads.size()) {
        r.pass = false;
        r.table = "debug states are not comparable (config, B, T, inputs or targets differ): " +
                  ldm::config_diff(got.cfg, ref.cfg) + "\n";
        return r;
    }
    const double lrel = std::fabs(got.loss - ref.loss) / std::max(1e-30, std::fabs(ref.loss));
    line("loss", lrel, std::fabs(got.loss - ref.loss), tol.loss, lrel <= tol.loss);
    {
        const int64_t N = int64_t(ref.B) * ref.T, V = ref.cfg.vocab_size, Vp = ref.cfg.padded_vocab;
        std::vector<float> a, b;
        a.reserve(size_t(N * V));
        b.reserve(size_t(N * V));
        for (int64_t n = 0; n < N; n++)
            for (int64_t v = 0; v < V; v++) {
                a.push_back(got.logits[size_t(n * Vp + v)]);
                b.push_back(ref.logits[size_t(n * Vp + v)]);
            }
        Diff d = diff(a.data(), b.data(), int64_t(a.size()));
        line("logits", d.rel, d.max_abs, tol.logits, d.finite && d.rel <= tol.logits);
    }
    double gmax = 0;
    for (float g : ref.grads) gmax = std::max(gmax, double(std::fabs(g)));
    for (const auto& s : ref.specs) {
        Diff d = diff(got.grads.data() + s.offset, ref.grads.data() + s.offset, s.numel);
        const double t = tol.grad(s.name);
        const bool floor_ok = d.norm_diff <= tol.floor_frac * t * gmax * std::sqrt(double(s.numel));
        const bool ok = d.finite && (d.rel <= t || floor_ok);
        line("grad " + s.name, d.rel, d.max_abs, t, ok);
        if (d.rel > r.worst_grad_rel && !floor_ok) {
            r.worst_grad_rel = d.rel;
            r.worst_grad = s.name;
        }
    }
    return r;
}

// Mean loss per step of a trainer's JSONL log ({"type":"step"} lines, in order).
inline std::vector<double> step_losses(const std::string& log_path) {
    std::vector<double> out;
    for (const auto& j : read_jsonl(log_path))
        if (j.at("type") == "step") out.push_back(j.at("loss").get<double>());
    return out;
}
