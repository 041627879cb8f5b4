// dev/emu/harness.h — helpers for the emulation tests (test/test_emu_*.cpp) that run dev/cuda
// workbench checks on the CPU: capture what a workbench prints (its CHECK lines) and pick out
// the failures, so a Catch2 test can require "no FAIL" and show only the failing lines.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace emu {

// Runs fn() with stdout redirected to a temporary file; returns what fn printed.
inline std::string capture_stdout(const std::function<void()>& fn) {
    std::fflush(stdout);
    FILE* tmp = std::tmpfile();
    if (!tmp) {
        fn();
        return "";
    }
    const int saved = dup(fileno(stdout));
    dup2(fileno(tmp), fileno(stdout));
    try {
        fn();
    } catch (...) {
        std::fflush(stdout);
        dup2(saved, fileno(stdout));
        close(saved);
        std::fclose(tmp);
        throw;
    }
    std::fflush(stdout);
    dup2(saved, fileno(stdout));
    close(saved);
    std::string out;
    std::rewind(tmp);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) out.append(buf, n);
    std::fclose(tmp);
    return out;
}

// Lines of `text` that start with `prefix` (e.g. "CHECK "), and of those the ones containing
// `bad` (e.g. "FAIL").
struct CheckLines {
    int total = 0;
    std::vector<std::string> failed;
};
inline CheckLines check_lines(const std::string& text, const std::string& prefix = "CHECK ",
                              const std::string& bad = "FAIL") {
    CheckLines r;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.compare(0, prefix.size(), prefix) != 0) continue;
        r.total++;
        if (line.find(bad) != std::string::npos) r.failed.push_back(line);
    }
    return r;
}

}  // namespace emu
