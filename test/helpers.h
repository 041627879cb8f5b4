// Helpers for tests: locating the shared data and skipping visibly when it is absent.
#pragma once
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/common.h"

// Returns the data directory, or "" after printing a visible SKIP message (the caller then
// returns early). Here the data exists, so in this environment these tests always run.
inline std::string data_dir_or_skip(const char* what) {
    std::string d = ldm::find_data_dir();
    if (d.empty()) {
        WARN("SKIP " << what << ": no data directory ($LDM_DATA_DIR or ../shared/data)");
    }
    return d;
}

// The whole file as a string; "" when it cannot be read (a missing output then fails the
// caller's CHECK on its contents instead of throwing).
std::string slurp(const std::string& path);

// s cut at every sep (n separators give n + 1 pieces, empty ones included).
std::vector<std::string> split(const std::string& s, char sep);

// Non-overlapping occurrences of `what` (not empty) in `s`.
size_t count_of(const std::string& s, const std::string& what);

// The build directory of the running test binary (the parent of its build*/test directory),
// which holds the tools and trainers; "build" when /proc/self/exe cannot be read.
std::string build_dir_of_test();

// A scratch directory <build dir of this test>/test_tmp/<name>, emptied on creation (per build
// directory, so two build directories can run their tests at the same time). Registered with
// register_scratch_dir, so it is removed when the test case that made it passes.
std::string scratch_dir(const std::string& name);

// Marks dir as scratch space of the running test case: catch_main.cpp's listener deletes it when
// that test case ends with no failed assertion (a failed case keeps its files for inspection;
// LDM_KEEP_TEST_TMP=1 keeps all). Checkpoints, dumps and shards of the suite add up to several
// GiB, more than a CI machine's disk may have free, so nothing is left behind by passing cases.
void register_scratch_dir(const std::string& dir);

// A scratch directory like scratch_dir, for files that several test cases of one binary share
// (made once, e.g. in a function-local static): removed when the whole binary's run passed.
std::string binary_scratch_dir(const std::string& name);

// What a child process made by run_child did: died of SIGABRT, and its stderr.
struct ChildResult {
    bool aborted = false;
    std::string err;
};
// Runs f in a forked child (stdout discarded, stderr captured into a numbered file of the running
// test case's scratch directory, SIGABRT at its default action so that Catch's handler does not
// report from the child) and waits for it: for checks that code aborts (the emulator's fail()).
// The child exits with status 0 when f returns.
ChildResult run_child(const std::function<void()>& f);

// A shell command (`sh -c command`) running in the background in a session and process group of
// its own, as a terminal's foreground job is: for tests that signal a run half way. Its stdin is
// /dev/null, stdout and stderr go to out_path, SIGINT and SIGTERM are at their default actions
// whatever the test process ignores. Start command with `exec` to make the program itself the
// leader. The destructor kills a group still running (SIGKILL), so that a failed check leaves no
// run behind.
class BackgroundRun {
 public:
    BackgroundRun(const std::string& command, const std::string& out_path);
    ~BackgroundRun();
    BackgroundRun(const BackgroundRun&) = delete;
    BackgroundRun& operator=(const BackgroundRun&) = delete;
    // Polls ready() every 0.1 s for at most `seconds`; its last result.
    static bool wait_for(const std::function<bool()>& ready, double seconds);
    void signal_leader(int sig) const;  // the command's own process
    void signal_group(int sig) const;   // every process of its group
    // Waits at most `seconds` for the leader to end; true when it has ended.
    bool wait_exit(double seconds);
    // The leader's exit status as a shell's $? gives it (128 + signal for a signal), -1 while it
    // runs.
    int status() const { return status_; }
    std::string output() const;

 private:
    int pid_ = -1;
    int status_ = -1;
    std::string out_path_;
};

// A numeric tolerance check (doc/testing.md): CHECK(err <= bound) with label, err and bound in
// the failure message (a NaN err fails). With $LDM_TOL_REPORT naming a file, every call also
// appends "<binary>/label<TAB>err<TAB>bound" to it, so scripts/tol_margins.sh can collect the
// worst err / bound of each check over OpenBLAS core types and thread counts. Labels are stable
// across runs ("check/variant"), without tabs or newlines.
bool tol_record(const std::string& label, double err, double bound);
#define CHECK_TOL(label, err, bound)                                                          \
    do {                                                                                       \
        const std::string tol_label_ = (label);                                               \
        const double tol_err_ = (err), tol_bound_ = (bound);                                  \
        INFO(tol_label_);                                                                     \
        tol_record(tol_label_, tol_err_, tol_bound_);                                         \
        CHECK(tol_err_ <= tol_bound_);                                                        \
    } while (0)
