// GPU LDM trainer tests (build/cuda/train_ldm, cuda/scheme_ldm.cuh) against the CPU reference
// (build/train_cpu --scheme ldm), both run as subprocesses on real FineWeb-Edu shards, for every
// rule (rls, delta, outer) and mode (store, unwind, checkpoint-every, window) plus no-residual and
// no-forget. Without a usable GPU (binary missing, or `--gpu-info` exits non-zero) every test
// prints "skipped: no GPU" (WARN) and passes. Tolerances (test/gpu_compare.h, doc/cuda.md):
//   one step, --dtype fp32: loss 1e-5, logits 1e-4, every gradient 1e-4 (DebugTolerances::fp32)
//   one step, --dtype bf16 (rls unwind only): DebugTolerances::bf16
//   (the kernels follow the shape: d_k <= 16 warp kernels, the rls-dk24 case the thread kernels)
//   window fallback (--ldm-drift-tol 1e-12): GPU and CPU keep window-start states (3)
//   resume: 5 steps + checkpoint + resume 5 == 10 straight, byte-identical .model/.state
//   drift fallback (--ldm-drift-tol 1e-12): GPU and CPU both switch to c = 2 after step 1, same losses
//   10-step loss trajectory, fp32: 1e-4 relative per step (--no-residual: 3e-3 after step 5, see
//   below); unwind runs log the drift every step
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/checkpoint.h"
#include "core/config.h"
#include "test/gpu_compare.h"
#include "test/test_train_shards.h"

namespace {

struct LdmCase {
    const char* name;
    const char* flags;  // LDM flags shared by train_cpu and train_ldm
};

const LdmCase kCases[] = {
    {"rls-store", "--ldm-rule rls --ldm-mode store"},
    {"rls-unwind", "--ldm-rule rls --ldm-mode unwind"},
    {"rls-unwind-c2", "--ldm-rule rls --ldm-mode unwind --ldm-checkpoint-every 2"},
    {"rls-window2", "--ldm-rule rls --ldm-mode window --ldm-window 2"},
    {"rls-window3", "--ldm-rule rls --ldm-mode window --ldm-window 3"},
    {"rls-window4", "--ldm-rule rls --ldm-mode window --ldm-window 4"},
    {"rls-window2-c", "--ldm-rule rls --ldm-mode window --ldm-window 2 --ldm-checkpoint-every 1"},
    {"outer-store", "--ldm-rule outer --ldm-mode store"},
    {"outer-unwind", "--ldm-rule outer --ldm-mode unwind"},
    {"delta-store", "--ldm-rule delta --ldm-mode store"},
    {"delta-c2", "--ldm-rule delta --ldm-mode store --ldm-checkpoint-every 2"},
    {"rls-nores-unwind", "--ldm-rule rls --ldm-mode unwind --no-residual"},
    {"rls-noforget-unwind", "--ldm-rule rls --ldm-mode unwind --ldm-no-forget --ldm-dk 4 --ldm-heads 2"},
    {"rls-dk24-unwind", "--ldm-rule rls --ldm-mode unwind --ldm-dk 24 --ldm-heads 2"},  // thread kernels
};

std::string ldm_shards_or_skip() {
    std::string dd = data_dir_or_skip("GPU LDM trainer tests need the FineWeb-Edu sample");
    if (dd.empty()) return "";
    std::string dir = build_dir_of_test() + "/test_tmp/gpu_ldm_shards";
    run_cmd("mkdir -p '" + dir + "'");
    make_fineweb_shards(dir, dd);
    return dir;
}

std::string data_flags(const std::string& shards, int B, int T) {
    return ldm::strprintf(" --preset tiny -B %d -T %d --seed 1337 --scheme ldm --train-data '%s/train.bin' ", B, T,
                          shards.c_str());
}

void run_ok(const std::string& cmd) {
    RunResult r = run_cmd(cmd);
    INFO("command: " << cmd << "\noutput:\n" << r.out);
    REQUIRE(r.status == 0);
}

// Step records of a JSONL log.
std::vector<nlohmann::json> step_records(const std::string& path) {
    std::vector<nlohmann::json> out;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty()) continue;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.value("type", "") == "step") out.push_back(j);
    }
    return out;
}

}  // namespace

TEST_CASE("gpu ldm: --help and --dry-run work without a GPU", "[gpu][ldm]") {
    const std::string p = gpu_binary_path("train_ldm");
    if (!ldm::file_exists(p)) {
        WARN("skipped: no GPU (" << p << " not built)");
        return;
    }
    RunResult h = run_cmd("'" + p + "' --help");
    CHECK(h.status == 0);
    CHECK_THAT(h.out, Catch::Contains("--ldm-mode") && Catch::Contains("--dtype"));
    RunResult d = run_cmd("'" + p + "' --preset llama-400m -T 2048 -B 8 --ldm-mode unwind --dry-run");
    INFO(d.out);
    CHECK(d.status == 0);
    CHECK_THAT(d.out, Catch::Contains("ldm"));
    RunResult g = run_cmd("'" + p + "' --gpu-info");
    CHECK((g.status == 0 || g.status == 2));
    if (g.status == 2) WARN("skipped: no GPU (train_ldm --gpu-info exited 2)");
}

TEST_CASE("gpu ldm: one step == CPU reference for every rule and mode (fp32; bf16 for rls unwind)", "[gpu][ldm]") {
    const std::string gpu = gpu_trainer_or_skip("train_ldm");
    if (gpu.empty()) return;
    const std::string shards = ldm_shards_or_skip();
    if (shards.empty()) return;
    for (const LdmCase& c : kCases) {
        const std::string dir = train_scratch(std::string("gpu_ldm_step_") + c.name);
        const std::string flags = data_flags(shards, 4, 64) + c.flags;
        run_ok(trainer_path() + flags + " --dump-debug-state " + dir + "/cpu.dbg");
        const DebugState ref = load_debug_state(dir + "/cpu.dbg");
        std::vector<std::string> dtypes = {"fp32"};
        if (std::string(c.name) == "rls-unwind" || std::string(c.flags).find("--ldm-mode window") != std::string::npos)
            dtypes.push_back("bf16");
        for (const std::string& dtype : dtypes) {
            const std::string out = dir + "/gpu_" + dtype + ".dbg";
            run_ok(gpu + flags + " --dtype " + dtype + " --dump-debug-state " + out);
            const DebugState got = load_debug_state(out);
            const CompareReport r =
                compare_debug_states(got, ref, dtype == "fp32" ? DebugTolerances::fp32() : DebugTolerances::bf16());
            INFO(c.name << " " << dtype << ":\n" << r.table);
            CHECK(r.pass);
            WARN(c.name << " " << dtype << ": loss gpu " << got.loss << " cpu " << ref.loss
                        << ", worst gradient " << r.worst_grad << " rel " << r.worst_grad_rel);
            CHECK(got.params == ref.params);
        }
    }
}

TEST_CASE("gpu ldm: 10-step loss trajectory == CPU reference; drift logged every step", "[gpu][ldm]") {
    const std::string gpu = gpu_trainer_or_skip("train_ldm");
    if (gpu.empty()) return;
    const std::string shards = ldm_shards_or_skip();
    if (shards.empty()) return;
    for (const LdmCase& c : kCases) {
        const std::string dir = train_scratch(std::string("gpu_ldm_traj_") + c.name);
        const std::string flags = data_flags(shards, 4, 64) + c.flags +
                                  " --steps 10 --lr 3e-3 --warmup-steps 2 --sample-every -1 --quiet";
        run_ok(trainer_path() + flags + " --log " + dir + "/cpu.jsonl");
        run_ok(gpu + flags + " --dtype fp32 --log " + dir + "/gpu.jsonl");
        const std::vector<double> ref = step_losses(dir + "/cpu.jsonl"), got = step_losses(dir + "/gpu.jsonl");
        REQUIRE(ref.size() == 10);
        REQUIRE(got.size() == 10);
        // --no-residual is chaotic at init (x_j = r_j is tiny next to the RMSNorm eps, spec §2.5):
        // the CPU's own fp32 store and unwind runs (same math, different rounding) already part by
        // 3.6e-4 relative at step 9 (measured, tiny B=4 T=64 lr 3e-3). So after step 5 it gets 3e-3.
        const bool chaotic = std::string(c.flags).find("--no-residual") != std::string::npos;
        for (size_t i = 0; i < 10; i++) {
            const double tol = chaotic && i >= 5 ? 3e-3 : 1e-4;
            INFO(c.name << " step " << i + 1 << ": gpu " << got[i] << " cpu " << ref[i] << " tol " << tol);
            CHECK(std::fabs(got[i] - ref[i]) <= tol * std::fabs(ref[i]));
        }
        // unwinding modes log the drift in every step record, like train_cpu
        const std::vector<nlohmann::json> cs = step_records(dir + "/cpu.jsonl"), gs = step_records(dir + "/gpu.jsonl");
        REQUIRE(gs.size() == 10);
        for (size_t i = 0; i < gs.size(); i++) {
            INFO(c.name << " step " << i + 1 << ": " << gs[i].dump());
            CHECK(gs[i].contains("ldm_drift_S") == cs[i].contains("ldm_drift_S"));
            if (gs[i].contains("ldm_drift_S")) {
                CHECK(gs[i]["ldm_drift_S"].get<double>() < 1e-3);
                CHECK(gs[i]["ldm_fallback"].get<double>() == 0.0);
            }
        }
    }
}

TEST_CASE("gpu ldm: 5 steps + checkpoint + resume 5 == 10 straight (bit-exact, rls unwind and store)",
          "[gpu][ldm]") {
    const std::string gpu = gpu_trainer_or_skip("train_ldm");
    if (gpu.empty()) return;
    const std::string shards = ldm_shards_or_skip();
    if (shards.empty()) return;
    for (std::string mode : {"unwind", "store"}) {
        const std::string dir = train_scratch("gpu_ldm_resume_" + mode);
        const std::string cmd = gpu + data_flags(shards, 2, 32) + "--ldm-mode " + mode +
                                " --dtype bf16 --quiet --steps 10 --lr 3e-3 --warmup-steps 2 --sample-every -1";
        run_ok(cmd + " --out-dir " + dir + "/C --log " + dir + "/C/log.jsonl");
        run_ok(cmd + " --ckpt-every 5 --out-dir " + dir + "/A");
        REQUIRE(ldm::file_exists(dir + "/A/ckpt_000005.state"));
        run_ok(cmd + " --resume " + dir + "/A/ckpt_000005 --out-dir " + dir + "/B --log " + dir + "/B/log.jsonl");
        for (const char* ext : {".model", ".state"}) {
            INFO(mode << " " << ext);
            CHECK(ldm::read_file(dir + "/C/ckpt_000010" + ext) == ldm::read_file(dir + "/B/ckpt_000010" + ext));
        }
        const std::vector<double> lc = step_losses(dir + "/C/log.jsonl"), lb = step_losses(dir + "/B/log.jsonl");
        REQUIRE(lc.size() == 10);
        REQUIRE(lb.size() == 5);
        for (size_t i = 0; i < 5; i++) CHECK(lb[i] == lc[i + 5]);
    }
}

TEST_CASE("gpu ldm: drift above --ldm-drift-tol falls back to checkpointed segments, like the CPU", "[gpu][ldm]") {
    const std::string gpu = gpu_trainer_or_skip("train_ldm");
    if (gpu.empty()) return;
    const std::string shards = ldm_shards_or_skip();
    if (shards.empty()) return;
    const std::string dir = train_scratch("gpu_ldm_fallback");
    // a tolerance no fp32 unwind meets: both trainers fall back after step 1 (c = round(sqrt(D+1)) = 2)
    const std::string flags = data_flags(shards, 4, 64) +
                              "--ldm-mode unwind --ldm-drift-tol 1e-12 --steps 6 --lr 3e-3 --warmup-steps 2 "
                              "--sample-every -1 --quiet";
    run_ok(trainer_path() + flags + " --log " + dir + "/cpu.jsonl");
    RunResult r = run_cmd(gpu + flags + " --dtype fp32 --log " + dir + "/gpu.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("falling back to checkpointed segments every 2 writes"));
    const std::vector<nlohmann::json> cs = step_records(dir + "/cpu.jsonl"), gs = step_records(dir + "/gpu.jsonl");
    REQUIRE(cs.size() == 6);
    REQUIRE(gs.size() == 6);
    for (size_t i = 0; i < 6; i++) {
        INFO("step " << i + 1 << ": gpu " << gs[i].dump() << "\ncpu " << cs[i].dump());
        CHECK(gs[i]["ldm_fallback"].get<double>() == 1.0);
        CHECK(gs[i]["ldm_ckpt"].get<double>() == cs[i]["ldm_ckpt"].get<double>());
        const double lg = gs[i]["loss"].get<double>(), lc = cs[i]["loss"].get<double>();
        CHECK(std::fabs(lg - lc) <= 1e-4 * std::fabs(lc));
    }
}

TEST_CASE("gpu ldm: window mode (Woodbury forward) unwinds and falls back to window-start states, like the CPU",
          "[gpu][ldm]") {
    const std::string gpu = gpu_trainer_or_skip("train_ldm");
    if (gpu.empty()) return;
    const std::string shards = ldm_shards_or_skip();
    if (shards.empty()) return;
    const std::string dir = train_scratch("gpu_ldm_window_fallback");
    // a tolerance no fp32 unwind meets: both trainers keep the window-start states after step 1
    const std::string flags = data_flags(shards, 4, 64) +
                              "--ldm-mode window --ldm-window 3 --ldm-drift-tol 1e-12 --steps 4 --lr 3e-3 "
                              "--warmup-steps 2 --sample-every -1 --quiet";
    run_ok(trainer_path() + flags + " --log " + dir + "/cpu.jsonl");
    const std::vector<nlohmann::json> cs = step_records(dir + "/cpu.jsonl");
    REQUIRE(cs.size() == 4);
    {
        RunResult r = run_cmd(gpu + flags + " --dtype fp32 --log " + dir + "/gpu.jsonl");
        INFO(r.out);
        REQUIRE(r.status == 0);
        CHECK_THAT(r.out, Catch::Contains("falling back to checkpointed segments every 3 writes"));
        const std::vector<nlohmann::json> gs = step_records(dir + "/gpu.jsonl");
        REQUIRE(gs.size() == 4);
        for (size_t i = 0; i < 4; i++) {
            INFO("step " << i + 1 << ": gpu " << gs[i].dump() << "\ncpu " << cs[i].dump());
            CHECK(gs[i]["ldm_fallback"].get<double>() == 1.0);
            CHECK(gs[i]["ldm_ckpt"].get<double>() == 3.0);
            CHECK(cs[i]["ldm_ckpt"].get<double>() == 3.0);
            const double lg = gs[i]["loss"].get<double>(), lc = cs[i]["loss"].get<double>();
            CHECK(std::fabs(lg - lc) <= 1e-4 * std::fabs(lc));
        }
    }
}

TEST_CASE("gpu ldm: startup prints the LDM memory per token; other schemes are refused", "[gpu][ldm]") {
    const std::string gpu = gpu_trainer_or_skip("train_ldm");
    if (gpu.empty()) return;
    const std::string shards = ldm_shards_or_skip();
    if (shards.empty()) return;
    const std::string dir = train_scratch("gpu_ldm_misc");
    RunResult r = run_cmd(gpu + data_flags(shards, 2, 32) + "--ldm-mode unwind --steps 1 --sample-every -1 --out-dir " +
                          dir + "/A");
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("LDM memory per token") && Catch::Contains("ldm_drift_S"));
    RunResult p = run_cmd(gpu + data_flags(shards, 2, 32) + "--scheme preln --steps 1 --out-dir " + dir + "/B");
    INFO(p.out);
    CHECK(p.status == 1);
    CHECK_THAT(p.out, Catch::Contains("ldm only"));
}
