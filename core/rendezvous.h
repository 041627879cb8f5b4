// core/rendezvous.h — the file through which rank 0 hands a small payload (the NCCL unique id) to
// the other ranks when the launcher has no MPI (--nccl-id-file; doc/distributed.md).
//
// The file holds a header line "ldm-rendezvous v1 world=W tag=T" and the payload. The tag names
// the launch (Slurm job, step and restart; torchrun's run id and restart) so that a file left by
// an earlier job at the same path is recognised as stale and waited past instead of read:
// reading it would hand the ranks an id no live rank 0 owns, and NCCL's init would hang. Without a launch tag in the
// environment only the world size is compared, so a fresh path per job is still the safe use.
#pragma once
#include <cstdlib>
#include <cstring>
#include <string>

namespace ldm {

// The launch's identity from the environment: "slurm:JOB.STEP.RESTART" (SLURM_JOB_ID,
// SLURM_STEP_ID, SLURM_RESTART_COUNT: a requeued job keeps its id and numbers its steps from 0
// again), "torchrun:ID.RESTART" (TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT; torchrun's
// default id "none" is no identity), else "" (none known).
inline std::string rendezvous_launch_tag() {
    auto env = [](const char* name, const char* fallback) {
        const char* v = std::getenv(name);
        return std::string(v && *v ? v : fallback);
    };
    const std::string job = env("SLURM_JOB_ID", "");
    if (!job.empty())
        return "slurm:" + job + "." + env("SLURM_STEP_ID", "0") + "." + env("SLURM_RESTART_COUNT", "0");
    const std::string run = env("TORCHELASTIC_RUN_ID", "");
    if (!run.empty() && run != "none") return "torchrun:" + run + "." + env("TORCHELASTIC_RESTART_COUNT", "0");
    return "";
}

// The file's bytes: header line, then the n payload bytes. world >= 1; tag has no whitespace
// (the tags of rendezvous_launch_tag never do).
inline std::string rendezvous_encode(const void* payload, size_t n, int world, const std::string& tag) {
    std::string s = "ldm-rendezvous v1 world=" + std::to_string(world) + " tag=" + tag + "\n";
    s.append(static_cast<const char*>(payload), n);
    return s;
}

// Reads a file written by rendezvous_encode into out (n bytes) when it is complete and belongs to
// this launch (same world and tag). Returns false, with the reason in *why, for a file of another
// format, size, world or launch (the caller keeps waiting: rank 0 may not have replaced it yet).
inline bool rendezvous_decode(const std::string& bytes, size_t n, int world, const std::string& tag, void* out,
                              std::string* why) {
    const std::string want = "ldm-rendezvous v1 world=" + std::to_string(world) + " tag=" + tag + "\n";
    const size_t eol = bytes.find('\n');
    if (eol == std::string::npos || bytes.compare(0, 18, "ldm-rendezvous v1 ") != 0) {
        if (why) *why = "not a rendezvous file of this version";
        return false;
    }
    const std::string head = bytes.substr(0, eol + 1);
    if (head != want) {
        if (why) *why = "written by another launch (" + head.substr(18, head.size() - 19) + "; this one: world=" +
                        std::to_string(world) + " tag=" + tag + ")";
        return false;
    }
    if (bytes.size() != head.size() + n) {
        if (why) *why = "payload of " + std::to_string(bytes.size() - head.size()) + " bytes, expected " +
                        std::to_string(n);
        return false;
    }
    std::memcpy(out, bytes.data() + head.size(), n);
    return true;
}

}  // namespace ldm
