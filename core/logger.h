// core/logger.h — the trainers' JSONL log (one JSON object per line, nlohmann::json).
//
// Line 1 of a fresh log is a header {"type":"config", ...} with the full run configuration;
// then one object per event: {"type":"step", "step", "loss", "lr", "grad_norm", "ms",
// "tokens_per_s", ...}, {"type":"val", "step", "val_loss", ...}, {"type":"sample", "step",
// "text"}. On resume the log is opened in append mode and a {"type":"resume"} line is written.
// Each line is flushed as it is written so a killed run leaves a valid prefix.
#pragma once
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace ldm {

class JsonlLogger {
 public:
    JsonlLogger() = default;  // disabled logger: log() does nothing
    // Opens `path` for writing (truncate) or appending; ldm::Error naming the path on failure.
    JsonlLogger(const std::string& path, bool append);
    ~JsonlLogger();
    JsonlLogger(const JsonlLogger&) = delete;
    JsonlLogger& operator=(const JsonlLogger&) = delete;
    JsonlLogger(JsonlLogger&& o) noexcept;
    JsonlLogger& operator=(JsonlLogger&& o) noexcept;

    bool enabled() const { return f_ != nullptr; }
    // Writes one line: obj.dump() + "\n", flushed. Non-finite numbers are written as null
    // (JSON has no NaN). ldm::Error on write failure.
    void log(const nlohmann::json& obj);

 private:
    std::FILE* f_ = nullptr;
    std::string path_;
};

}  // namespace ldm
