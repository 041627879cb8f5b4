#include "test/helpers.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <mutex>
#include <vector>

namespace {
std::mutex g_scratch_mu;
std::vector<std::string> g_scratch_dirs;         // made by the running test case
std::vector<std::string> g_binary_scratch_dirs;  // shared by the binary's test cases

bool keep_test_tmp() {
    const char* keep = std::getenv("LDM_KEEP_TEST_TMP");
    return keep && std::string(keep) == "1";
}

void remove_dirs(const std::vector<std::string>& dirs) {
    for (const auto& d : dirs) {
        std::error_code ec;
        std::filesystem::remove_all(d, ec);  // best effort: a leftover dir is not a test failure
    }
}
}  // namespace

void register_scratch_dir(const std::string& dir) {
    std::lock_guard<std::mutex> lk(g_scratch_mu);
    g_scratch_dirs.push_back(dir);
}

// Called by catch_main.cpp's listener at the end of every test case.
void end_scratch_dirs(bool passed) {
    std::vector<std::string> dirs;
    {
        std::lock_guard<std::mutex> lk(g_scratch_mu);
        dirs.swap(g_scratch_dirs);
    }
    if (passed && !keep_test_tmp()) remove_dirs(dirs);
}

// Called by catch_main.cpp's listener when the binary's run ends.
void end_binary_scratch_dirs(bool passed) {
    std::vector<std::string> dirs;
    {
        std::lock_guard<std::mutex> lk(g_scratch_mu);
        dirs.swap(g_binary_scratch_dirs);
    }
    if (passed && !keep_test_tmp()) remove_dirs(dirs);
}

std::string build_dir_of_test() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return "build";
    std::string p(buf, size_t(n));
    p = p.substr(0, p.find_last_of('/'));  // .../build/test
    return p.substr(0, p.find_last_of('/'));
}

namespace {
std::string make_scratch(const std::string& name) {
    std::string d = build_dir_of_test() + "/test_tmp/" + name;
    std::string cmd = "rm -rf '" + d + "' && mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) throw ldm::Error("cannot create scratch dir " + d);
    return d;
}
}  // namespace

std::string scratch_dir(const std::string& name) {
    std::string d = make_scratch(name);
    register_scratch_dir(d);
    return d;
}

std::string binary_scratch_dir(const std::string& name) {
    std::string d = make_scratch(name);
    std::lock_guard<std::mutex> lk(g_scratch_mu);
    g_binary_scratch_dirs.push_back(d);
    return d;
}

ChildResult run_child(const std::function<void()>& f) {
    // (of the running test case; the pid in the name: binaries that share this build's test_tmp run
    // at the same time in scripts/run_tests.sh's pool)
    const std::string dir = scratch_dir("child_stderr_" + std::to_string(getpid()));
    static int children = 0;
    const std::string path = dir + "/stderr_" + std::to_string(++children);
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        std::signal(SIGABRT, SIG_DFL);
        const int null_fd = open("/dev/null", O_WRONLY);
        if (null_fd >= 0) dup2(null_fd, 1);
        dup2(fd, 2);
        f();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ChildResult r;
    r.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    std::FILE* fp = fdopen(fd, "r");
    std::rewind(fp);
    char buf[512];
    while (std::fgets(buf, sizeof buf, fp)) r.err += buf;
    std::fclose(fp);
    std::remove(path.c_str());
    return r;
}

BackgroundRun::BackgroundRun(const std::string& command, const std::string& out_path) : out_path_(out_path) {
    const int fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    std::fflush(stdout);
    std::fflush(stderr);
    const char* cmd = command.c_str();
    const pid_t pid = fork();
    if (pid == 0) {  // only async-signal-safe calls until exec
        setsid();
        std::signal(SIGINT, SIG_DFL);
        std::signal(SIGTERM, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        const int in = open("/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, static_cast<char*>(nullptr));
        _exit(127);
    }
    close(fd);
    REQUIRE(pid > 0);
    setpgid(pid, pid);  // as the child does (setsid): a signal_group right away finds the group
    pid_ = pid;
}

BackgroundRun::~BackgroundRun() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGKILL);  // the whole group, even after the leader ended (ESRCH when all have)
    if (status_ < 0) {
        int st = 0;
        waitpid(pid_, &st, 0);
    }
}

bool BackgroundRun::wait_for(const std::function<bool()>& ready, double seconds) {
    for (int k = 0; k < int(seconds * 10); k++) {
        if (ready()) return true;
        usleep(100000);
    }
    return ready();
}

void BackgroundRun::signal_leader(int sig) const { REQUIRE(kill(pid_, sig) == 0); }
void BackgroundRun::signal_group(int sig) const { REQUIRE(kill(-pid_, sig) == 0); }

bool BackgroundRun::wait_exit(double seconds) {
    if (status_ >= 0) return true;
    return wait_for([&] {
        int st = 0;
        if (waitpid(pid_, &st, WNOHANG) != pid_) return false;
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return true;
    }, seconds);
}

std::string BackgroundRun::output() const { return slurp(out_path_); }

namespace {
std::string g_binary_name = "test";
}  // namespace

// Called by catch_main.cpp's main(): the basename of argv[0] prefixes tol_record's labels.
void set_test_binary_name(const char* argv0) {
    std::string s(argv0);
    g_binary_name = s.substr(s.find_last_of('/') + 1);
}

bool tol_record(const std::string& label, double err, double bound) {
    static std::mutex mu;
    const char* path = std::getenv("LDM_TOL_REPORT");
    if (path && *path) {
        std::lock_guard<std::mutex> lk(mu);
        if (FILE* f = std::fopen(path, "a")) {
            std::fprintf(f, "%s/%s\t%.6e\t%.6e\n", g_binary_name.c_str(), label.c_str(), err, bound);
            std::fclose(f);
        }
    }
    return err <= bound;
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

size_t count_of(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) n++;
    return n;
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (c == sep) {
            out.push_back(cur);
            cur.clear();
        } else {
            cur += c;
        }
    }
    out.push_back(cur);
    return out;
}
