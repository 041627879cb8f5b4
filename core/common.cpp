#include "core/common.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstdarg>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace ldm {

std::string strprintf(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(nullptr, 0, fmt, ap);
    va_end(ap);
    std::string out(n > 0 ? size_t(n) : 0, '\0');
    if (n > 0) vsnprintf(&out[0], size_t(n) + 1, fmt, ap2);
    va_end(ap2);
    return out;
}

bool file_exists(const std::string& path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

std::string find_data_dir() {
    if (const char* env = std::getenv("LDM_DATA_DIR")) {
        if (*env && file_exists(env)) return env;
    }
#ifdef LDM_SOURCE_DIR
    {
        std::string p = std::string(LDM_SOURCE_DIR) + "/../shared/data";
        if (file_exists(p)) return p;
    }
#endif
    if (file_exists("../shared/data")) return "../shared/data";
    return "";
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw Error("cannot create " + tmp + ": " + std::strerror(errno));
    const char* p = static_cast<const char*>(data);
    size_t left = size;
    while (left > 0) {
        ssize_t w = ::write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            throw Error("write failed on " + tmp + ": " + std::strerror(e));
        }
        p += w;
        left -= size_t(w);
    }
    const int fs = ::fsync(fd), fs_errno = errno;
    const int cl = ::close(fd), cl_errno = errno;  // closed whether or not fsync failed
    if (fs != 0 || cl != 0) {
        ::unlink(tmp.c_str());
        throw Error("cannot flush " + tmp + ": " + std::strerror(fs != 0 ? fs_errno : cl_errno));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int e = errno;
        ::unlink(tmp.c_str());
        throw Error("cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
    }
    // The rename itself is durable only once the directory is synced (after a power loss the
    // directory could still hold the old file, e.g. a checkpoint marker without its files).
    const std::string dir = dirname_of(path);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {  // a directory that cannot be opened for reading: the rename stands unsynced
        const int r = ::fsync(dfd), e = errno;
        ::close(dfd);
        // a file system without directory fsync says EINVAL, ENOTSUP/EOPNOTSUPP or ENOSYS
        if (r != 0 && e != EINVAL && e != EROFS && e != ENOTSUP && e != EOPNOTSUPP && e != ENOSYS)
            throw Error("cannot sync directory " + dir + " after writing " + path + ": " + std::strerror(e));
    }
}

namespace {
// `path` without trailing slashes; "/" stays "/".
std::string strip_trailing_slashes(const std::string& path) {
    size_t n = path.size();
    while (n > 1 && path[n - 1] == '/') n--;
    return path.substr(0, n);
}
}  // namespace

std::string dirname_of(const std::string& path) {
    const std::string p = strip_trailing_slashes(path);
    const size_t s = p.find_last_of('/');
    if (s == std::string::npos) return ".";
    size_t e = s;
    while (e > 0 && p[e - 1] == '/') e--;  // "a//b" -> "a"
    return e == 0 ? "/" : p.substr(0, e);
}

std::string basename_of(const std::string& path) {
    const std::string p = strip_trailing_slashes(path);
    if (p == "/") return "/";
    const size_t s = p.find_last_of('/');
    return s == std::string::npos ? p : p.substr(s + 1);
}

std::vector<std::string> mkdir_p(const std::string& d) {
    std::vector<std::string> created;
    auto undo = [&created] {
        for (auto it = created.rbegin(); it != created.rend(); ++it) ::rmdir(it->c_str());
    };
    std::string cur;
    for (size_t i = 0; i <= d.size(); i++) {
        if (i == d.size() || d[i] == '/') {
            if (!cur.empty() && !file_exists(cur)) {
                if (::mkdir(cur.c_str(), 0755) == 0) {
                    created.push_back(cur);
                } else if (errno != EEXIST) {
                    const int e = errno;
                    undo();
                    throw Error("cannot create directory " + cur + ": " + std::strerror(e));
                }
            }
        }
        if (i < d.size()) cur.push_back(d[i]);
    }
    struct stat st;
    if (!d.empty() && (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
        undo();
        throw Error("cannot create directory " + d + ": a file of that name exists");
    }
    return created;
}

void prepare_output_dir(const std::string& dir, const char* flag) {
    try {
        mkdir_p(dir);
        const std::string probe = dir + "/.write_probe." + std::to_string(::getpid());
        const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) throw Error(std::strerror(errno));
        ::close(fd);
        ::unlink(probe.c_str());
    } catch (const Error& e) {
        throw Error(std::string(flag) + ": cannot write into " + dir + ": " + e.what());
    }
}

std::string read_file(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw Error("cannot open " + path + ": " + std::strerror(errno));
    std::string out;
    std::vector<char> buf(1 << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
    bool err = std::ferror(f);
    std::fclose(f);
    if (err) throw Error("read error on " + path);
    return out;
}

namespace {
int64_t read_int64_file(const std::string& path) {  // -1 when absent or not a number ("max")
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return -1;
    char buf[64] = {0};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    if (n == 0 || buf[0] < '0' || buf[0] > '9') return -1;
    return (int64_t)std::strtoll(buf, nullptr, 10);
}
}  // namespace

double median(std::vector<double> v) {
    if (v.empty()) throw Error("median of no values");
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int64_t available_memory_bytes(std::string* source) {
    int64_t avail = -1;
    if (FILE* f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        while (std::fgets(line, sizeof line, f))
            if (std::strncmp(line, "MemAvailable:", 13) == 0) avail = (int64_t)std::strtoll(line + 13, nullptr, 10) * 1024;
        std::fclose(f);
    }
    if (source) *source = "MemAvailable";
    int64_t lim = read_int64_file("/sys/fs/cgroup/memory.max"), use = read_int64_file("/sys/fs/cgroup/memory.current");
    const char* src = "cgroup memory.max";
    if (lim < 0) {
        lim = read_int64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
        use = read_int64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
        src = "cgroup memory.limit_in_bytes";
    }
    if (lim > 0 && lim < (int64_t(1) << 60) && use >= 0) {
        const int64_t c = std::max<int64_t>(0, lim - use);
        if (avail < 0 || c < avail) {
            avail = c;
            if (source) *source = src;
        }
    }
    return avail;
}

void check_memory_fits(int64_t need, const std::string& what, const std::string& breakdown) {
    std::string src;
    const int64_t avail = available_memory_bytes(&src);
    if (avail < 0 || need <= avail) return;
    const double g = 1024.0 * 1024.0 * 1024.0;
    throw Error(strprintf("%s needs %.2f GiB (%s) but only %.2f GiB are available (%s): use a smaller preset, "
                          "batch (-B/-T) or --dtype, or a machine with more memory",
                          what.c_str(), need / g, breakdown.c_str(), avail / g, src.c_str()));
}

}  // namespace ldm
