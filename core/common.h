// core/common.h — small utilities shared by every tool, trainer and test.
//
// Error policy: library code throws ldm::Error with a message that names the file, the
// offset or the flag at fault; each binary's main() catches it, prints "error: <msg>" to
// stderr and exits with status 1. Nothing in the library calls exit() or abort() on bad input.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace ldm {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// printf-style formatting into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// The largest --threads a tool accepts: far above any machine's core count, far below where the
// OpenMP runtime fails to start its threads (100000 crashed libgomp).
constexpr int kMaxThreads = 4096;
// ldm::Error naming --threads unless 0 <= threads <= kMaxThreads (0: all cores).
inline void check_threads_flag(long long threads) {
    if (threads < 0 || threads > kMaxThreads)
        throw Error(strprintf("--threads must be between 0 (all cores) and %d, got %lld", kMaxThreads, threads));
}

// Directory holding the shared test/demo data (gpt2_tokenizer/, lambada/, ...):
// $LDM_DATA_DIR if set, else <source dir>/../shared/data, else ./../shared/data.
// Returns "" when none exists (callers skip with a visible message).
std::string find_data_dir();

// Writes `size` bytes to `path` atomically: writes `path.tmp.<pid>`, fsyncs, renames, fsyncs the
// directory.
// Throws ldm::Error naming the path on any I/O failure (the temp file is removed).
void write_file_atomic(const std::string& path, const void* data, size_t size);

// Reads a whole file into a string; throws ldm::Error naming the path if it cannot.
std::string read_file(const std::string& path);

bool file_exists(const std::string& path);

// The directory and last component of a path, like POSIX dirname/basename on strings (trailing
// slashes ignored): "a/b" -> "a" and "b"; "b" -> "." and "b"; "/b" -> "/" and "b"; "a/b/" -> "a"
// and "b". Nothing is looked up on disk.
std::string dirname_of(const std::string& path);
std::string basename_of(const std::string& path);

// Creates directory d and its missing parents (like `mkdir -p`); "" does nothing. Returns the
// directories it created, parents first (so a failed run can remove exactly those). Throws
// ldm::Error naming the path that could not be created (e.g. a parent is a regular file), after
// removing the directories this call created.
std::vector<std::string> mkdir_p(const std::string& d);

// For an output directory given by `flag` (--out-dir, ...): creates it (mkdir_p) and checks that
// a file can be written into it, so that a bad path fails at startup and not after hours of
// training. Throws ldm::Error "<flag>: cannot write into <dir>: <reason>".
void prepare_output_dir(const std::string& dir, const char* flag);

// Host memory this process may still allocate, in bytes: the smaller of /proc/meminfo's
// MemAvailable and the cgroup limit minus its current usage (cgroup v2 memory.max /
// memory.current, or v1 memory.limit_in_bytes / memory.usage_in_bytes). -1 when unknown.
// `source` (optional) gets a short description of which limit applied.
int64_t available_memory_bytes(std::string* source = nullptr);
// ldm::Error "<what> needs X GiB (<breakdown>) but only Y GiB are available (<source>)" when
// need_bytes exceed available_memory_bytes(); nothing when the available memory is unknown.
void check_memory_fits(int64_t need_bytes, const std::string& what, const std::string& breakdown);

// Median of v: the middle value, or for an even count the mean of the two middle ones (numpy's
// and scripts/torch_bench.py's convention; every timing median of the trainers and workbenches).
// Throws ldm::Error on an empty v.
double median(std::vector<double> v);

}  // namespace ldm
