// End-to-end tests of build/train_cpu (run as a subprocess on real FineWeb-Edu shards written by
// the test): resume bit-exactness in fp32 and fp64, the JSONL log, --dry-run for every preset,
// and clear errors with non-zero exit status on bad input.
#include <catch2/catch.hpp>

#include "core/checkpoint.h"
#include "core/config.h"
#include "test/test_train_shards.h"

using nlohmann::json;

namespace {

std::string shards_or_skip() {
    std::string dd = data_dir_or_skip("trainer tests need the FineWeb-Edu sample");
    if (dd.empty()) return "";
    std::string dir = ldm::find_data_dir().empty() ? "" : build_dir_of_test() + "/test_tmp/train_shards";
    run_cmd("mkdir -p '" + dir + "'");
    make_fineweb_shards(dir, dd);
    return dir;
}

std::string base_cmd(const std::string& shards) {
    return trainer_path() + " --preset tiny -B 2 -T 32 --train-data '" + shards + "/train.bin' --val-data '" + shards +
           "/val.bin' --val-batches 2 --quiet";
}

std::vector<json> of_type(const std::vector<json>& log, const std::string& t) {
    std::vector<json> out;
    for (const auto& j : log)
        if (j.at("type") == t) out.push_back(j);
    return out;
}

void expect_fail(const std::string& cmd, const std::string& needle) {
    RunResult r = run_cmd(cmd);
    INFO("command: " << cmd << "\noutput:\n" << r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("error:") && Catch::Contains(needle));
}

// N straight steps == K steps + checkpoint + resume + N-K steps, bit-exact, in one dtype. (One
// test case per dtype, so that each one's checkpoints are deleted before the next starts.)
void check_resume_bit_exact(const std::string& dtype) {
    std::string shards = shards_or_skip();
    if (shards.empty()) return;
    const std::string dir = train_scratch("train_resume_" + dtype);
    const std::string cmd = base_cmd(shards) + " --dtype " + dtype +
                            " --steps 6 --lr 3e-3 --warmup-steps 2 --val-every 2 --sample-every 2 --sample-tokens 6";
    RunResult c = run_cmd(cmd + " --out-dir " + dir + "/C --log " + dir + "/C/log.jsonl");
    INFO(c.out);
    REQUIRE(c.status == 0);
    RunResult a = run_cmd(cmd + " --ckpt-every 3 --out-dir " + dir + "/A --log " + dir + "/A/log.jsonl");
    INFO(a.out);
    REQUIRE(a.status == 0);
    REQUIRE(ldm::file_exists(dir + "/A/ckpt_000003.model"));
    REQUIRE(ldm::file_exists(dir + "/A/ckpt_000003.state"));
    RunResult b = run_cmd(cmd + " --resume " + dir + "/A/ckpt_000003 --out-dir " + dir + "/B --log " + dir + "/B/log.jsonl");
    INFO(b.out);
    REQUIRE(b.status == 0);
    CHECK_THAT(b.out, Catch::Contains("resumed from"));

    // Final checkpoints (parameters, AdamW moments, loader and RNG state) byte-identical.
    for (const char* ext : {".model", ".state"}) {
        std::string fc = ldm::read_file(dir + "/C/ckpt_000006" + ext);
        CHECK(fc == ldm::read_file(dir + "/B/ckpt_000006" + ext));
        CHECK(fc == ldm::read_file(dir + "/A/ckpt_000006" + ext));
    }
    // Losses, grad norms, val losses and samples after the resume point identical.
    auto lc = read_jsonl(dir + "/C/log.jsonl"), lb = read_jsonl(dir + "/B/log.jsonl");
    auto sc = of_type(lc, "step"), sb = of_type(lb, "step");
    REQUIRE(sc.size() == 6);
    REQUIRE(sb.size() == 3);
    for (int i = 0; i < 3; i++) {
        CHECK(sb[size_t(i)]["step"] == sc[size_t(i + 3)]["step"]);
        CHECK(sb[size_t(i)]["loss"].get<double>() == sc[size_t(i + 3)]["loss"].get<double>());
        CHECK(sb[size_t(i)]["grad_norm"].get<double>() == sc[size_t(i + 3)]["grad_norm"].get<double>());
        CHECK(sb[size_t(i)]["lr"].get<double>() == sc[size_t(i + 3)]["lr"].get<double>());
    }
    auto vc = of_type(lc, "val"), vb = of_type(lb, "val");
    REQUIRE(vb.size() >= 2);
    CHECK(vb.back()["val_loss"].get<double>() == vc.back()["val_loss"].get<double>());
    auto xc = of_type(lc, "sample"), xb = of_type(lb, "sample");
    REQUIRE(xb.size() >= 2);
    CHECK(xb.front()["text"] == xc[xc.size() - xb.size()]["text"]);
    CHECK(xb.back()["text"] == xc.back()["text"]);
    // training actually changed the weights and the loss went down from ln(V)
    CHECK(sc.front()["loss"].get<double>() == Approx(std::log(50257.0)).margin(0.1));
    CHECK(sc.back()["loss"].get<double>() < sc.front()["loss"].get<double>());
    // resuming with a different config or batch fails with a clear message
    expect_fail(cmd + " --n-layer 3 --resume " + dir + "/A/ckpt_000003", "config differs");
    expect_fail(cmd + " --seed 5 --resume " + dir + "/A/ckpt_000003", "seed differs");
}

}  // namespace

TEST_CASE("train_cpu: N straight steps == K steps + checkpoint + resume + N-K steps (bit-exact), fp32", "[train]") {
    check_resume_bit_exact("fp32");
}

TEST_CASE("train_cpu: N straight steps == K steps + checkpoint + resume + N-K steps (bit-exact), fp64", "[train]") {
    check_resume_bit_exact("fp64");
}

TEST_CASE("train_cpu: JSONL log has a config header and per-step fields", "[train]") {
    std::string shards = shards_or_skip();
    if (shards.empty()) return;
    const std::string dir = train_scratch("train_log");
    RunResult r = run_cmd(base_cmd(shards) + " --steps 3 --total-batch-tokens 128 --log " + dir + "/log.jsonl");
    INFO(r.out);
    REQUIRE(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("accum=2") && Catch::Contains("tok/s") && Catch::Contains("grad norm"));
    auto log = read_jsonl(dir + "/log.jsonl");
    REQUIRE(log.size() >= 4);
    CHECK(log[0]["type"] == "config");
    CHECK(log[0]["config"]["d_model"] == 64);
    CHECK(log[0]["param_count"] == ldm::count_params(ldm::config_from_json(log[0]["config"])));
    CHECK(log[0]["accum_steps"] == 2);
    auto steps = of_type(log, "step");
    REQUIRE(steps.size() == 3);
    for (const auto& s : steps)
        for (const char* k : {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s", "tokens"}) CHECK(s.contains(k));
    CHECK(steps[2]["tokens"] == 3 * 128);
    CHECK(of_type(log, "val").size() == 1);
    CHECK(of_type(log, "sample").size() == 1);
}

TEST_CASE("train_cpu: --dry-run for every preset prints the parameter count without allocating", "[train]") {
    for (const auto& p : ldm::preset_names()) {
        RunResult r = run_cmd(trainer_path() + " --dry-run -T 2048 --preset " + p);
        INFO(p << "\n" << r.out);
        CHECK(r.status == 0);
        ldm::ModelConfig c = ldm::preset_config(p, 50257);
        CHECK_THAT(r.out, Catch::Contains(std::to_string(ldm::count_params(c))));
        CHECK_THAT(r.out, Catch::Contains("KiB/token"));
    }
    // tiny, counted by hand: wte and lm_head 50304*64 each; per layer 2*64 (norms) + 64*64 (wq)
    // + 2*32*64 (wk, wv) + 64*64 (wo) + 3*160*64 (mlp) = 43136; final norm 64.
    RunResult r = run_cmd(trainer_path() + " --dry-run --preset tiny");
    CHECK_THAT(r.out, Catch::Contains(std::to_string(2 * 50304 * 64 + 2 * 43136 + 64)));
    // attnres-block with N >= D is Full, and says so: `small` (D = 8) with the default N = 8
    RunResult nb = run_cmd(trainer_path() + " --dry-run --preset small --scheme attnres-block");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, Catch::Contains("note: attnres-block with --attnres-blocks 8 >= D = 8 sublayers (4 layers) is "
                                       "AttnRes-Full"));
    nb = run_cmd(trainer_path() + " --dry-run --preset small --scheme attnres-block --attnres-blocks 2");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, !Catch::Contains("is AttnRes-Full"));
    // scheme options the chosen scheme does not read are named (and only those)
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme preln --ldm-mode unwind --ldm-dk 4 --hc-streams 2");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, Catch::Contains("note: --scheme preln does not use --hc-streams, --ldm-dk, --ldm-mode: ignored"));
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme ldm --ldm-mode unwind --ldm-dk 4 --sinkhorn-iters 5");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, Catch::Contains("note: --scheme ldm does not use --sinkhorn-iters: ignored"));
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme mhc --hc-streams 2 --sinkhorn-iters 5 --ldm-mode store");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, !Catch::Contains("does not use"));
    // LDM options of another mode: --ldm-window outside window mode, --ldm-drift-tol where the
    // backward never unwinds without checkpoints
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme ldm --ldm-mode unwind --ldm-window 3");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, Catch::Contains("note: --ldm-mode unwind does not use --ldm-window: ignored"));
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme ldm --ldm-drift-tol 0.01");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, Catch::Contains("note: --ldm-mode store does not use --ldm-drift-tol: ignored"));
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme ldm --ldm-mode window --ldm-window 3 "
                                  "--ldm-checkpoint-every 2 --ldm-drift-tol 0.01");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, Catch::Contains("note: --ldm-mode window with --ldm-checkpoint-every does not use "
                                       "--ldm-drift-tol: ignored"));
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme ldm --ldm-mode window --ldm-window 3 "
                                  "--ldm-drift-tol 0.01");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, !Catch::Contains("does not use"));
    // a ridge delta below the spec's 0.1 where the backward unwinds: a note; store mode or the
    // delta rule (which never unwinds) or the default 0.1: none
    nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme ldm --ldm-mode unwind --ldm-delta 0.01");
    CHECK(nb.status == 0);
    CHECK_THAT(nb.out, Catch::Contains("note: --ldm-delta 0.01 is below 0.1: the unwind mode's unwound states drift"));
    for (const char* ok : {"--ldm-mode store --ldm-delta 0.01", "--ldm-mode store --ldm-rule delta --ldm-delta 0.01",
                           "--ldm-mode window --ldm-window 2"}) {
        nb = run_cmd(trainer_path() + " --dry-run --preset tiny --scheme ldm " + ok);
        INFO(ok);
        CHECK(nb.status == 0);
        CHECK_THAT(nb.out, !Catch::Contains("is below 0.1"));
    }
    // --help lists every flag with defaults
    RunResult h = run_cmd(trainer_path() + " --help");
    CHECK(h.status == 0);
    for (const char* f : {"--preset", "--n-layer", "--d-model", "--n-head", "--n-kv-head", "--head-dim", "--ffn", "--scheme",
                          "--train-data", "--val-data", "--tokenizer", "--batch-size", "--seq-len", "--total-batch-tokens",
                          "--steps", "--lr", "--min-lr-ratio", "--warmup-steps", "--schedule", "--wsd-decay-frac",
                          "--weight-decay", "--beta1", "--beta2", "--adam-eps", "--grad-clip", "--val-every",
                          "--val-batches", "--sample-every", "--sample-tokens", "--ckpt-every", "--out-dir", "--resume",
                          "--log", "--seed", "--dtype", "--threads", "--dry-run", "--dump-debug-state"})
        CHECK_THAT(h.out, Catch::Contains(std::string(f) + " "));
}

TEST_CASE("train_cpu: bad input gives a clear error and exit status 1", "[train]") {
    std::string shards = shards_or_skip();
    if (shards.empty()) return;
    const std::string dir = train_scratch("train_bad");
    const std::string tr = trainer_path();
    const std::string data = " --train-data '" + shards + "/train.bin'";
    expect_fail(tr + " --preset gpt5" + data, "gpt5");
    expect_fail(tr + " --preset tiny --n-head 4 --n-kv-head 3" + data, "n_kv_head");
    expect_fail(tr + " --preset tiny -B 4 -T 32 --total-batch-tokens 200" + data, "not divisible by B*T");
    expect_fail(tr + " --preset tiny -B 4 -T 32 --total-batch-tokens -128" + data,
                "--total-batch-tokens must be >= 0 (0 = B*T), got -128");
    expect_fail(tr + " --preset tiny --lr inf" + data, "--lr: expected a finite number, got 'inf'");
    expect_fail(tr + " --preset tiny --threads 100000" + data, "--threads must be between 0 (all cores) and 4096, got 100000");
    expect_fail(tr + " --preset tiny --threads -1" + data, "--threads must be between 0 (all cores) and 4096, got -1");
    expect_fail(tr + " --preset tiny --bogus-flag 3" + data, "unknown flag '--bogus-flag'");
    expect_fail(tr + " --preset tiny --lr abc" + data, "--lr: expected a number");
    expect_fail(tr + " --preset tiny --dtype fp16" + data, "--dtype");
    expect_fail(tr + " --preset tiny --schedule step" + data, "--schedule");
    // the optimizer and schedule flags are checked before a model is built, --dry-run too
    expect_fail(tr + " --preset tiny --dry-run --beta1 1" + data, "--beta1: must be in [0, 1), got 1");
    expect_fail(tr + " --preset tiny --dry-run --min-lr-ratio 2" + data, "--min-lr-ratio: must be in [0, 1], got 2");
    expect_fail(tr + " --preset tiny --dry-run --adam-eps 0" + data, "--adam-eps: must be > 0, got 0");
    expect_fail(tr + " --preset tiny --train-data '" + dir + "/nothing_*.bin'", "no files match");
    expect_fail(tr + " --preset tiny", "--train-data is required");
    // output flags are checked before any training step
    expect_fail(tr + " --preset tiny --ckpt-every 1" + data, "--ckpt-every needs --out-dir");
    expect_fail(tr + " --preset tiny --grad-clip -1" + data, "--grad-clip must be >= 0");
    expect_fail(tr + " --preset tiny --val-every -5" + data, "--val-every must be >= 0 (0 = only at the end), got -5");
    expect_fail(tr + " --preset tiny --val-every 10" + data, "--val-every needs --val-data");
    expect_fail(tr + " --preset tiny --sample-every -2" + data, "--sample-every must be >= -1");
    expect_fail(tr + " --preset tiny --sample-tokens -1" + data, "--sample-tokens must be >= 0, got -1");
    ldm::write_file_atomic(dir + "/a_file", "x", 1);
    {
        RunResult f = run_cmd(tr + " --preset tiny -B 2 -T 32 --steps 2" + data + " --out-dir '" + dir + "/a_file'");
        INFO(f.out);
        CHECK(f.status == 1);
        CHECK_THAT(f.out, Catch::Contains("--out-dir: cannot write into"));
        CHECK_THAT(f.out, !Catch::Contains("step      1"));  // refused before the first step
    }

    // --val-batches above what the val shards hold: validation uses all of them, with a note
    {
        std::vector<uint32_t> val = ldm::read_shard(shards + "/val.bin");
        REQUIRE(val.size() > 300);
        val.resize(300);
        ldm::write_shard(dir + "/smallval.bin", val.data(), val.size(), false);
        RunResult v = run_cmd(tr + " --preset tiny -B 2 -T 32 --steps 1 --sample-every -1 --val-batches 50" + data +
                              " --val-data '" + dir + "/smallval.bin'");
        INFO(v.out);
        CHECK(v.status == 0);
        CHECK_THAT(v.out, Catch::Contains("note: --val-batches 50: the val shards hold ") &&
                              Catch::Contains(" batches of B x T = 2 x 32 tokens; validation uses those"));
        RunResult w = run_cmd(tr + " --preset tiny -B 2 -T 32 --steps 1 --sample-every -1 --val-batches 2" + data +
                              " --val-data '" + dir + "/smallval.bin'");
        CHECK(w.status == 0);
        CHECK_THAT(w.out, !Catch::Contains("note: --val-batches"));
        CHECK_THAT(w.out, !Catch::Contains("every step sees some windows more than once"));
        // a step larger than the train shards (300 tokens: a few batches of 2 x 32): trains, with a note
        RunResult s = run_cmd(tr + " --preset tiny -B 2 -T 32 --steps 1 --sample-every -1 --total-batch-tokens 512 "
                              "--train-data '" + dir + "/smallval.bin'");
        INFO(s.out);
        CHECK(s.status == 0);
        CHECK_THAT(s.out, Catch::Contains("note: one optimizer step takes 8 micro-batches of B x T = 2 x 32 per rank, "
                                          "but the train shards hold ") &&
                              Catch::Contains("every step sees some windows more than once"));
    }

    // too few tokens for one B*T window
    std::vector<uint32_t> few(50, 11);
    ldm::write_shard(dir + "/few.bin", few.data(), few.size(), false);
    expect_fail(tr + " --preset tiny -B 4 -T 64 --train-data '" + dir + "/few.bin'", "few.bin");
    RunResult r = run_cmd(tr + " --preset tiny -B 4 -T 64 --train-data '" + dir + "/few.bin'");
    CHECK_THAT(r.out, Catch::Contains("too few tokens"));
    // token id >= vocab (GPT-2 V = 50257) in a train or a val shard: found when the loaders are
    // made, before the first step (and so before any checkpoint could be lost at the end)
    std::vector<uint32_t> big(5000, 11);
    big[1234] = 60000;
    ldm::write_shard(dir + "/big.bin", big.data(), big.size(), false);
    expect_fail(tr + " --preset tiny -B 2 -T 32 --steps 200 --train-data '" + dir + "/big.bin'",
                "shard " + dir + "/big.bin: token id 60000 at index 1234 (byte offset 3492)");
    {
        std::vector<uint32_t> val = ldm::read_shard(shards + "/val.bin");
        REQUIRE(val.size() > 800);
        val[777] = 50300;
        ldm::write_shard(dir + "/badval.bin", val.data(), val.size(), false);
        const std::string c = tr + " --preset tiny -B 2 -T 32 --steps 50 --val-every 0" + data + " --val-data '" + dir +
                              "/badval.bin' --out-dir '" + dir + "/vrun'";
        expect_fail(c, "shard " + dir + "/badval.bin: token id 50300 at index 777");
        RunResult f = run_cmd(c);
        CHECK_THAT(f.out, !Catch::Contains("step      1"));
        CHECK(!ldm::file_exists(dir + "/vrun/ckpt_000050.model"));
    }

    // corrupt / truncated checkpoints
    const std::string cmd = base_cmd(shards) + " --steps 1";
    RunResult ok = run_cmd(cmd + " --out-dir " + dir + "/run");
    INFO(ok.out);
    REQUIRE(ok.status == 0);
    std::string m = ldm::read_file(dir + "/run/ckpt_000001.model");
    std::string s = ldm::read_file(dir + "/run/ckpt_000001.state");
    run_cmd("mkdir -p " + dir + "/bad");
    std::string mc = m;
    mc[mc.size() / 2] ^= 1;
    ldm::write_file_atomic(dir + "/bad/corrupt.model", mc.data(), mc.size());
    ldm::write_file_atomic(dir + "/bad/corrupt.state", s.data(), s.size());
    expect_fail(cmd + " --resume " + dir + "/bad/corrupt", "checksum mismatch");
    ldm::write_file_atomic(dir + "/bad/trunc.model", m.data(), m.size() - 1000);
    ldm::write_file_atomic(dir + "/bad/trunc.state", s.data(), s.size());
    expect_fail(cmd + " --resume " + dir + "/bad/trunc", "truncated");
    ldm::write_file_atomic(dir + "/bad/tstate.model", m.data(), m.size());
    ldm::write_file_atomic(dir + "/bad/tstate.state", s.data(), s.size() / 3);
    expect_fail(cmd + " --resume " + dir + "/bad/tstate", "tstate.state");
    expect_fail(cmd + " --resume " + dir + "/bad/missing", "missing.model");
    // a checkpoint with another config
    expect_fail(cmd + " --d-model 32 --n-head 2 --n-kv-head 1 --resume " + dir + "/run/ckpt_000001", "d_model: 64 vs 32");
}

TEST_CASE("train_cpu --tokenizer bytes: V = 257 (padded 384), byte shards, the log records the tokenizer", "[train]") {
    std::string dd = data_dir_or_skip("byte-level training needs tiny Shakespeare");
    if (dd.empty()) return;
    const std::string dir = train_scratch("train_bytes");
    const ldm::Tokenizer b = ldm::Tokenizer::bytes();
    const std::string text = ldm::read_file(dd + "/tinyshakespeare/input.txt");
    std::vector<uint32_t> ids = b.encode(text);
    ids.insert(ids.begin(), b.eot_id());
    const size_t cut = ids.size() * 9 / 10;
    ldm::write_shard(dir + "/train.bin", ids.data(), cut, false);
    ldm::write_shard(dir + "/val.bin", ids.data() + cut, ids.size() - cut, false);
    const std::string tr = trainer_path();
    RunResult dry = run_cmd(tr + " --preset tiny -T 32 --tokenizer bytes --dry-run");
    INFO(dry.out);
    REQUIRE(dry.status == 0);
    CHECK_THAT(dry.out, Catch::Contains("vocab=257 padded=384"));
    RunResult r = run_cmd(tr + " --preset tiny -B 2 -T 32 --steps 4 --lr 3e-3 --warmup-steps 1 --tokenizer bytes --train-data '" +
                          dir + "/train.bin' --val-data '" + dir + "/val.bin' --val-batches 2 --val-every 2 --sample-every 2 " +
                          "--sample-tokens 8 --quiet --out-dir '" + dir + "/run' --log '" + dir + "/run/log.jsonl'");
    INFO(r.out);
    REQUIRE(r.status == 0);
    auto log = read_jsonl(dir + "/run/log.jsonl");
    auto cfg = of_type(log, "config");
    REQUIRE(cfg.size() == 1);
    CHECK(cfg[0]["args"]["tokenizer"] == "bytes");
    CHECK(cfg[0]["config"]["vocab_size"] == 257);
    CHECK(cfg[0]["config"]["padded_vocab"] == 384);
    auto steps = of_type(log, "step");
    REQUIRE(steps.size() == 4);
    CHECK(steps.front()["loss"].get<double>() == Approx(std::log(257.0)).margin(0.1));
    CHECK(of_type(log, "sample").size() >= 2);
    ldm::ModelCheckpoint ck = ldm::load_model(dir + "/run/ckpt_000004.model");
    CHECK(ck.cfg.vocab_size == 257);
    // a byte shard with the GPT-2 default tokenizer trains (ids < 50257) but the reverse does not:
    // GPT-2 ids are >= 257
    std::vector<uint32_t> g = {50256, 15496, 995, 11, 12, 13, 14, 15};
    ldm::write_shard(dir + "/gpt2.bin", g.data(), g.size(), false);
    expect_fail(tr + " --preset tiny -B 1 -T 4 --steps 1 --tokenizer bytes --train-data '" + dir + "/gpt2.bin'",
                "token id 50256 at index 0");
}
