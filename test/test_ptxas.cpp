// ptxas resources of the GPU trainers' kernels (scripts/ptxas_report.py over the build's own
// -Xptxas -v output, build/cuda/NAME.ptxas, or a new nvcc compile where that is missing or older
// than a source; sm_90, no GPU needed), checked two ways:
//   no kernel spills registers to local memory beyond a few bytes. The bound (64 bytes of spill
//   stores or loads per thread) leaves room for the few bytes that ptxas versions move around in
//   two rarely-hot kernels (the scalar bf16 attention forward and the hd-64 dQ kernel: 4-8 bytes
//   with nvcc 13.0) and catches what matters: the rls warp kernels at d_k 16 once kept P and dP in
//   registers and spilled 1.5-17 KB per thread;
//   every launch configuration the emulated trainers make (build/emu/train_*, $EMU_LAUNCH_LOG,
//   every scheme and LDM path, fp32 and bf16, with validation and sampling) fits sm_90's
//   registers per block and shared memory with ptxas's numbers (scripts/launch_check.py), which
//   the emulation alone cannot see; the same for every launch of the workbenches' emulation tests
//   (test_emu_*), against the workbenches' own ptxas logs; the same for the launches of
//   scripts/gpu_check.sh's benchmarks and workbench runs at their full shapes ($EMU_LAUNCH_ONLY:
//   checked, not run); the checker itself is checked on a made-up log.
// Skips visibly without nvcc (or without the emulated trainers / data for the second).
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "test/helpers.h"
#include "test/test_train_shards.h"

namespace {

// "--log SRC=LOG" for the build's own ptxas -v output of build/cuda/NAME (the Makefile keeps it
// in NAME.ptxas) when it is there, was made for sm_ARCH and is newer than every project file the
// target's dependency list (NAME.d) names; else "" (the caller compiles SRC again).
std::string build_log_arg(const std::string& src, const std::string& arch) {
    const std::string name = src.substr(src.find_last_of('/') + 1, src.size() - 3 - (src.find_last_of('/') + 1));
    const std::string base = build_dir_of_test() + "/cuda/" + name;
    struct stat log_st {};
    if (stat((base + ".ptxas").c_str(), &log_st) != 0) return "";
    if (slurp(base + ".ptxas").find("for 'sm_" + arch + "'") == std::string::npos) return "";
    struct stat dep_st {};
    if (stat((base + ".d").c_str(), &dep_st) != 0) return "";  // (slurp throws on a missing file)
    // "target : dep dep \\\n dep ...", then (-MP) "dep :" lines: every token after the first ':'
    bool deps = false;
    int checked = 0;
    std::string text = slurp(base + ".d");
    for (char& ch : text)
        if (ch == '\\' || ch == '\n' || ch == '\t') ch = ' ';
    for (std::string tok : split(text, ' ')) {
        if (tok.empty()) continue;
        if (!deps) {
            deps = tok.back() == ':';
            continue;
        }
        if (tok.back() == ':') tok.pop_back();
        if (tok.empty() || tok[0] == '/') continue;  // toolkit headers
        struct stat st {};
        if (stat((std::string(LDM_SOURCE_DIR "/") + tok).c_str(), &st) != 0) return "";  // renamed or gone
        if (std::make_pair(st.st_mtim.tv_sec, st.st_mtim.tv_nsec) >=
            std::make_pair(log_st.st_mtim.tv_sec, log_st.st_mtim.tv_nsec))
            return "";
        checked++;
    }
    if (checked == 0) return "";  // not a dependency list this test can read
    return " --log '" + src + "=" + base + ".ptxas'";
}

// The ptxas report of SRCS for sm_ARCH: {markdown, tsv} paths and the script's output, or empty
// (with a SKIP) without nvcc. From the build's logs where every one is current (build_log_arg),
// else from a new compile of all of SRCS.
struct Report {
    std::string md, tsv, out;
};
Report make_report(const std::string& name, const std::vector<std::string>& srcs, const std::string& arch) {
    const std::string nvcc = std::getenv("NVCC") ? std::getenv("NVCC") : "/usr/local/cuda/bin/nvcc";
    if (std::system(("test -x '" + nvcc + "' || command -v nvcc >/dev/null 2>&1").c_str()) != 0) {
        WARN("SKIP ptxas report: no nvcc");
        return {};
    }
    std::string logs, compile;
    bool from_build = true;
    for (const std::string& src : srcs) {
        const std::string arg = build_log_arg(src, arch);
        from_build = from_build && !arg.empty();
        logs += arg;
        compile += " " + src;
    }
    const std::string dir = binary_scratch_dir(name);
    Report out{dir + "/ptxas.md", dir + "/ptxas.tsv", ""};
    const std::string cmd = "cd '" LDM_SOURCE_DIR "' && python3 scripts/ptxas_report.py --arch " + arch + " --out '" +
                            out.md + "' --tsv '" + out.tsv + "'" +
                            (std::getenv("NVCC") ? " --nvcc '" + nvcc + "'" : std::string()) +
                            (from_build ? logs : compile) + " 2>&1";
    RunResult r = run_cmd(cmd);
    INFO(cmd << "\n" << r.out);
    REQUIRE(r.status == 0);
    WARN("ptxas report from " << (from_build ? "the build's ptxas -v logs" : "a new nvcc compile"));
    out.out = r.out;
    return out;
}

// Both trainers' report, made once per test binary.
Report ptxas_report() {
    static Report rep;
    static bool done = false;
    if (!done) rep = make_report("ptxas", {"train_gpt_baselines.cu", "train_ldm.cu"}, "90");
    done = true;
    return rep;
}

RunResult launch_check(const std::string& tsv, const std::string& log, int min_matched) {
    return run_cmd("python3 '" LDM_SOURCE_DIR "/scripts/launch_check.py' --ptxas '" + tsv + "' --launches '" + log +
                   "' --min-matched " + std::to_string(min_matched) + " 2>&1");
}

// launch_check.py's summary line ("launch_check: N launch configurations, ..."; after its
// VIOLATION lines, before its list of kernels not in the ptxas report), or "" without one.
std::string summary_line(const std::string& out) {
    for (const std::string& line : split(out, '\n'))
        if (line.rfind("launch_check:", 0) == 0) return line;
    return "";
}

void write_file(const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f);
    REQUIRE(std::fwrite(text.data(), 1, text.size(), f) == text.size());
    REQUIRE(std::fclose(f) == 0);
}

}  // namespace

TEST_CASE("ptxas: no trainer kernel spills more than 64 bytes per thread (sm_90)", "[ptxas][cuda]") {
    const Report rep = ptxas_report();
    if (rep.md.empty()) return;
    const std::string md = slurp(rep.md);
    int kernels = 0, ldm_kernels = 0;
    for (const std::string& line : split(md, '\n')) {
        if (line.rfind("| train_", 0) != 0) continue;
        const std::vector<std::string> c = split(line, '|');  // "", source, kernel, regs, smem, stack, st, ld, ""
        REQUIRE(c.size() == 9);
        kernels++;
        if (c[2].find("ldmk") != std::string::npos) ldm_kernels++;  // (demangled or not)
        const long regs = std::atol(c[3].c_str()), st = std::atol(c[6].c_str()), ld = std::atol(c[7].c_str());
        INFO(line);
        CHECK(regs > 0);
        CHECK(regs <= 255);
        CHECK(st <= 64);
        CHECK(ld <= 64);
    }
    CHECK(kernels > 100);  // every production kernel of both trainers (368 with nvcc 13.0)
    CHECK(ldm_kernels > 20);
}

TEST_CASE("ptxas: launch_check.py flags the launches sm_90 refuses (made-up kernels)", "[ptxas][cuda]") {
    const std::string dir = scratch_dir("launch_check");
    // kernel a: 128 registers; b: 64 registers and 40 KiB static shared memory; c: 255 registers
    write_file(dir + "/k.tsv", "a\t128\t0\nb\t64\t40960\nc\t255\t0\n");
    struct Case {
        const char* log;
        bool ok;
        const char* message;
    };
    const Case cases[] = {
        {"a\t512\t0\t-1\t0\n", true, "1 matched"},  // 16 warps x 128 x 32 = 65536: exactly the limit
        {"a\t513\t0\t-1\t0\n", false, "513 threads x 128 registers need 69632 registers per block"},
        {"b\t1024\t0\t-1\t40960\n", true, "0 violations"},  // 64 registers: 1024 threads fit
        {"c\t256\t0\t-1\t0\n", true, "0 violations"},       // 8 warps x 256 x 32 = 65536
        {"c\t257\t0\t-1\t0\n", false, "need 73728 registers per block"},  // 9 warps x 8192
        {"b\t64\t8192\t-1\t0\n", true, "0 violations"},  // 40 + 8 KiB: exactly 48 KiB
        {"b\t64\t8196\t-1\t0\n", false, "40960 B static + 8196 B dynamic shared memory above 48 KiB"},
        {"b\t64\t8192\t8192\t0\n", true, "0 violations"},
        {"b\t64\t8196\t8192\t0\n", false, "8196 B dynamic shared memory above the opt-in of 8192 B"},
        {"b\t64\t1024\t192512\t0\n", false, "static + opt-in 192512 B above 227 KiB"},
        {"b\t64\t0\t-1\t45000\n", false, "the emulation saw 45000 B static shared memory, ptxas 40960 B"},
        {"?\t64\t0\t-1\t0\nzz\t64\t0\t-1\t0\n", false, "only 0 launch configurations matched"},
        {"a\t64\t0\n", false, "expected 5 tab-separated fields"},
    };
    for (const Case& c : cases) {
        write_file(dir + "/l.log", c.log);
        const RunResult r = launch_check(dir + "/k.tsv", dir + "/l.log", 1);
        INFO(c.log << "-> " << r.out);
        CHECK((r.status == 0) == c.ok);
        CHECK_THAT(r.out, Catch::Contains(c.message));
    }
}

TEST_CASE("ptxas: every launch of the emulated trainers fits sm_90's registers and shared memory",
          "[ptxas][cuda][emu]") {
    if (!emu_trainers_built("launch check")) return;
    const std::string shards = tiny_shakespeare_byte_shards("the launch check trains on tiny Shakespeare");
    if (shards.empty()) return;
    const Report rep = ptxas_report();
    if (rep.tsv.empty()) return;
    const std::string emu = build_dir_of_test() + "/emu/";
    const std::string dir = scratch_dir("launches");
    RunResult r;
    const std::string log = dir + "/launches.tsv";
    const std::string common = " --preset tiny -B 3 -T 13 --seed 7 --tokenizer bytes --steps 1 --total-batch-tokens 78"
                               " --train-data '" + shards + "/sh_train_*.bin' --val-data '" + shards +
                               "/sh_val_*.bin' --val-batches 1 --val-every 1 --sample-every 1 --sample-tokens 4"
                               " --quiet";
    // each run its own --out-dir (a run without --resume refuses one holding checkpoints)
    auto out_dir = [&](int k) { return " --out-dir '" + dir + "/run" + std::to_string(k) + "'"; };
    // every scheme and LDM kernel path (the configurations of test_emu_train)
    const char* baselines[] = {"--scheme preln", "--scheme preln --n-head 2 --n-kv-head 1 --head-dim 64",
                               "--scheme hc --hc-streams 3", "--scheme mhc --hc-streams 4", "--scheme attnres-full",
                               "--scheme attnres-block --attnres-blocks 2"};
    const char* ldm_paths[] = {"--ldm-mode store", "--ldm-mode unwind", "--ldm-mode window --ldm-window 2",
                               "--ldm-mode window --ldm-window 9", "--ldm-mode unwind --ldm-heads 2 --ldm-dk 16",
                               "--ldm-mode unwind --ldm-heads 2 --ldm-dk 24", "--ldm-rule delta --ldm-mode store",
                               "--ldm-rule outer --ldm-mode unwind"};
    int runs = 0;
    for (const char* dtype : {"fp32", "bf16"}) {
        for (const char* f : baselines) {
            r = run_cmd("EMU_LAUNCH_LOG='" + log + "' " + emu + "train_gpt_baselines" + common + out_dir(runs) + " " + f +
                        " --dtype " + dtype + " 2>&1");
            INFO(f << " " << dtype << ": " << r.out);
            REQUIRE(r.status == 0);
            runs++;
        }
        for (const char* f : ldm_paths) {
            r = run_cmd("EMU_LAUNCH_LOG='" + log + "' " + emu + "train_ldm --scheme ldm" + common + out_dir(runs) + " " +
                        f + " --dtype " + dtype + " 2>&1");
            INFO(f << " " << dtype << ": " << r.out);
            REQUIRE(r.status == 0);
            runs++;
        }
    }
    REQUIRE(runs == 28);
    // more than 100 distinct configurations, each resolved to a kernel ptxas compiled
    r = launch_check(rep.tsv, log, 100);
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains(" 0 unresolved symbols, 0 kernels ptxas did not report, 0 violations"));
    WARN(summary_line(r.out));
}

// The launches scripts/gpu_check.sh's benchmarks make on a GPU, at their shapes (llama-400m T=2048
// B=8 and qwen-1.5b T=2048 B=4, bf16), far too large to emulate: the emulated trainers under
// $EMU_LAUNCH_ONLY=1 (dev/emu/emu.h launch_only: every launch checked and logged, no kernel body or
// GEMM run, 132 SMs and 80 GiB as on an H100) for each bench item of gpu_check.sh, then every
// launch checked against ptxas's registers and static shared memory. A launch the GPU would refuse
// at these shapes (a grid dimension, dynamic shared memory growing with d, T or the depth) fails
// here. 2 layers where a layer's launches do not depend on the depth; AttnRes Full and Block at
// the preset's 24 (their source counts, and so their shared memory, grow with it).
TEST_CASE("ptxas: every launch of gpu_check.sh's benchmarks, at their shapes, fits sm_90", "[ptxas][cuda][emu]") {
    if (!emu_trainers_built("benchmark-shape launch check")) return;
    const std::string shards = tiny_shakespeare_byte_shards("the benchmark-shape launch check reads tokens");
    if (shards.empty()) return;
    const Report rep = ptxas_report();
    if (rep.tsv.empty()) return;
    const std::string emu = build_dir_of_test() + "/emu/";
    const std::string dir = scratch_dir("bench_launches"), log = dir + "/launches.tsv";
    const std::string io = " --dtype bf16 --train-data '" + shards + "/sh_train_*.bin' --quiet";
    const std::string llama24 = " --preset llama-400m -T 2048 -B 8" + io, llama = llama24 + " --n-layer 2";
    const std::string bench = " --bench 2 --sample-every -1";
    struct Run {
        const char* trainer;
        std::string flags, line;  // the line the run must print
        const char* also = "\"n_layer\":2,";  // in its output too (the depth, the NCCL path)
    };
    const Run runs[] = {
        {"train_gpt_baselines", llama + bench + " --scheme preln", "BENCH "},
        {"train_gpt_baselines", llama + bench + " --scheme preln --cuda-graph 1", "BENCH "},
        {"train_gpt_baselines", llama + bench + " --scheme preln --profile-stages", "BENCH "},
        {"train_gpt_baselines", llama + bench + " --scheme preln --nccl --zero 1 --nccl-overlap 0", "BENCH ",
         "\"nccl\":true,"},
        {"train_gpt_baselines", llama + bench + " --scheme preln --nccl --zero 1 --nccl-overlap 1", "BENCH ",
         "\"nccl\":true,"},
        {"train_gpt_baselines", llama + bench + " --scheme hc", "BENCH "},
        {"train_gpt_baselines", llama + bench + " --scheme mhc", "BENCH "},
        {"train_gpt_baselines", llama24 + bench + " --scheme attnres-full", "BENCH ", "\"n_layer\":24,"},
        {"train_gpt_baselines", llama24 + bench + " --scheme attnres-block", "BENCH ", "\"n_layer\":24,"},
        {"train_ldm", llama + bench + " --scheme ldm --ldm-rule rls --ldm-mode unwind", "BENCH "},
        {"train_ldm", llama + bench + " --scheme ldm --ldm-rule rls --ldm-mode unwind --ldm-dk 4", "BENCH "},
        {"train_ldm", llama + bench + " --scheme ldm --ldm-rule rls --ldm-mode window --ldm-window 4", "BENCH "},
        {"train_gpt_baselines", " --preset qwen-1.5b -T 2048 -B 4 --n-layer 2" + io + bench + " --scheme preln", "BENCH "},
        {"train_gpt_baselines", llama + " --scheme preln --bench-infer 1024:128", "BENCH_INFER ", "\"B\":8,"},
    };
    // two runs at a time (each is one host thread, mostly the model's init), each with a launch log
    // and an output of its own; then the logs joined
    const int n = int(sizeof runs / sizeof runs[0]);
    for (int k = 0; k < n; k++)
        write_file(dir + "/run" + std::to_string(k) + ".sh",
                   "EMU_LAUNCH_ONLY=1 EMU_LAUNCH_LOG='" + dir + "/launches" + std::to_string(k) + ".tsv' " + emu +
                       runs[k].trainer + runs[k].flags + " > '" + dir + "/out" + std::to_string(k) + ".txt' 2>&1\n"
                       "echo $? > '" + dir + "/rc" + std::to_string(k) + "'\n");
    RunResult all = run_cmd("cd '" + dir + "' && rm -f launches*.tsv && seq 0 " + std::to_string(n - 1) +
                            " | xargs -P 2 -I{} bash run{}.sh 2>&1");
    INFO(all.out);
    REQUIRE(all.status == 0);
    for (int k = 0; k < n; k++) {
        const Run& run = runs[k];
        const std::string out = slurp(dir + "/out" + std::to_string(k) + ".txt");
        INFO(run.trainer << run.flags << ":\n" << out.substr(out.size() > 4000 ? out.size() - 4000 : 0));
        REQUIRE(slurp(dir + "/rc" + std::to_string(k)) == "0\n");
        CHECK_THAT(out, Catch::Contains("launches are checked, kernels and GEMMs not run"));
        CHECK_THAT(out, Catch::Contains("\n" + run.line) && Catch::Contains("launch only") && Catch::Contains(run.also));
    }
    all = run_cmd("cd '" + dir + "' && cat launches[0-9]*.tsv > launches.tsv 2>&1");
    REQUIRE(all.status == 0);
    const RunResult r = launch_check(rep.tsv, log, 140);
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains(" 0 unresolved symbols, 0 kernels ptxas did not report, 0 violations"));
    WARN(summary_line(r.out));
}

// The workbenches' emulation tests (build/test/test_emu_<name>: each includes the emulation copy of
// its workbench) and ptxas's report of their kernels: sm_90 for every workbench and the kernels
// the tests launch straight from cuda/*.cuh, sm_90a for the attention workbench (its wgmma
// variant). Empty reports (after a SKIP) without the tests or nvcc. Made once per test binary.
struct WorkbenchReports {
    // test_emu_<name>: every test that includes workbench code (attention's has the other
    // report), and those of them with a [.bench_launches] case (test_emu_ldm includes only the
    // LDM workbench's windowed-backward header)
    std::vector<std::string> tests, benches;
    Report sm90, sm90a;
};
const WorkbenchReports& workbench_reports() {
    static WorkbenchReports w;
    static bool done = false;
    if (done) return w;
    done = true;
    const std::vector<std::string> benches = {"adamw", "attnres", "classifier", "embedding", "hc",
                                              "infer", "ldm_scheme", "matmul", "nccl", "rmsnorm",
                                              "rope", "swiglu", "attention"};
    std::vector<std::string> names = benches;
    names.push_back("ldm");
    for (const std::string& n : names) {
        struct stat st {};
        if (stat((build_dir_of_test() + "/test/test_emu_" + n).c_str(), &st) != 0) {
            WARN("SKIP workbench launch check: test_emu_" << n << " not built (no CUDA headers?)");
            return w;
        }
    }
    std::vector<std::string> srcs;
    for (const std::string& n : benches)
        if (n != "attention") srcs.push_back("dev/cuda/" + (n == "ldm_scheme" ? std::string("ldm") : n) + ".cu");
    srcs.push_back("train_gpt_baselines.cu");  // kernels the tests launch straight from cuda/*.cuh
    srcs.push_back("train_ldm.cu");
    const Report r90 = make_report("ptxas_workbenches", srcs, "90");
    if (r90.tsv.empty()) return w;
    const Report r90a = make_report("ptxas_attention", {"dev/cuda/attention.cu"}, "90a");
    if (r90a.tsv.empty()) return w;
    w = {names, benches, r90, r90a};
    return w;
}

// launch_check.py on the launches a workbench run logged, against the sm_90 report (`sm90`), or the
// attention workbench's against its sm_90a one; `kernels` must each have been launched and be in
// the report. Returns the script's output.
std::string check_workbench_launches(const WorkbenchReports& w, const std::string& launches, int min_matched,
                                     bool attention, const std::vector<std::string>& kernels) {
    const RunResult r = launch_check(attention ? w.sm90a.tsv : w.sm90.tsv, launches, min_matched);
    INFO(launches << ":\n" << r.out);
    CHECK(r.status == 0);
    CHECK_THAT(r.out, Catch::Contains(" 0 violations"));
    const std::string launched = slurp(launches);
    for (const std::string& k : kernels) {
        INFO(k);
        CHECK(launched.find(k) != std::string::npos);
        const size_t unreported = r.out.find("not in the ptxas report");  // the list ends the output
        CHECK(r.out.find(k, unreported == std::string::npos ? r.out.size() : unreported) == std::string::npos);
    }
    return r.out;
}

// Runs build/test/test_emu_<name> ARGS for each of `names` in `dir`, two at a time (both cores),
// with $EMU_LAUNCH_LOG=<name>.tsv and the environment `env`, each for at most 15 minutes: its
// output in <name>.out, its exit status in <name>.rc (124 when timed out), its seconds in
// <name>.s. Then cats the launch logs of every name but "attention" into launches.tsv (attention's
// has its own report) and returns the seconds, "name N s" each.
std::string run_emu_tests(const std::string& dir, const std::vector<std::string>& names, const std::string& env,
                          const std::string& args) {
    write_file(dir + "/one.sh", "t0=$(date +%s)\ntouch \"$1.tsv\"\n" + env + " EMU_LAUNCH_LOG=\"$1.tsv\" timeout 900 '" +
                                    build_dir_of_test() + "/test/test_emu_'\"$1\" " + args +
                                    " > \"$1.out\" 2>&1\necho $? > \"$1.rc\"\necho $(( $(date +%s) - t0 )) > \"$1.s\"\n");
    std::string cmd = "cd '" + dir + "' && rm -f *.tsv && printf '%s\\n'", logs, seconds;
    for (const std::string& n : names) {
        cmd += " " + n;
        if (n != "attention") logs += " " + n + ".tsv";
    }
    const RunResult r = run_cmd(cmd + " | xargs -P 2 -n 1 bash one.sh && cat" + logs + " > launches.tsv 2>&1");
    INFO(cmd << "\n" << r.out);
    REQUIRE(r.status == 0);
    for (const std::string& n : names) seconds += " " + n + " " + split(slurp(dir + "/" + n + ".s"), '\n')[0] + " s";
    return seconds;
}

// The dev/cuda workbenches' own kernel variants (attention mma-pipe and wgmma, the windowed LDM
// backward, the HC/mHC and AttnRes variants, ...) run on a GPU only in scripts/gpu_check.sh's
// workbench items, where a launch the device refuses would cost that workbench's BENCH lines: every
// launch the emulation tests make through the workbenches fits sm_90's registers per block and
// shared memory with ptxas's numbers (the attention workbench's against its sm_90a build).
TEST_CASE("ptxas: every launch of the emulated workbenches fits sm_90's registers and shared memory",
          "[ptxas][cuda][emu]") {
    const WorkbenchReports& w = workbench_reports();
    if (w.tests.empty()) return;
    const std::string dir = scratch_dir("wb_launches");
    run_emu_tests(dir, w.tests, "", "");
    for (const std::string& n : w.tests) {
        const std::string out = slurp(dir + "/" + n + ".out");
        INFO(n << ":\n" << out.substr(out.size() > 4000 ? out.size() - 4000 : 0));
        CHECK(slurp(dir + "/" + n + ".rc") == "0\n");
    }
    const std::string log = dir + "/launches.tsv", log_att = dir + "/attention.tsv";
    // Allowed: kernels defined only in the tests (internal linkage: unresolved) and instantiations
    // only a test makes (not in any ptxas report). Required: the workbench-only variants, each
    // launched and each found in the ptxas report.
    WARN(summary_line(check_workbench_launches(w, log, 800, false,
                                               {"wbwd_rls_warp_kernel", "combine_dz_kernel", "mhc_combine_nodw_kernel",
                                                "combine_token_kernel", "block_scores_backward_kernel",
                                                "full_scores_regstage_kernel"})));
    WARN(summary_line(check_workbench_launches(w, log_att, 30, true,
                                               {"attn_fwd_wgmma", "attn_bwd_dkdv_wgmma", "attn_bwd_dq_wgmma",
                                                "attn_fwd_pipe", "attn_bwd_dkdv_pipe", "attn_bwd_dq_pipe"})));
}

// scripts/gpu_check.sh runs each workbench with no flags on the GPU: its CHECKs, then its BENCH
// runs at their full shapes (attention at llama-400m B 8 T 2048 and qwen3-1.7b B 2 T 8192, the
// scheme workbenches at 16384 tokens of d 1024, nccl on 4e8 values, ...), which no emulation test
// reaches. Each one's main under launch-only emulation (its test's hidden "[.bench_launches]" case,
// test/emu_workbench_cases.h: launches checked and logged, no kernel run, so its CHECKs fail), with
// --check-only and then with --bench-only (together what the run without flags launches); then
// every launch checked against ptxas as above. The lines are counted: CHECKs and no BENCH in the
// first run, no CHECK and every BENCH in the second (a main that stopped early, on an exception it
// catches, prints fewer). Two at a time (both cores).
TEST_CASE("ptxas: every launch of the workbenches' runs in gpu_check.sh, at their BENCH shapes, fits sm_90",
          "[ptxas][cuda][emu]") {
    const WorkbenchReports& w = workbench_reports();
    if (w.tests.empty()) return;
    const std::string dir = scratch_dir("wb_bench_launches");
    // the CHECK and BENCH lines each workbench's main prints (the longest runs first)
    struct Lines {
        std::string name;
        int checks, benches;
    };
    const std::vector<Lines> lines = {
        {"ldm_scheme", 3628, 102}, {"hc", 1230, 66},   {"classifier", 180, 13}, {"attention", 466, 24},
        {"attnres", 980, 60},      {"adamw", 90, 5},   {"rmsnorm", 288, 24},    {"swiglu", 20, 8},
        {"embedding", 40, 10},     {"rope", 114, 14},  {"matmul", 114, 16},     {"infer", 48, 6},
        {"nccl", 33, 9}};
    REQUIRE(lines.size() == w.benches.size());
    for (const Lines& b : lines) REQUIRE(std::count(w.benches.begin(), w.benches.end(), b.name) == 1);
    std::vector<std::string> names;
    for (const Lines& b : lines) names.push_back(b.name);
    const std::string seconds = run_emu_tests(dir, names, "EMU_LAUNCH_ONLY=1", "'[.bench_launches]'");
    for (const Lines& b : lines) {
        const std::string out = slurp(dir + "/" + b.name + ".out");
        INFO(b.name << ":\n" << out.substr(out.size() > 4000 ? out.size() - 4000 : 0));
        CHECK(slurp(dir + "/" + b.name + ".rc") == "0\n");
        CHECK_THAT(out, Catch::Contains("launches are checked, kernels and GEMMs not run") &&
                            Catch::Contains("\nbench_launches: workbench_main --check-only returned ") &&
                            Catch::Contains("\nbench_launches: workbench_main --bench-only returned "));
        // the CHECK and BENCH lines of the --check-only run (0) and of the --bench-only run (1)
        int check[2] = {0, 0}, bench[2] = {0, 0}, run = 0;
        for (const std::string& line : split(out, '\n')) {
            if (line == "bench_launches: --bench-only") run = 1;
            check[run] += line.rfind("CHECK ", 0) == 0;
            bench[run] += line.rfind("BENCH ", 0) == 0;
        }
        CHECK(check[0] == b.checks);
        CHECK(bench[0] == 0);
        CHECK(check[1] == 0);
        CHECK(bench[1] == b.benches);
    }
    WARN("host time of each workbench's run (its CPU references, inputs, timing loops):" << seconds);
    const std::string all = dir + "/launches.tsv";
    // every kernel named (none only a test defines) and in the report
    const std::string strict = " 0 unresolved symbols, 0 kernels ptxas did not report, 0 violations";
    const std::string out = check_workbench_launches(w, all, 1000, false, {"wbwd_rls_warp_kernel", "combine_dz_kernel",
                                                                           "block_scores_backward_kernel"});
    CHECK_THAT(out, Catch::Contains(strict));
    WARN(summary_line(out));
    const std::string out_att = check_workbench_launches(
        w, dir + "/attention.tsv", 30, true, {"attn_fwd_wgmma", "attn_bwd_dkdv_wgmma", "attn_bwd_dq_wgmma", "attn_fwd_pipe"});
    CHECK_THAT(out_att, Catch::Contains(strict));
    WARN(summary_line(out_att));
}

// The attention workbench's wgmma kernels (dev/cuda/attention_wgmma.cuh: forward, dK/dV, dQ) on
// sm_90a, the only target with wgmma: both head-dim instantiations of each assemble, with no spills
// and no stack.
TEST_CASE("ptxas: the sm_90a wgmma attention kernels assemble without spills", "[ptxas][cuda]") {
    const Report rep = make_report("ptxas_wgmma", {"dev/cuda/attention.cu"}, "90a");
    if (rep.md.empty()) return;
    // no ptxas notice, in particular not "Potential Performance Loss: wgmma.mma_async instructions
    // are serialized" (ptxas falls back to waiting after every wgmma when the kernel breaks the
    // register rules of asynchronous warpgroup MMA)
    INFO(rep.out);
    CHECK(rep.out.find("ptxas notice") == std::string::npos);
    int found = 0;
    for (const std::string& line : split(slurp(rep.md), '\n')) {
        if (line.find("attn_fwd_wgmma") == std::string::npos && line.find("attn_bwd_dkdv_wgmma") == std::string::npos &&
            line.find("attn_bwd_dq_wgmma") == std::string::npos)
            continue;
        const std::vector<std::string> c = split(line, '|');  // "", source, kernel, regs, smem, stack, st, ld, ""
        REQUIRE(c.size() == 9);
        INFO(line);
        found++;
        CHECK(std::atol(c[3].c_str()) > 0);
        CHECK(std::atol(c[3].c_str()) <= 255);
        CHECK(std::atol(c[5].c_str()) == 0);
        CHECK(std::atol(c[6].c_str()) == 0);
        CHECK(std::atol(c[7].c_str()) == 0);
    }
    CHECK(found == 6);  // forward, dK/dV and dQ at hd 64 and hd 128
}
