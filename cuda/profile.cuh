// cuda/profile.cuh — per-stage timing of the training step with CUDA events (`--profile-stages`,
// doc/cuda.md "Per-stage profile"): named intervals recorded on one stream around groups of
// kernels (the attention forward, the MLP GEMMs, the scheme's calls, AdamW, ...), summed per name
// over the profiled steps. Events only: no synchronisation inside the step, so the numbers are
// the GPU time of each stage; the gap between their sum and the step time is host and launch
// overhead. Not usable inside a CUDA graph capture (the trainer refuses --cuda-graph 1 with it).
// Under dev/emu an interval reads the host time the emulation spent between its two records.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "cuda/common.cuh"

namespace ldm {
namespace gpu {

struct StageProfile {
    StageProfile() = default;
    StageProfile(const StageProfile&) = delete;
    StageProfile& operator=(const StageProfile&) = delete;
    ~StageProfile() {
        for (Mark& m : marks_) {
            if (m.a) (void)cudaEventDestroy(m.a);
            if (m.b) (void)cudaEventDestroy(m.b);
        }
    }
    // Opens an interval `name` (a string literal or other storage that outlives the step) on s.
    void begin(const char* name, cudaStream_t s) {
        if (used_ == marks_.size()) {
            marks_.push_back(Mark{});
            CUDA_CHECK(cudaEventCreate(&marks_.back().a));
            CUDA_CHECK(cudaEventCreate(&marks_.back().b));
        }
        Mark& m = marks_[used_];
        m.name = name;
        CUDA_CHECK(cudaEventRecord(m.a, s));
        open_.push_back(used_++);
    }
    // Closes the most recently opened interval.
    void end(cudaStream_t s) {
        if (open_.empty()) throw Error("StageProfile::end without begin");
        CUDA_CHECK(cudaEventRecord(marks_[open_.back()].b, s));
        open_.pop_back();
    }
    // Sequential markers: closes the open interval, if any, and opens `name` (one line before each
    // group of kernels); close() ends the last one.
    void next(const char* name, cudaStream_t s) {
        close(s);
        begin(name, s);
    }
    void close(cudaStream_t s) {
        if (!open_.empty()) end(s);
    }
    // After the step's work has completed (the caller synchronised): adds every interval's time to
    // its name's total (keep = true) or drops them (warm-up steps), and starts a new step.
    void collect(bool keep) {
        if (!open_.empty()) throw Error("StageProfile::collect with an open interval");
        for (size_t i = 0; keep && i < used_; i++) {
            float ms = 0.f;
            CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i].a, marks_[i].b));
            size_t k = 0;
            while (k < totals_.size() && totals_[k].first != marks_[i].name) k++;
            if (k == totals_.size()) totals_.push_back({marks_[i].name, 0.0});
            totals_[k].second += ms;
        }
        if (keep) steps_++;
        used_ = 0;
    }
    int steps() const { return steps_; }
    // (name, ms per step), in first-seen order.
    std::vector<std::pair<std::string, double>> per_step() const {
        std::vector<std::pair<std::string, double>> r = totals_;
        for (auto& kv : r) kv.second /= steps_ > 0 ? steps_ : 1;
        return r;
    }

   private:
    struct Mark {
        const char* name = "";
        cudaEvent_t a = nullptr, b = nullptr;
    };
    std::vector<Mark> marks_;
    std::vector<size_t> open_;
    size_t used_ = 0;
    std::vector<std::pair<std::string, double>> totals_;
    int steps_ = 0;
};

// Records `name` around its scope when p != nullptr (else nothing).
struct StageScope {
    StageScope(StageProfile* p, const char* name, cudaStream_t s) : p_(p), s_(s) {
        if (p_) p_->begin(name, s_);
    }
    ~StageScope() {
        if (!p_) return;
        try {
            p_->end(s_);
        } catch (...) {  // (a failed event record: the profile misses this interval)
        }
    }
    StageScope(const StageScope&) = delete;
    StageScope& operator=(const StageScope&) = delete;

   private:
    StageProfile* p_;
    cudaStream_t s_;
};

}  // namespace gpu
}  // namespace ldm
