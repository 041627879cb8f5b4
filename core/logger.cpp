#include "core/logger.h"

#include <cerrno>
#include <cstring>

#include "core/common.h"

namespace ldm {

JsonlLogger::JsonlLogger(const std::string& path, bool append) : path_(path) {
    f_ = std::fopen(path.c_str(), append ? "ab" : "wb");
    if (!f_) throw Error("--log: cannot open " + path + ": " + std::strerror(errno));
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
