// Reliability of the training loop every trainer shares (core/train_loop.h), through
// build/train_cpu on byte-level tiny-Shakespeare shards (the GPU trainers run the same loop; their
// divergence guard is also checked under emulation in test_emu_train):
//   divergence: a step whose loss or gradient norm is not finite is never applied, no checkpoint
//     with a non-finite number is ever written, the error names the last good checkpoint, exit 1;
//   stale ckpt_*.tmp.<pid> files of a killed writer are removed at startup;
//   a refused --resume names the newest complete checkpoint;
//   --resume latest / auto, --keep-checkpoints, --stop-after, extending a finished run with a
//     larger --steps, resuming a finished run says so;
//   a run without --resume refuses an --out-dir holding checkpoints or a --log that is not empty;
//   --warmup-steps > --steps warns; a model too large for the machine is refused before
//     allocating, naming what it needs.
#include <catch2/catch.hpp>

#include <climits>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/checkpoint.h"
#include "core/common.h"
#include "core/train_loop.h"
#include "test/test_train_shards.h"

using nlohmann::json;

namespace {

std::string byte_shards() { return tiny_shakespeare_byte_shards("the trainer robustness tests need tiny Shakespeare"); }

std::string cmd(const std::string& shards, const std::string& extra) {
    return trainer_path() + " --preset tiny -B 2 -T 32 --tokenizer bytes --seed 3 --train-data '" + shards +
           "/sh_train_*.bin' --val-data '" + shards + "/sh_val_*.bin' --val-batches 2 --sample-every -1 --quiet " + extra;
}

std::vector<json> steps_of(const std::string& log) {
    std::vector<json> out;
    for (const json& j : read_jsonl(log))
        if (j.value("type", "") == "step") out.push_back(j);
    return out;
}

bool finite_file(const std::string& model) {
    const ldm::ModelCheckpoint m = ldm::load_model(model);
    for (float x : m.params)
        if (!std::isfinite(x)) return false;
    return true;
}

}  // namespace

TEST_CASE("train loop: divergence stops before the update; no non-finite checkpoint; names the last good one",
          "[train][robust]") {
    const std::string shards = byte_shards();
    if (shards.empty()) return;
    const std::string dir = train_scratch("robust_diverge");
    // lr 1e4 without clipping: the parameters blow up within a few steps
    RunResult r = run_cmd(cmd(shards, "--steps 40 --lr 1e4 --grad-clip 0 --warmup-steps 0 --ckpt-every 1 --out-dir " +
                                          dir + " --log " + dir + "/log.jsonl"));
    INFO(r.out);
    REQUIRE(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("diverged"));
    CHECK_THAT(r.out, Catch::Contains("was not applied") || Catch::Contains("not finite"));
    // every checkpoint on disk is finite, and the error names the newest of them
    std::vector<std::string> ck;
    for (int s = 1; s <= 40; s++) {
        const std::string b = dir + ldm::strprintf("/ckpt_%06d", s);
        if (ldm::file_exists(b + ".model")) ck.push_back(b);
    }
    REQUIRE(!ck.empty());
    for (const auto& b : ck) {
        INFO(b);
        CHECK(finite_file(b + ".model"));
    }
    CHECK_THAT(r.out, Catch::Contains("the last good checkpoint is " + ck.back()));
    // the error's step number is the first step not taken: one after the last logged step record
    const std::vector<json> st = steps_of(dir + "/log.jsonl");
    REQUIRE(!st.empty());
    CHECK_THAT(r.out, Catch::Contains(ldm::strprintf("at step %lld", (long long)st.back()["step"].get<int64_t>() + 1)) ||
                          Catch::Contains("not finite"));
    // the last good checkpoint resumes with a lower lr (its parameters may already be too large
    // to train on: then the guard stops again, with the same clear message)
    RunResult b = run_cmd(cmd(shards, "--steps 40 --lr 1e-3 --grad-clip 0 --resume " + ck.back() + " --stop-after 1 "
                                      "--out-dir " + dir + "/resumed"));
    INFO(b.out);
    CHECK((b.status == 0 || (b.status == 1 && b.out.find("diverged") != std::string::npos)));
    CHECK_THAT(b.out, Catch::Contains("resumed from " + ck.back()));
    CHECK_THAT(b.out, Catch::Contains("resuming with other optimizer settings") && Catch::Contains("lr 10000.0 -> 0.001"));
}

TEST_CASE("train loop: stale checkpoint temp files are removed; a refused resume names the newest complete checkpoint",
          "[train][robust]") {
    const std::string shards = byte_shards();
    if (shards.empty()) return;
    const std::string dir = train_scratch("robust_ckpt");
    REQUIRE(run_cmd(cmd(shards, "--steps 2 --ckpt-every 1 --out-dir " + dir)).status == 0);
    // a killed writer's leftovers: a temp file of a process that does not exist (pid 2^22 + 1 is
    // above Linux's pid_max limit) and a .model without .state or .done
    const std::string tmp = dir + "/ckpt_000003.state.tmp.4194305";
    ldm::write_file_atomic(tmp, "partial", 7);
    ldm::write_file_atomic(dir + "/ckpt_000003.model", ldm::read_file(dir + "/ckpt_000002.model").data(),
                           ldm::read_file(dir + "/ckpt_000002.model").size());
    RunResult r = run_cmd(cmd(shards, "--steps 4 --resume " + dir + "/ckpt_000003 --out-dir " + dir));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("removed 1 stale temporary file"));
    CHECK_FALSE(ldm::file_exists(tmp));
    CHECK_THAT(r.out, Catch::Contains("the newest complete checkpoint in " + dir + " is " + dir + "/ckpt_000002"));
    // --resume latest takes it (ckpt_000003 is incomplete)
    RunResult l = run_cmd(cmd(shards, "--steps 4 --resume latest --out-dir " + dir));
    INFO(l.out);
    CHECK(l.status == 0);
    CHECK_THAT(l.out, Catch::Contains("resumed from " + dir + "/ckpt_000002.model at step 2"));
}

TEST_CASE("train loop: --stop-after, --resume auto, --keep-checkpoints, finished and extended runs", "[train][robust]") {
    const std::string shards = byte_shards();
    if (shards.empty()) return;
    const std::string dir = train_scratch("robust_cadence");
    const std::string base = "--lr 3e-3 --warmup-steps 1 --out-dir " + dir + "/A";
    // the straight run to compare with
    REQUIRE(run_cmd(cmd(shards, "--steps 6 --lr 3e-3 --warmup-steps 1 --out-dir " + dir + "/S")).status == 0);
    // 6 steps in three invocations of --stop-after 2 --resume auto (the first starts fresh)
    for (int k = 0; k < 3; k++) {
        RunResult r = run_cmd(cmd(shards, "--steps 6 --stop-after 2 --resume auto --keep-checkpoints 1 --ckpt-every 1 " + base));
        INFO("invocation " << k << "\n" << r.out);
        REQUIRE(r.status == 0);
        if (k < 2) CHECK_THAT(r.out, Catch::Contains("stopped after 2 steps at step " + std::to_string(2 * k + 2)));
        if (k > 0) CHECK_THAT(r.out, Catch::Contains("resumed from"));
    }
    // the same bytes as the straight run; only the newest checkpoint of the last invocation is kept
    CHECK(ldm::read_file(dir + "/A/ckpt_000006.model") == ldm::read_file(dir + "/S/ckpt_000006.model"));
    CHECK(ldm::read_file(dir + "/A/ckpt_000006.state") != "");
    CHECK_FALSE(ldm::file_exists(dir + "/A/ckpt_000005.model"));
    // resuming a finished run says so and trains nothing
    RunResult f = run_cmd(cmd(shards, "--steps 6 --resume latest " + base));
    INFO(f.out);
    CHECK(f.status == 0);
    CHECK_THAT(f.out, Catch::Contains("the run is complete, nothing to train"));
    // a larger --steps extends it
    RunResult e = run_cmd(cmd(shards, "--steps 8 --resume latest " + base + " --log " + dir + "/ext.jsonl"));
    INFO(e.out);
    CHECK(e.status == 0);
    CHECK_THAT(e.out, Catch::Contains("planned for 6 steps, now --steps 8"));
    CHECK(steps_of(dir + "/ext.jsonl").size() == 2);
    CHECK(ldm::file_exists(dir + "/A/ckpt_000008.model"));
    // flag errors
    for (const std::string& bad : std::vector<std::string>{"--keep-checkpoints -1 --out-dir " + dir, "--stop-after 2", "--resume latest"}) {
        RunResult r = run_cmd(cmd(shards, "--steps 2 " + bad));
        INFO(bad << "\n" << r.out);
        CHECK(r.status == 1);
        CHECK_THAT(r.out, Catch::Contains("error:"));
    }
}

TEST_CASE("train loop: a run without --resume leaves another run's checkpoints and log alone", "[train][robust]") {
    const std::string shards = byte_shards();
    if (shards.empty()) return;
    const std::string dir = train_scratch("robust_fresh");
    const std::string out = " --out-dir " + dir + "/run --log " + dir + "/run.jsonl";
    REQUIRE(run_cmd(cmd(shards, "--steps 4 --stop-after 2" + out)).status == 0);
    const std::string model = ldm::read_file(dir + "/run/ckpt_000002.model"), log = ldm::read_file(dir + "/run.jsonl");
    REQUIRE(!log.empty());
    // a fresh run into the same --out-dir: refused before its first step; nothing touched
    RunResult r = run_cmd(cmd(shards, "--steps 2" + out));
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK_THAT(r.out, Catch::Contains("--out-dir " + dir + "/run already holds the checkpoints of a run (the newest: " +
                                      dir + "/run/ckpt_000002.model)") &&
                          Catch::Contains("add --resume latest (or auto)") && !Catch::Contains("step      1"));
    // the log alone (another --out-dir): refused too, also for a --bench run (it writes the log)
    for (const std::string& extra : {"--steps 2 --out-dir " + dir + "/other", std::string("--bench 1")}) {
        RunResult g = run_cmd(cmd(shards, extra + " --log " + dir + "/run.jsonl"));
        INFO(extra << "\n" << g.out);
        CHECK(g.status == 1);
        CHECK_THAT(g.out, Catch::Contains("--log " + dir + "/run.jsonl already holds a run's log (" +
                                          std::to_string(log.size()) + " bytes)"));
    }
    CHECK_FALSE(ldm::file_exists(dir + "/other/ckpt_000002.model"));
    CHECK(ldm::read_file(dir + "/run/ckpt_000002.model") == model);
    CHECK(ldm::read_file(dir + "/run.jsonl") == log);
    // a --bench run may use the directory (it writes no checkpoint); --resume latest continues the run
    CHECK(run_cmd(cmd(shards, "--bench 1 --out-dir " + dir + "/run")).status == 0);
    RunResult c = run_cmd(cmd(shards, "--steps 4 --resume latest" + out));
    INFO(c.out);
    CHECK(c.status == 0);
    CHECK_THAT(c.out, Catch::Contains("resumed from " + dir + "/run/ckpt_000002.model at step 2"));
    CHECK(steps_of(dir + "/run.jsonl").size() == 4);
}

TEST_CASE("train loop: --warmup-steps > --steps warns; a model too large for this machine is refused up front",
          "[train][robust]") {
    const std::string shards = byte_shards();
    if (shards.empty()) return;
    RunResult w = run_cmd(cmd(shards, "--steps 2 --warmup-steps 5"));
    INFO(w.out);
    CHECK(w.status == 0);
    CHECK_THAT(w.out, Catch::Contains("warning: --warmup-steps 5 is larger than --steps 2"));
    // qwen3-14b in fp64 on 4M tokens per micro-batch: ~470 GB of parameters, gradients and AdamW
    // state plus > 100 TB of activations, more than any machine this runs on (a 2 TB node too)
    const std::string big = trainer_path() + " --preset qwen3-14b --dtype fp64 -B 65536 -T 64 --tokenizer bytes "
                            "--train-data '" + shards + "/sh_train_*.bin' --steps 1";
    RunResult r = run_cmd(big);
    INFO(r.out);
    CHECK(r.status == 1);
    // refused by the up-front estimate (before the allocation and initialisation), not by the allocator
    CHECK_THAT(r.out, Catch::Contains("needs") && Catch::Contains("GiB") && Catch::Contains("available"));
    CHECK_THAT(r.out, !Catch::Contains("bad_alloc"));
}

// The note of set_interrupt_note in a forked child that then gets SIGINT: what it wrote on stderr
// and whether it died of the signal.
static std::pair<bool, std::string> note_on_sigint(const std::string& dir, const std::function<void()>& set_note) {
    const std::string err = dir + "/stderr";
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        // as a trainer starts: SIGINT with its default action and not blocked (whatever the test
        // runner set), stderr to the file
        ::signal(SIGINT, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || ::dup2(fd, 2) < 0) ::_exit(3);
        try {
            set_note();
        } catch (...) {
            ::_exit(5);
        }
        ::kill(::getpid(), SIGINT);
        ::_exit(4);  // not reached: the handler dies of the signal
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    return {WIFSIGNALED(st) && WTERMSIG(st) == SIGINT, ldm::read_file(err)};
}

TEST_CASE("train loop: the interrupt note switches to a checkpoint's text once its marker exists",
          "[train][robust]") {
    const std::string dir = train_scratch("robust_note");
    const std::string marker = dir + "/ckpt_000004.done";
    std::remove(marker.c_str());
    auto set = [&] { ldm::train::set_interrupt_note("before: no checkpoint", marker, "after: ckpt_000004"); };
    // the marker is not there: the first text; it dies of SIGINT
    auto [died, out] = note_on_sigint(dir, set);
    CHECK(died);
    CHECK(out == "before: no checkpoint\n");
    // the marker's rename happened, the next set_interrupt_note call not yet: the second text
    ldm::write_file_atomic(marker, "{}\n", 3);
    auto [died2, out2] = note_on_sigint(dir, set);
    CHECK(died2);
    CHECK(out2 == "after: ckpt_000004\n");
    // a later plain note has no condition
    auto [died3, out3] = note_on_sigint(dir, [&] {
        set();
        ldm::train::set_interrupt_note("plain");
    });
    CHECK(died3);
    CHECK(out3 == "plain\n");
    CHECK_THROWS_WITH(ldm::train::set_interrupt_note("x", std::string(PATH_MAX, 'a'), "y"), Catch::Contains("too long"));
}

TEST_CASE("train loop: Ctrl-C names the last checkpoint; a resume from an earlier checkpoint warns of later ones",
          "[train][robust]") {
    const std::string shards = byte_shards();
    if (shards.empty()) return;
    const std::string dir = train_scratch("robust_interrupt");
    // Starts a long run in the background (BackgroundRun), waits until ready() (300 s at most: a loaded machine),
    // sends SIGINT to the trainer and returns its exit status and console.
    auto interrupted_run = [&](const std::string& sub, const std::string& flags, const std::function<bool()>& ready) {
        const std::string d = dir + "/" + sub;
        ldm::mkdir_p(d);
        BackgroundRun run("exec " + cmd(shards, "--steps 100000 " + flags), d + "/out");
        REQUIRE(BackgroundRun::wait_for(ready, 300));
        run.signal_leader(SIGINT);
        REQUIRE(run.wait_exit(30));
        return std::make_pair(run.status(), run.output());
    };
    // once a checkpoint exists (any: --keep-checkpoints 1 removes each soon after the next): the
    // note names the newest checkpoint; it dies of SIGINT
    auto has_checkpoint = [&] {
        std::error_code ec;
        for (std::filesystem::directory_iterator it(dir + "/A/ck", ec), end; !ec && it != end; it.increment(ec))
            if (it->path().extension() == ".done") return true;
        return false;
    };
    auto [rc, out] = interrupted_run("A", "--ckpt-every 2 --keep-checkpoints 1 --out-dir " + dir + "/A/ck", has_checkpoint);
    INFO(out);
    CHECK(rc == 130);
    CHECK_THAT(out, Catch::Matches("[\\s\\S]*interrupted at step [0-9]+ of 100000: the last checkpoint is " + dir +
                                   "/A/ck/ckpt_[0-9]{6} \\(the same command with --resume latest continues it\\)\n"));
    // without --out-dir, once its first validation (in the loop: the note is set) is logged
    auto [rc2, out2] = interrupted_run("B", "--log " + dir + "/B/log.jsonl --val-every 1", [&] {
        return ldm::file_exists(dir + "/B/log.jsonl") &&
               ldm::read_file(dir + "/B/log.jsonl").find("\"type\":\"val\"") != std::string::npos;
    });
    INFO(out2);
    CHECK(rc2 == 130);
    CHECK_THAT(out2, Catch::Contains("nothing of this run is saved (no --out-dir)"));

    // resuming ckpt 2 into the directory that also holds the run's ckpt 4 and 6
    REQUIRE(run_cmd(cmd(shards, "--steps 6 --ckpt-every 2 --out-dir " + dir + "/C")).status == 0);
    RunResult w = run_cmd(cmd(shards, "--steps 3 --resume " + dir + "/C/ckpt_000002 --out-dir " + dir + "/C"));
    INFO(w.out);
    CHECK(w.status == 0);
    CHECK_THAT(w.out, Catch::Contains("warning: " + dir + "/C holds 2 checkpoints after step 2 (the newest: "
                                      "ckpt_000006) from the run this one leaves"));
    RunResult l = run_cmd(cmd(shards, "--steps 7 --resume latest --out-dir " + dir + "/C"));
    INFO(l.out);
    CHECK(l.status == 0);
    CHECK_THAT(l.out, !Catch::Contains("holds"));  // resumed from the newest: nothing later
}
