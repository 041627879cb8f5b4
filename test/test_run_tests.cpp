// test/test_run_tests.cpp — scripts/run_tests.sh, the suite runner behind `make test`, on
// stand-in test binaries (shell scripts printing what a Catch2 binary with test/catch_main.cpp
// prints): the closing line adds up the cases, failed cases and crashed or timed-out binaries
// fail the suite and are named at its end, checks skipped with a visible warning are listed, the
// one-thread binaries (tsan/*, test/test_emu_*) and BLAS variants run together and report in
// order. The BLAS variants are off (LDM_BLAS_VARIANTS="") but in their own case.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <sys/wait.h>

#include "test/helpers.h"

namespace {

// An executable shell script at dir/name that prints `body`'s output; returns its path.
std::string stand_in(const std::string& dir, const std::string& name, const std::string& body) {
    const std::string path = dir + "/" + name;
    {
        std::ofstream f(path, std::ios::trunc);
        f << "#!/bin/sh\n" << body;
        REQUIRE(f.good());
    }
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
    return path;
}

struct SuiteRun {
    int rc = -1;
    std::string out;
};

// scripts/run_tests.sh on the given binaries, stdout and stderr together.
SuiteRun run_suite(const std::string& dir, const std::string& bins, const std::string& env = "") {
    const std::string log = dir + "/suite.txt";
    const std::string cmd = "cd '" LDM_SOURCE_DIR "' && LDM_BLAS_VARIANTS= " + env +
                            " bash scripts/run_tests.sh " + bins + " > '" + log + "' 2>&1";
    const int st = std::system(cmd.c_str());
    SuiteRun r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(log);
    return r;
}

}  // namespace

TEST_CASE("run_tests.sh: totals, failed and crashed binaries, visible skips", "[script]") {
    const std::string d = scratch_dir("run_tests_script");
    // Catch2's console reporter puts "warning:" after the file:line, on the same line or, when the
    // path is long, on the next one; the message follows indented, after the active INFO lines.
    const std::string ok = stand_in(d, "t_ok",
                                    "printf 'x.cpp:5: \\nwarning:\\n  SKIP tokenizer: no data directory\\n\\n"
                                    "x.cpp:9: warning:\\n  skipped: mpirun not found\\n"
                                    "x.cpp:12: warning:\\n  skipped: no GPU\\n"
                                    "x.cpp:14: warning:\\n  tolerance margin 3x\\n\\n"
                                    "x.cpp:20: warning:\\n  case fp32\\n  skipped: no OLMo tokenizer\\n\\n"
                                    "LDM_TEST_TOTALS 3 0\\n'\n");
    SuiteRun r = run_suite(d, "'" + ok + "'");
    INFO(r.out);
    CHECK(r.rc == 0);
    CHECK(r.out.find("tests: 3 passed, 0 failed") != std::string::npos);
    CHECK(r.out.find("skipped (passed without running): t_ok: SKIP tokenizer: no data directory") !=
          std::string::npos);
    CHECK(r.out.find("skipped (passed without running): t_ok: skipped: mpirun not found") != std::string::npos);
    CHECK(r.out.find("skipped (no GPU): the GPU cases of t_ok passed without running") != std::string::npos);
    CHECK(r.out.find("t_ok: tolerance margin") == std::string::npos);  // other warnings are not skips
    CHECK(r.out.find("skipped (passed without running): t_ok: skipped: no OLMo tokenizer") != std::string::npos);
    CHECK(count_of(r.out, "skipped (passed without running)") == 3);

    // A failed case, a binary that dies before its totals, one that exits non-zero with no failed
    // case: each counts once, the suite fails, and its end names them.
    const std::string bad = stand_in(d, "t_bad",
                                     "printf 'x.cpp:40: FAILED:\\n  CHECK( err < tol )\\nwith expansion:\\n  0.5 < 0.01\\n"
                                     "with message:\\n  a long INFO text\\n\\n"
                                     "LDM_TEST_FAILED gradient of X\\nLDM_TEST_TOTALS 4 1\\n'; exit 1\n");
    const std::string crash = stand_in(d, "t_crash", "echo 'half a run'; kill -SEGV $$\n");
    const std::string nonzero = stand_in(d, "t_nonzero", "printf 'LDM_TEST_TOTALS 2 0\\n'; exit 3\n");
    r = run_suite(d, "'" + ok + "' '" + bad + "' '" + crash + "' '" + nonzero + "'");
    INFO(r.out);
    CHECK(r.rc != 0);
    CHECK(r.out.find("tests: 9 passed, 3 failed") != std::string::npos);
    CHECK(r.out.find("FAILED test case: " + bad + ": gradient of X") != std::string::npos);
    CHECK(r.out.find("CRASHED or failed without a report: " + crash + " (exit 139)") != std::string::npos);
    CHECK(r.out.find("CRASHED or failed without a report: " + nonzero + " (exit 3)") != std::string::npos);
    CHECK(r.out.find("LDM_TEST_TOTALS") == std::string::npos);  // the machine lines are not shown
    // near the end, why: each failed check's first lines (not its messages), a crash's last lines
    const size_t why = r.out.find("---- the failed checks");
    REQUIRE(why != std::string::npos);
    const std::string tail = r.out.substr(why);
    CHECK(tail.find(bad + ":\n  x.cpp:40: FAILED:\n    CHECK( err < tol )\n  with expansion:\n    0.5 < 0.01\n") !=
          std::string::npos);
    CHECK(tail.find("a long INFO text") == std::string::npos);
    CHECK(tail.find(crash + " (exit 139), its last lines:\n  half a run\n") != std::string::npos);
    CHECK(tail.find(nonzero + " (exit 3), its last lines:\n  (no output)\n") != std::string::npos);
    CHECK(tail.find("FAILED test case: ") != std::string::npos);  // the list follows
}

TEST_CASE("run_tests.sh: a binary past LDM_TEST_TIMEOUT is stopped and counted as failed", "[script]") {
    const std::string d = scratch_dir("run_tests_timeout");
    const std::string hang = stand_in(d, "t_hang", "echo started; exec sleep 60\n");
    const std::string ok = stand_in(d, "t_ok", "printf 'LDM_TEST_TOTALS 2 0\\n'\n");
    const auto t0 = std::chrono::steady_clock::now();
    SuiteRun r = run_suite(d, "'" + hang + "' '" + ok + "'", "LDM_TEST_TIMEOUT=2");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(r.out);
    CHECK(r.rc != 0);
    CHECK(s < 45);  // stopped at 2 s (the kill follows 30 s later only if TERM is ignored)
    CHECK(r.out.find("TIMED OUT: " + hang + " ran longer than 2 s (LDM_TEST_TIMEOUT)") != std::string::npos);
    CHECK(r.out.find("CRASHED or failed without a report: " + hang + " (timed out after 2 s)") !=
          std::string::npos);
    CHECK(r.out.find("tests: 2 passed, 1 failed") != std::string::npos);  // the next binary still ran
    // and why, near the end: its last lines (what it printed, then the runner's note)
    CHECK(r.out.find(hang + " (timed out after 2 s), its last lines:\n  started\n  TIMED OUT: ") != std::string::npos);
}

TEST_CASE("run_tests.sh: ThreadSanitizer and emulation binaries run LDM_TEST_JOBS at a time, reported in order",
          "[script]") {
    const std::string d = scratch_dir("run_tests_jobs");
    REQUIRE(::mkdir((d + "/tsan").c_str(), 0755) == 0);
    REQUIRE(::mkdir((d + "/test").c_str(), 0755) == 0);
    REQUIRE(::mkdir((d + "/tmp").c_str(), 0755) == 0);  // the runner's TMPDIR
    // a stands in for a ThreadSanitizer binary (tsan/), b for an emulation test (test/test_emu_*).
    // Each of a and b first marks that it started, then waits (up to 120 s) for the other's mark:
    // both pass only when they run at the same time. They stay in running/ for a second more, so
    // that c, which must wait for a free slot (LDM_TEST_JOBS=2), sees at most two there when it
    // starts; c then fails a case.
    REQUIRE(::mkdir((d + "/running").c_str(), 0755) == 0);
    auto waits_for = [&](const std::string& where, const std::string& me, const std::string& other,
                         const std::string& tail) {
        return stand_in(d + "/" + where, me,
                        "touch '" + d + "/running/" + me + "' '" + d + "/" + me + ".started'\ni=0\nwhile [ ! -e '" + d +
                            "/" + other + ".started' ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done\n"
                            "sleep 1; rm -f '" + d + "/running/" + me + "'\n"
                            "if [ -e '" + d + "/" + other + ".started' ]; then echo 'output of " + me + "'; " + tail +
                            "; else printf 'LDM_TEST_FAILED ran alone\\nLDM_TEST_TOTALS 0 1\\n'; exit 1; fi\n");
    };
    const std::string a = waits_for("tsan", "a", "test_emu_b", "printf 'LDM_TEST_TOTALS 1 0\\n'");
    const std::string b = waits_for("test", "test_emu_b", "a", "printf 'LDM_TEST_TOTALS 2 0\\n'");
    const std::string c = stand_in(d + "/tsan", "c", "touch '" + d + "/running/c'\n[ $(ls '" + d + "/running' | wc -l) -le 2 ] || "
                                   "echo 'over the limit'\necho 'output of c'; printf 'LDM_TEST_FAILED c1\\nLDM_TEST_TOTALS 3 1\\n'; exit 1\n");
    const std::string plain = stand_in(d, "plain", "echo 'output of plain'; printf 'LDM_TEST_TOTALS 4 0\\n'\n");
    const SuiteRun r = run_suite(d, "'" + plain + "' '" + a + "' '" + b + "' '" + c + "' '" + plain + "'",
                                 "LDM_TEST_JOBS=2 TMPDIR='" + d + "/tmp'");
    INFO(r.out);
    CHECK(r.rc != 0);
    CHECK(r.out.find("tests: 14 passed, 1 failed") != std::string::npos);
    CHECK(r.out.find("FAILED test case: " + c + ": c1") != std::string::npos);
    CHECK(r.out.find("ran alone") == std::string::npos);
    CHECK(r.out.find("over the limit") == std::string::npos);
    // each binary's output under its own header, in the order given
    const std::string order[] = {"=== " + plain + "\noutput of plain\n", "=== " + a + "\noutput of a\n",
                                 "=== " + b + "\noutput of test_emu_b\n", "=== " + c + "\noutput of c\n",
                                 "=== " + plain + "\noutput of plain\n"};
    size_t at = 0;
    for (const std::string& o : order) {
        INFO(o);
        const size_t next = r.out.find(o, at);
        CHECK(next != std::string::npos);
        if (next != std::string::npos) at = next + o.size();
    }
    // no scratch left behind; a bad LDM_TEST_JOBS is refused before anything runs
    CHECK(std::system(("test -z \"$(ls -A '" + d + "/tmp')\"").c_str()) == 0);
    const SuiteRun bad = run_suite(d, "'" + plain + "'", "LDM_TEST_JOBS=two");
    INFO(bad.out);
    CHECK(bad.rc == 2);
    CHECK(bad.out.find("LDM_TEST_JOBS must be a positive integer, not 'two'") != std::string::npos);
    CHECK(bad.out.find("output of plain") == std::string::npos);
}

TEST_CASE("run_tests.sh: the [blas] variants count, name a failing variant, and one-thread ones run together",
          "[script]") {
    const std::string d = scratch_dir("run_tests_blas");
    REQUIRE(::mkdir((d + "/marks").c_str(), 0755) == 0);
    // A stand-in with one [blas] case. Run for its [blas] cases with one thread, it marks that it
    // started, then waits (up to 120 s) for a second mark: the two one-thread variants pass only
    // when they run at the same time. With two threads its case fails.
    const std::string t = stand_in(
        d, "t_blas",
        "case \"$*\" in *--list-test-names-only*) echo 'a blas case'; exit 0 ;; esac\n"
        "if [ \"$1\" != '[blas]' ]; then printf 'LDM_TEST_TOTALS 5 0\\n'; exit 0; fi\n"
        "if [ \"$OMP_NUM_THREADS\" = 2 ]; then printf 'x.cpp:7: FAILED:\\n  CHECK( two )\\n\\n"
        "LDM_TEST_FAILED a blas case\\nLDM_TEST_TOTALS 0 1\\n'; exit 1; fi\n"
        "touch '" + d + "/marks/'$$\ni=0\nwhile [ $(ls '" + d + "/marks' | wc -l) -lt 2 ] && [ $i -lt 1200 ]; do "
        "sleep 0.1; i=$((i + 1)); done\n"
        "if [ $(ls '" + d + "/marks' | wc -l) -ge 2 ]; then printf 'LDM_TEST_TOTALS 1 0\\n'; else "
        "printf 'LDM_TEST_FAILED ran alone\\nLDM_TEST_TOTALS 0 1\\n'; exit 1; fi\n");
    const std::string cmd = "cd '" LDM_SOURCE_DIR "' && LDM_TEST_JOBS=2 LDM_BLAS_VARIANTS='native:1 native:2 native:1' "
                            "bash scripts/run_tests.sh '" + t + "' > '" + d + "/suite.txt' 2>&1";
    const int st = std::system(cmd.c_str());
    const std::string out = slurp(d + "/suite.txt");
    INFO(out);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 1);
    CHECK(out.find("tests: 7 passed, 1 failed") != std::string::npos);  // 5 + 1 + 0 + 1
    CHECK(out.find("ran alone") == std::string::npos);
    CHECK(out.find("FAILED under a BLAS variant (rerun: OMP_NUM_THREADS=2 " + t + " '[blas]')") != std::string::npos);
    CHECK(out.find("FAILED test case: " + t + " [blas] native:2: a blas case") != std::string::npos);
    CHECK(out.find(t + " [blas] native:2:\n  x.cpp:7: FAILED:\n    CHECK( two )\n") != std::string::npos);
    // each variant's line, in the order given
    const size_t a = out.find("=== [blas] native:1 " + t + ": 1 passed, 0 failed");
    const size_t b = out.find("=== [blas] native:2 " + t + ": 0 passed, 1 failed");
    const size_t c = out.find("=== [blas] native:1 " + t + ": 1 passed, 0 failed", a + 1);
    CHECK(a != std::string::npos);
    CHECK(b != std::string::npos);
    CHECK(c != std::string::npos);
    CHECK((a < b && b < c));
}
