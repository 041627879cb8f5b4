// test/test_study_script.cpp — scripts/study.sh --recipe ci (tiny, byte-level tiny Shakespeare,
// PreLN and LDM x 2 seeds, 8 steps), run the way a killed study is continued: first with
// --stop-after 5 (every run stops with a checkpoint), then again to the end. Checks: the runs
// resumed instead of restarting, a third call trains nothing, a changed evaluation flag redoes
// only the evaluations, summary.csv has one sane row per run, the verdict in summary.md is the
// one that follows from the CSV's numbers (recomputed here), the plots are PNGs, the samples
// start with the prompt; flag errors; the commands of the GPU recipes (--dry-run, no GPU
// needed). Needs the data dir (SKIP otherwise).
#include <catch2/catch.hpp>

#include <csignal>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/common.h"
#include "test/helpers.h"
#include "test/test_train_shards.h"

namespace {

// summary.csv -> one map per row (column name -> value).
std::vector<std::map<std::string, std::string>> read_csv(const std::string& path) {
    std::vector<std::string> lines = split(slurp(path), '\n');
    while (!lines.empty() && lines.back().empty()) lines.pop_back();
    std::vector<std::map<std::string, std::string>> rows;
    if (lines.empty()) return rows;
    const std::vector<std::string> hdr = split(lines[0], ',');
    for (size_t i = 1; i < lines.size(); i++) {
        const std::vector<std::string> c = split(lines[i], ',');
        std::map<std::string, std::string> m;
        for (size_t k = 0; k < hdr.size() && k < c.size(); k++) m[hdr[k]] = c[k];
        rows.push_back(m);
    }
    return rows;
}

}  // namespace

TEST_CASE("study.sh --recipe ci: stopped and continued, summary, verdict from the numbers, plots", "[study][script]") {
    const std::string dd = data_dir_or_skip("study script");
    if (dd.empty()) return;
    const std::string bin = build_dir_of_test();
    const std::string out = train_scratch("study_script");
    const std::string study = "cd '" LDM_SOURCE_DIR "' && BUILD='" + bin + "' LDM_DATA_DIR='" + dd +
                              "' scripts/study.sh --recipe ci --out '" + out + "/s'";
    const std::vector<std::string> runs = {"preln_lr3e-3_s1", "ldm_lr3e-3_s1", "preln_lr3e-3_s2", "ldm_lr3e-3_s2"};

    // 1. every run stops after 5 of its 8 steps, with a checkpoint
    RunResult a = run_cmd(study + " --stop-after 5");
    INFO(a.out);
    REQUIRE(a.status == 0);
    CHECK_THAT(a.out, Catch::Contains("0 of 4 runs done, 4 stopped early"));
    for (const auto& r : runs) CHECK(ldm::file_exists(out + "/s/runs/" + r + "/ckpt_000005.model"));
    auto rows = read_csv(out + "/s/summary.csv");
    REQUIRE(rows.size() == 4);
    for (auto& row : rows) CHECK(row["status"] == "stopped at step 5 of 8");

    // 2. the same command continues them: each resumes from step 5 (one resume record)
    RunResult b = run_cmd(study);
    INFO(b.out);
    REQUIRE(b.status == 0);
    CHECK_THAT(b.out, Catch::Contains("4 of 4 runs done, 0 stopped early, 0 failed"));
    std::map<std::string, size_t> log_size;
    for (const auto& r : runs) {
        const std::string d = out + "/s/runs/" + r;
        const std::string log = slurp(d + "/log.jsonl");
        CHECK(count_of(log, "\"type\":\"resume\"") == 1);
        CHECK(count_of(log, "\"type\":\"config\"") == 1);
        log_size[r] = log.size();
        // a finished run keeps only its final checkpoint
        CHECK(ldm::file_exists(d + "/ckpt_000008.model"));
        CHECK(!ldm::file_exists(d + "/ckpt_000005.model"));
        CHECK(!ldm::file_exists(d + "/ckpt_000004.model"));
        CHECK(ldm::file_exists(d + "/eval.json"));
        const std::string sample = slurp(d + "/sample.txt");
        CHECK(sample.rfind("ROMEO:", 0) == 0);
        CHECK(sample.size() > 6);
    }

    // 3. a third call finds everything done and trains nothing
    RunResult c = run_cmd(study);
    INFO(c.out);
    REQUIRE(c.status == 0);
    CHECK(count_of(c.out, ": done earlier") == 4);
    for (const auto& r : runs) CHECK(slurp(out + "/s/runs/" + r + "/log.jsonl").size() == log_size[r]);

    // 4. only an evaluation flag changed: the evaluation is redone on the finished models (6
    //    LAMBADA examples instead of the recipe's 8), nothing trains, the samples stay
    std::map<std::string, std::string> sample_of;
    for (const auto& r : runs) sample_of[r] = slurp(out + "/s/runs/" + r + "/sample.txt");
    RunResult d = run_cmd(study + " --eval-max-examples 6");
    INFO(d.out);
    REQUIRE(d.status == 0);
    CHECK(count_of(d.out, ": done earlier") == 0);
    CHECK(count_of(d.out, ": training") == 0);
    CHECK_THAT(d.out, Catch::Contains("4 of 4 runs done, 0 stopped early, 0 failed"));
    for (const auto& r : runs) {
        const std::string rd = out + "/s/runs/" + r;
        INFO(r);
        CHECK(slurp(rd + "/log.jsonl").size() == log_size[r]);
        const nlohmann::json ev = nlohmann::json::parse(slurp(rd + "/eval.json"));
        CHECK(ev.at("results").at("lambada").at("examples").get<int64_t>() == 6);
        CHECK_THAT(slurp(rd + "/eval_cmd.txt"), Catch::Contains("--max-examples 6 "));
        CHECK(slurp(rd + "/sample.txt") == sample_of[r]);
    }
    // 5. the same flags again: all done earlier
    RunResult e2 = run_cmd(study + " --eval-max-examples 6");
    INFO(e2.out);
    REQUIRE(e2.status == 0);
    CHECK(count_of(e2.out, ": done earlier") == 4);

    // summary.csv: one row per run, in plan order, with sane values
    rows = read_csv(out + "/s/summary.csv");
    REQUIRE(rows.size() == 4);
    std::map<std::string, double> val;
    for (size_t i = 0; i < rows.size(); i++) {
        auto& row = rows[i];
        INFO(row["run"]);
        CHECK(row["run"] == runs[i]);
        CHECK(row["status"] == "done");
        CHECK(row["steps_done"] == "8");
        const double v = std::stod(row["val_loss"]);
        CHECK(v > 0.5);
        CHECK(v < std::log(257.0) + 0.5);  // near ln V after 8 steps, never far above it
        val[row["run"]] = v;
        CHECK(std::stod(row["tokens_per_s"]) > 1);
        CHECK(std::stod(row["ms_per_step"]) > 0);
        // tokens/s is the B*T = 128 tokens of a step over the median step time
        CHECK(std::stod(row["tokens_per_s"]) * std::stod(row["ms_per_step"]) / 1e3 == Approx(128).epsilon(1e-6));
        const double rss = std::stod(row["peak_rss_gib"]);
        CHECK(rss > 0.001);
        CHECK(rss < 16);
        CHECK(std::stod(row["wikitext_word_ppl"]) > 1);
        const double bpb = std::stod(row["wikitext_bits_per_byte"]);
        CHECK(bpb > 1);
        CHECK(bpb < 1.3 * std::log2(257.0));
        const double acc = std::stod(row["lambada_acc"]);
        CHECK(acc >= 0);
        CHECK(acc <= 1);
        CHECK(std::stoi(row["invocations"]) == 2);
        CHECK(row["label"] == (row["scheme"] == "ldm" ? "ldm rls" : "preln"));
    }

    // the verdict is the one that follows from those numbers
    const double p1 = val["preln_lr3e-3_s1"], p2 = val["preln_lr3e-3_s2"];
    const double l1 = val["ldm_lr3e-3_s1"], l2 = val["ldm_lr3e-3_s2"];
    const double diff = (l1 + l2) / 2 - (p1 + p2) / 2;
    const double spread = std::max(std::fabs(p1 - p2), std::fabs(l1 - l2));
    const std::string md = slurp(out + "/s/summary.md");
    const std::string verdict = slurp(out + "/s/verdict.txt");
    INFO(md);
    CHECK(md.find("## Verdict") != std::string::npos);
    CHECK(md.find("| preln | 3e-3 | 2 | " + ldm::strprintf("%.4f", (p1 + p2) / 2)) != std::string::npos);
    CHECK(md.find("| ldm rls | 3e-3 | 2 | " + ldm::strprintf("%.4f", (l1 + l2) / 2)) != std::string::npos);
    CHECK(verdict.rfind("ldm: ", 0) == 0);
    CHECK(md.find(verdict.substr(0, verdict.size() - 1)) != std::string::npos);
    // "val loss 0.0227 above preln": the printed difference (4 decimals) and its sign
    const size_t at = verdict.find("val loss ");
    REQUIRE(at != std::string::npos);
    CHECK(std::fabs(std::stod(verdict.substr(at + 9)) - std::fabs(diff)) <= 5.1e-5);
    CHECK_THAT(verdict, Catch::Contains(diff < 0 ? " below preln (" : " above preln ("));
    const bool larger = std::fabs(diff) > spread;
    const double margin = std::fabs(std::fabs(diff) - spread);
    if (margin > 1e-4) {  // (a tie within print precision could go either way)
        size_t sp = verdict.find("seed spread ");  // the one followed by its value
        while (sp != std::string::npos && !std::isdigit((unsigned char)verdict[sp + 12])) sp = verdict.find("seed spread ", sp + 1);
        REQUIRE(sp != std::string::npos);
        CHECK(std::fabs(std::stod(verdict.substr(sp + 12)) - spread) <= 5.1e-5);
        if (larger)  // ("above the seed spread" when the seeds agree exactly: spread 0)
            CHECK_THAT(verdict, (Catch::Contains("x the seed spread") || Catch::Contains("above the seed spread")) &&
                                    !Catch::Contains("no difference larger than the seed spread"));
        else
            CHECK_THAT(verdict, Catch::Contains("no difference larger than the seed spread"));
    }
    const int wins = (l1 < p1) + (l2 < p2);
    CHECK_THAT(verdict, Catch::Contains(ldm::strprintf("lower in %d of 2 seeds", wins)));
    CHECK(md.find("ROMEO:") != std::string::npos);  // the samples section

    // plots: overlaid and per run
    std::vector<std::string> pngs = {out + "/s/losses.png"};
    for (const auto& r : runs) pngs.push_back(out + "/s/plots/" + r + ".png");
    for (const auto& f : pngs) {
        INFO(f);
        const std::string png = slurp(f);
        REQUIRE(png.size() > 1000);
        CHECK(png.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0);
    }
}

TEST_CASE("study.sh: bad flags are refused before any work; the GPU recipes' commands", "[study][script]") {
    const std::string src = LDM_SOURCE_DIR;
    const std::string dir = train_scratch("study_flags");
    auto fails = [&](const std::string& flags, const std::string& needle) {
        RunResult r = run_cmd(src + "/scripts/study.sh " + flags);
        INFO(flags << "\n" << r.out);
        CHECK(r.status == 2);
        CHECK_THAT(r.out, Catch::Contains("error:") && Catch::Contains(needle));
    };
    fails("--schemes preln", "--out DIR is required");
    fails("--out " + dir + "/a --schemes 'preln bogus'", "unknown scheme 'bogus'");
    fails("--out " + dir + "/a --recipe nope", "unknown --recipe 'nope'");
    fails("--out " + dir + "/a --steps x", "STEPS must be a non-negative integer");
    fails("--out " + dir + "/a --trainer tpu", "--trainer must be cpu or gpu");
    fails("--out " + dir + "/a --bogus", "unknown flag --bogus");
    CHECK(!ldm::file_exists(dir + "/a"));

    // one H200: single process, both GPU trainers, bf16, in-trainer benchmarks
    RunResult h = run_cmd(src + "/scripts/study.sh --recipe h200-1h --out " + dir + "/h --dry-run");
    INFO(h.out);
    REQUIRE(h.status == 0);
    CHECK(count_of(h.out, "\n# ") == 4);
    CHECK_THAT(h.out, Catch::Contains("/cuda/train_gpt_baselines --preset llama-400m --n-layer 12 --d-model 640"));
    CHECK_THAT(h.out, Catch::Contains("/cuda/train_ldm --preset llama-400m --n-layer 12 --d-model 640"));
    CHECK_THAT(h.out, Catch::Contains("--total-batch-tokens 524288 --steps 200"));
    CHECK_THAT(h.out, Catch::Contains("--dtype bf16") && Catch::Contains("--resume auto") &&
                          Catch::Contains("--keep-checkpoints 1"));
    CHECK(h.out.find("mpirun") == std::string::npos);
    // --tokens sets the steps from the token budget
    RunResult t = run_cmd(src + "/scripts/study.sh --recipe h200-1h --tokens 52428800 --out " + dir + "/h --dry-run");
    CHECK_THAT(t.out, Catch::Contains("--steps 100 "));
    // the recipe's warm-up (20 of 200 steps) scales with the step count; an explicit one is kept
    CHECK_THAT(t.out, Catch::Contains("--warmup-steps 10 "));
    t = run_cmd(src + "/scripts/study.sh --recipe h200-1h --steps 50 --warmup-steps 7 --out " + dir + "/h --dry-run");
    CHECK_THAT(t.out, Catch::Contains("--steps 50 ") && Catch::Contains("--warmup-steps 7 "));
    t = run_cmd(src + "/scripts/study.sh --recipe paper-400m --steps 100 --out " + dir + "/p --dry-run");
    CHECK_THAT(t.out, Catch::Contains("--steps 100 --lr 5e-4 --warmup-steps 1 "));  // 476 of 47684: 0, at least 1
    // the paper's recipe on 2 nodes of 8 GPUs: 16 ranks, the paper's step count, LR sweep, d_k 4
    RunResult p = run_cmd(src + "/scripts/study.sh --recipe paper-400m --nodes 2 --schemes 'ldm attnres-block' --out " +
                          dir + "/p --dry-run");
    INFO(p.out);
    REQUIRE(p.status == 0);
    CHECK(count_of(p.out, "\n# ") == 6);
    CHECK_THAT(p.out, Catch::Contains("mpirun -np 16 --npernode 8"));
    CHECK_THAT(p.out, Catch::Contains("/cuda/train_ldm --preset llama-400m --scheme ldm --ldm-dk 4 -B 16 -T 2048 "
                                      "--total-batch-tokens 1048576 --steps 47684 --lr 5e-4"));
    CHECK_THAT(p.out, Catch::Contains("# attnres-block_lr4e-3_s1337"));
    CHECK_THAT(p.out, Catch::Contains("--zero 1"));
    // CPU data parallel (the ci recipe reads tiny Shakespeare even for --dry-run)
    if (!data_dir_or_skip("study.sh --recipe ci --np 2 --dry-run").empty()) {
        RunResult m = run_cmd(src + "/scripts/study.sh --recipe ci --np 2 --out " + dir + "/m --dry-run");
        CHECK_THAT(m.out, Catch::Contains("mpirun") && Catch::Contains("-np 2") && Catch::Contains("/train_cpu --preset tiny"));
    }
    CHECK(!ldm::file_exists(dir + "/h"));
}

TEST_CASE("runlog.py: a record cut by a kill is skipped, the rest kept; a null val loss is NaN", "[study][script]") {
    const std::string dir = train_scratch("runlog_cut");
    // line 2 was cut by a kill and the resumed run's first record was appended to it
    const std::string log = "{\"type\":\"config\",\"config\":{\"scheme\":\"preln\"},\"args\":{}}\n"
                            "{\"type\":\"step\",\"step\":1,\"loss\":5.0}\n"
                            "{\"type\":\"step\",\"step\":2,\"lo{\"type\":\"resume\",\"step\":1}\n"
                            "{\"type\":\"step\",\"step\":2,\"loss\":4.5}\n"
                            "{\"type\":\"val\",\"step\":1,\"val_loss\":4.9}\n"
                            "{\"type\":\"val\",\"step\":2,\"val_loss\":null}\n";
    ldm::write_file_atomic(dir + "/log.jsonl", log.data(), log.size());
    const RunResult r = run_cmd("cd '" LDM_SOURCE_DIR "/scripts' && /usr/bin/python3 -c \"from runlog import RunLog; "
                                "import math; l = RunLog('" + dir + "/log.jsonl'); "
                                "print('train', sorted(l.train.items()), 'resumes', l.resumes, 'bad', l.bad_lines, "
                                "'final_nan', math.isnan(l.final_val()), 'val1', l.val[1])\"");
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains("train [(1, 5.0), (2, 4.5)] resumes 1 bad 1 final_nan True val1 4.9"));
    CHECK_THAT(r.out, Catch::Contains("log.jsonl:3: skipped a record that is not JSON"));
}

TEST_CASE("study.sh: Ctrl-C (SIGINT to the process group) stops the whole study, exit 130",
          "[study][script]") {
    const std::string dd = data_dir_or_skip("study interrupt");
    if (dd.empty()) return;
    const std::string bin = build_dir_of_test();
    const std::string out = train_scratch("study_interrupt");
    // a run long enough to be interrupted (about a minute alone), in its own process group as a
    // terminal's foreground job
    BackgroundRun study("cd '" LDM_SOURCE_DIR "' && exec env BUILD='" + bin + "' LDM_DATA_DIR='" + dd +
                            "' scripts/study.sh --recipe ci --steps 20000 --ckpt-every 20 --out '" + out + "/s'",
                        out + "/console");
    const std::string log = out + "/s/runs/preln_lr3e-3_s1/log.jsonl";
    REQUIRE(BackgroundRun::wait_for([&] {  // the first run's first steps
        return ldm::file_exists(log) && slurp(log).find("\"type\":\"step\"") != std::string::npos;
    }, 300));  // seconds: generous for a loaded machine (only a failing run waits that long)
    study.signal_group(SIGINT);
    REQUIRE(study.wait_exit(60));
    const std::string console = study.output();
    INFO(console);
    CHECK(study.status() == 130);
    CHECK_THAT(console, Catch::Contains("study: interrupted during preln_lr3e-3_s1 (training); run the same command "
                                        "again to resume"));
    CHECK_THAT(console, !Catch::Contains("[2/4]"));  // no later run started
}
