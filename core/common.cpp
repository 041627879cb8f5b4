#include "core/common.h"

#include <cerrno>
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
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        int e = errno;
        ::unlink(tmp.c_str());
        throw Error("cannot flush " + tmp + ": " + std::strerror(e));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        int e = errno;
        ::unlink(tmp.c_str());
        throw Error("cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
    }
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

}  // namespace ldm
