// LDM through the trainer (build*/train_cpu): the unwind drift is logged every step (JSONL +
// console), the drift fallback switches to checkpointed segments and is saved in the checkpoint
// (a resume after it is bit-exact), a checkpoint trained in one LDM mode resumes in another with
// the same losses, and bad LDM flags fail with a clear error.
// Needs the shared data (FineWeb-Edu sample + GPT-2 tokenizer); skipped without it.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "core/checkpoint.h"
#include "test/test_train_shards.h"

namespace {

std::string base_cmd(const std::string& dir, int steps) {
    return trainer_path() + " --preset tiny -B 2 -T 32 --steps " + std::to_string(steps) +
           " --seed 7 --scheme ldm --train-data '" + dir + "/train.bin'";
}

}  // namespace

TEST_CASE("ldm trainer: drift logged every step, fallback, resume across modes, flag errors", "[ldm][train]") {
    std::string dd = data_dir_or_skip("the LDM trainer test needs real tokens");
    if (dd.empty()) return;
    const std::string dir = train_scratch("ldm_train");
    REQUIRE(make_fineweb_shards(dir, dd, 20));

    // 1. unwind: drift in the JSONL step records and on the console, every step.
    RunResult r = run_cmd(base_cmd(dir, 3) + " --ldm-mode unwind --log " + dir + "/unwind.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("mode unwind") && Catch::Contains("kept for backward 3072 B/token"));
    int steps = 0, console = 0;
    for (const auto& j : read_jsonl(dir + "/unwind.jsonl"))
        if (j.value("type", "") == "step") {
            steps++;
            REQUIRE(j.contains("ldm_drift_S"));
            REQUIRE(j.contains("ldm_drift_P"));
            CHECK(j["ldm_drift_S"].get<double>() < 1e-3);
            CHECK(j["ldm_drift_S"].get<double>() > 0);  // fp32 unwinding is never exact
            CHECK(j["ldm_fallback"].get<double>() == 0);
        }
    // one line per step: the step line carries the scheme metrics (| ldm_drift_S ... )
    for (size_t p = r.out.find("| ldm_drift_S "); p != std::string::npos; p = r.out.find("| ldm_drift_S ", p + 1))
        console++;
    CHECK(steps == 3);
    CHECK(console == 3);

    // 2. a tolerance every drift exceeds: fallback to checkpoints every round(sqrt(5)) = 2 writes
    //    after step 1; still above after step 2 (unwinding inside segments): every state kept.
    r = run_cmd(base_cmd(dir, 3) + " --ldm-mode unwind --ldm-drift-tol 1e-30 --log " + dir + "/fb.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("falling back to checkpointed segments every 2 writes"));
    CHECK_THAT(r.out, Catch::Contains("still exceeds 1e-30: checkpointed segments every 1 writes"));
    std::vector<double> ckpts;
    for (const auto& j : read_jsonl(dir + "/fb.jsonl"))
        if (j.value("type", "") == "step") ckpts.push_back(j["ldm_ckpt"].get<double>());
    CHECK(ckpts == std::vector<double>{2, 1, 1});

    // 3. resume a store-mode checkpoint in window mode: same step-2 loss as the uninterrupted run.
    r = run_cmd(base_cmd(dir, 2) + " --out-dir " + dir + "/ck --ckpt-every 1 --log " + dir + "/store.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    r = run_cmd(base_cmd(dir, 2) + " --ldm-mode window --ldm-window 3 --resume " + dir +
                "/ck/ckpt_000001 --log " + dir + "/win.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    auto loss_at = [](const std::string& path, int step) {
        for (const auto& j : read_jsonl(path))
            if (j.value("type", "") == "step" && j["step"].get<int>() == step) return j["loss"].get<double>();
        return -1.0;
    };
    double a = loss_at(dir + "/store.jsonl", 2), b = loss_at(dir + "/win.jsonl", 2);
    REQUIRE(a > 0);
    CHECK_TOL("store ckpt resumed in window mode: loss", std::fabs(a - b), 1e-5 * a);

    // 4. the fallback is part of the checkpoint: 4 steps straight == 2 + checkpoint + resume + 2,
    //    byte for byte (the resumed run starts with every state kept, as the straight run's step 3
    //    did; unwinding again would change the gradients); other modes do not take it over.
    const std::string fb = base_cmd(dir, 4) + " --ldm-mode unwind --ldm-drift-tol 1e-30 --lr 3e-3";
    r = run_cmd(fb + " --out-dir " + dir + "/fbS --log " + dir + "/fbS.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    r = run_cmd(fb + " --ckpt-every 2 --stop-after 2 --out-dir " + dir + "/fbA");
    REQUIRE(r.status == 0);
    const ldm::TrainState st2 = ldm::load_train_state(dir + "/fbA/ckpt_000002.state");
    REQUIRE(st2.extra.contains("scheme_state"));
    CHECK(st2.extra["scheme_state"] ==
          nlohmann::json({{"ldm_fallback_ckpt", 1.0}, {"ldm_fallback_window", 0.0}, {"ldm_fallback_settled", 0.0}}));
    r = run_cmd(fb + " --resume " + dir + "/fbA/ckpt_000002 --out-dir " + dir + "/fbB --log " + dir + "/fbB.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("LDM drift fallback restored from the checkpoint: checkpointed segments every 1 writes"));
    CHECK_THAT(r.out, !Catch::Contains("falling back"));
    for (const char* ext : {".model", ".state"}) {
        INFO(ext);
        CHECK(ldm::read_file(dir + "/fbS/ckpt_000004" + ext) == ldm::read_file(dir + "/fbB/ckpt_000004" + ext));
    }
    for (int s : {3, 4}) CHECK(loss_at(dir + "/fbS.jsonl", s) == loss_at(dir + "/fbB.jsonl", s));
    r = run_cmd(fb + " --ldm-mode store --resume " + dir + "/fbA/ckpt_000002 --out-dir " + dir + "/fbC");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("keeps its states (no unwinding), so it is not restored"));
    // a malformed entry (rewritten with a valid checksum) is refused with the checkpoint's name
    ldm::TrainState bad = st2;
    bad.extra["scheme_state"]["ldm_fallback_ckpt"] = 9.0;
    run_cmd("mkdir -p '" + dir + "/fbD' && cp '" + dir + "/fbA/ckpt_000002.model' '" + dir + "/fbD/'");
    ldm::save_train_state(dir + "/fbD/ckpt_000002.state", bad);
    r = run_cmd(fb + " --resume " + dir + "/fbD/ckpt_000002 --out-dir " + dir + "/fbE");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("--resume " + dir + "/fbD/ckpt_000002") && Catch::Contains("malformed"));

    // 5. bad flags: clear errors, exit status 1.
    r = run_cmd(base_cmd(dir, 1) + " --ldm-rule delta --ldm-mode unwind");
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("error:") && Catch::Contains("delta rule"));
    r = run_cmd(base_cmd(dir, 1) + " --ldm-mode window --ldm-window 0");
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("ldm_window must be >= 1"));
    r = run_cmd(base_cmd(dir, 1) + " --ldm-heads 3");
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("ldm_heads 3 does not divide d_model 64"));
    r = run_cmd(base_cmd(dir, 1) + " --ldm-lambda-min 1.5");
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("ldm_lambda_min must be in (0, 1]"));
    r = run_cmd(base_cmd(dir, 1) + " --ldm-delta 0");
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("ldm_delta must be > 0"));
}
