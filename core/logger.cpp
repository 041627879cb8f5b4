#include "core/logger.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/common.h"

namespace ldm {

JsonlLogger::JsonlLogger(const std::string& path, bool append) : path_(path) {
    f_ = std::fopen(path.c_str(), append ? "ab" : "wb");
    if (!f_) throw Error("--log: cannot open " + path + ": " + std::strerror(errno));
    if (append) {
        // A run killed in the middle of a line left it without its newline: end that line, so
        // that the next record starts a line of its own (readers skip the cut one).
        FILE* r = std::fopen(path.c_str(), "rb");
        bool cut = false;
        if (r) {
            cut = std::fseek(r, -1, SEEK_END) == 0 && std::fgetc(r) != '\n';
            std::fclose(r);
        }
        if (cut && (std::fputc('\n', f_) == EOF || std::fflush(f_) != 0))
            throw Error("--log: write failed on " + path + ": " + std::strerror(errno));
    }
}

JsonlLogger::~JsonlLogger() {
    if (f_) std::fclose(f_);
}

JsonlLogger::JsonlLogger(JsonlLogger&& o) noexcept : f_(o.f_), path_(std::move(o.path_)) { o.f_ = nullptr; }

JsonlLogger& JsonlLogger::operator=(JsonlLogger&& o) noexcept {
    if (this != &o) {
        if (f_) std::fclose(f_);
        f_ = o.f_;
        path_ = std::move(o.path_);
        o.f_ = nullptr;
    }
    return *this;
}

void JsonlLogger::log(const nlohmann::json& obj) {
    if (!f_) return;
    // nlohmann::json already serialises NaN/Inf as null.
    std::string line = obj.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
        throw Error("--log: write failed on " + path_ + ": " + std::strerror(errno));
}

}  // namespace ldm
