// dev/emu/harness.h — helpers for the emulation tests (test/test_emu_*.cpp) that run dev/cuda
// workbench checks on the CPU: capture what a workbench prints (its CHECK lines, its errors) and
// pick out the failures, so a Catch2 test can require "no FAIL" and show only the failing lines.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace emu {

// Runs fn() with `stream` (stdout or stderr) redirected to a temporary file; returns what fn
// printed there.
inline std::string capture_stream(FILE* stream, const std::function<void()>& fn) {
    std::fflush(stream);
    FILE* tmp = std::tmpfile();
    if (!tmp) {
        fn();
        return "";
    }
    const int saved = dup(fileno(stream));
    dup2(fileno(tmp), fileno(stream));
    try {
        fn();
    } catch (...) {
        std::fflush(stream);
        dup2(saved, fileno(stream));
        close(saved);
        std::fclose(tmp);
        throw;
    }
    std::fflush(stream);
    dup2(saved, fileno(stream));
    close(saved);
    std::string out;
    std::rewind(tmp);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) out.append(buf, n);
    std::fclose(tmp);
    return out;
}
inline std::string capture_stdout(const std::function<void()>& fn) { return capture_stream(stdout, fn); }
inline std::string capture_stderr(const std::function<void()>& fn) { return capture_stream(stderr, fn); }

// Lines of `text` that start with `prefix` (e.g. "CHECK "), and of those the ones that do not end
// in " PASS": a failed check, or a line that breaks the workbench convention (doc/cuda.md: the
// verdict is the last word), which scripts/gpu_check.sh would count as failed too.
struct CheckLines {
    int total = 0;
    std::vector<std::string> failed;
};
inline CheckLines check_lines(const std::string& text, const std::string& prefix = "CHECK ") {
    static const std::string pass = " PASS";
    CheckLines r;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (line.compare(0, prefix.size(), prefix) != 0) continue;
        r.total++;
        const bool ends_pass = line.size() >= pass.size() && line.compare(line.size() - pass.size(), pass.size(), pass) == 0;
        if (!ends_pass) r.failed.push_back(line);
    }
    return r;
}

}  // namespace emu
