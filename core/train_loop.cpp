// core/train_loop.cpp — the non-template helpers of the shared training loop (core/train_loop.h).
#include "core/train_loop.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <climits>
#include <ctime>
#include <map>

namespace ldm {
namespace train {

std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t g;
    std::vector<std::string> out;
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) out.push_back(g.gl_pathv[i]);
    globfree(&g);
    return out;
}

uint64_t SampleRng::next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
double SampleRng::uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }

double unigram_baseline(const std::string& train_glob, const std::vector<int32_t>& val_targets, uint32_t V) {
    std::vector<double> counts(V, 1.0);  // add-one smoothing
    double total = V;
    for (const auto& f : glob_files(train_glob)) {
        std::vector<uint32_t> t = read_shard(f);
        for (uint32_t x : t)
            if (x < V) counts[x] += 1, total += 1;
    }
    double s = 0;
    for (int32_t y : val_targets) s -= std::log(counts[size_t(y)] / total);
    return val_targets.empty() ? NAN : s / double(val_targets.size());
}

bool train_state_finite(const TrainState& s) {
    const size_t es = s.dtype == "fp64" ? 8 : 4;
    bool ok = true;
    for (const std::string* raw : {&s.m, &s.v, &s.exact_params}) {
        const char* d = raw->data();
        const int64_t cnt = int64_t(raw->size() / es);
#pragma omp parallel for reduction(&& : ok)
        for (int64_t i = 0; i < cnt; i++) {
            double x;
            if (es == 8) {
                std::memcpy(&x, d + size_t(i) * 8, 8);
            } else {
                float f;
                std::memcpy(&f, d + size_t(i) * 4, 4);
                x = f;
            }
            ok = ok && std::isfinite(x);
        }
    }
    return ok;
}

nlohmann::json options_json(const TrainOptions& o) {
    return nlohmann::json{
        {"preset", o.preset}, {"scheme", o.scheme}, {"train_data", o.train_data}, {"val_data", o.val_data},
        {"tokenizer", o.tokenizer}, {"B", o.B}, {"T", o.T}, {"total_batch_tokens", o.total_batch_tokens},
        {"steps", o.steps}, {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio}, {"warmup_steps", o.warmup_steps},
        {"schedule", o.schedule}, {"wsd_decay_frac", o.wsd_decay_frac}, {"weight_decay", o.weight_decay},
        {"beta1", o.beta1}, {"beta2", o.beta2}, {"adam_eps", o.adam_eps}, {"grad_clip", o.grad_clip},
        {"val_every", o.val_every}, {"val_batches", o.val_batches}, {"sample_every", o.sample_every},
        {"sample_tokens", o.sample_tokens}, {"ckpt_every", o.ckpt_every}, {"keep_checkpoints", o.keep_checkpoints},
        {"stop_after", o.stop_after}, {"out_dir", o.out_dir}, {"resume", o.resume}, {"seed", o.seed},
        {"dtype", o.dtype}, {"threads", o.threads}, {"zero", o.zero}, {"log", o.log}, {"bench", o.bench},
        {"unigram_baseline", o.unigram_baseline},
        // LDM training modes (not part of the model identity, so not in the config)
        {"ldm_mode", o.ldm_mode}, {"ldm_window", o.ldm_window}, {"ldm_checkpoint_every", o.ldm_checkpoint_every},
        {"ldm_drift_tol", o.ldm_drift_tol},
        // in-training evaluation
        {"eval_every", o.eval_every}, {"eval_max_examples", o.eval_max_examples}, {"eval_lambada", o.eval_lambada},
        {"eval_wikitext", o.eval_wikitext}, {"eval_hellaswag", o.eval_hellaswag}};
}

nlohmann::json resume_flags(const TrainOptions& o, const ModelConfig& cfg) {
    return nlohmann::json{{"config", config_to_json(cfg)}, {"dtype", o.dtype}, {"B", o.B}, {"T", o.T},
                          {"total_batch_tokens", o.total_batch_tokens}, {"seed", o.seed}};
}

nlohmann::json optimizer_settings(const TrainOptions& o) {
    return nlohmann::json{{"steps", o.steps}, {"lr", o.lr}, {"min_lr_ratio", o.min_lr_ratio},
                          {"warmup_steps", o.warmup_steps}, {"schedule", o.schedule},
                          {"wsd_decay_frac", o.wsd_decay_frac}, {"weight_decay", o.weight_decay},
                          {"beta1", o.beta1}, {"beta2", o.beta2}, {"adam_eps", o.adam_eps},
                          {"grad_clip", o.grad_clip}};
}

std::string changed_settings(const nlohmann::json& saved, const nlohmann::json& now) {
    std::string out;
    for (auto it = now.begin(); it != now.end(); ++it) {
        if (!saved.contains(it.key()) || saved.at(it.key()) == it.value()) continue;
        out += (out.empty() ? "" : ", ") + it.key() + " " + saved.at(it.key()).dump() + " -> " + it.value().dump();
    }
    return out;
}

std::vector<std::pair<std::string, double>> scheme_state_pairs(const nlohmann::json& j, const std::string& base) {
    if (!j.is_object())
        throw Error("--resume " + base + ": the training state's extra.scheme_state is not a JSON object");
    std::vector<std::pair<std::string, double>> out;
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (!it.value().is_number())
            throw Error("--resume " + base + ": the training state's extra.scheme_state." + it.key() +
                        " is not a number");
        out.emplace_back(it.key(), it.value().get<double>());
    }
    return out;
}

double model_flops_per_token(const ModelConfig& c, int T) {
    ParamCounts pc = count_params_detailed(c);
    return 6.0 * double(pc.backbone_nonembed + pc.scheme) + 6.0 * double(c.padded_vocab) * c.d_model +
           12.0 * c.n_layer * double(c.d_model) * T;
}

std::string format_duration(double s) {
    if (!(s >= 0) || !std::isfinite(s)) return "?";
    const long long t = (long long)std::llround(s);
    if (t >= 3600) return strprintf("%lldh%02lldm", t / 3600, (t % 3600) / 60);
    if (t >= 60) return strprintf("%lldm%02llds", t / 60, t % 60);
    return strprintf("%llds", t);
}

namespace {
// "ckpt_000123.model" -> 123 and the extension after the step; false for other names.
bool parse_ckpt_name(const std::string& name, int64_t* step, std::string* rest) {
    if (name.compare(0, 5, "ckpt_") != 0) return false;
    size_t i = 5;
    int64_t v = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + (name[i++] - '0');
    if (i == 5 || i >= name.size() || name[i] != '.') return false;
    *step = v;
    *rest = name.substr(i);
    return true;
}
std::vector<std::string> list_dir(const std::string& dir) {
    std::vector<std::string> out;
    DIR* d = ::opendir(dir.c_str());
    if (!d) return out;
    while (dirent* e = ::readdir(d)) out.push_back(e->d_name);
    ::closedir(d);
    return out;
}
}  // namespace

std::vector<std::string> checkpoints_after(const std::string& dir, int64_t step) {
    std::vector<std::string> out;
    for (const std::string& b : complete_checkpoints(dir)) {
        int64_t s;
        std::string rest;
        if (parse_ckpt_name(basename_of(b) + ".model", &s, &rest) && s > step) out.push_back(b);
    }
    return out;
}

namespace {
// The note a SIGINT / SIGTERM prints: two slots, the one in use named by an atomic index, so that
// the handler never reads a slot being written. A slot may hold a second text, printed instead
// once a file exists (access(2) is async-signal-safe).
struct InterruptNote {
    char text[PATH_MAX + 512];  // notes name a checkpoint path
    char if_exists[PATH_MAX];  // empty: no condition
    char then_text[PATH_MAX + 512];
};
InterruptNote g_note[2];
std::atomic<int> g_note_cur{-1};
void interrupt_handler(int sig) {
    const int c = g_note_cur.load();
    if (c >= 0) {
        const InterruptNote& n = g_note[c];
        const char* t = n.if_exists[0] != 0 && ::access(n.if_exists, F_OK) == 0 ? n.then_text : n.text;
        const ssize_t r = ::write(2, t, std::strlen(t));
        (void)r;
    }
    // die of the signal, as without a handler (a shell loop around the trainer stops too): the
    // default action back, and the signal unblocked (a handler runs with its own signal blocked,
    // so a raise would otherwise wait for the return and the _exit below would come first)
    ::signal(sig, SIG_DFL);
    sigset_t own;
    sigemptyset(&own);
    sigaddset(&own, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &own, nullptr);
    ::raise(sig);
    ::_exit(128 + sig);
}
}  // namespace

void set_interrupt_note(const std::string& msg, const std::string& once_exists, const std::string& then_msg) {
    if (once_exists.size() >= sizeof g_note[0].if_exists)
        throw Error("set_interrupt_note: the path of " + std::to_string(once_exists.size()) + " bytes is too long");
    const int cur = g_note_cur.load();
    if (cur < 0) {
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_handler = interrupt_handler;
        sigemptyset(&sa.sa_mask);  // the other signal waits while the handler runs (one note)
        sigaddset(&sa.sa_mask, SIGINT);
        sigaddset(&sa.sa_mask, SIGTERM);
        for (int sig : {SIGINT, SIGTERM}) {
            struct sigaction old;
            // a signal ignored by the launcher (a background job of a non-interactive shell) stays ignored
            if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
            ::sigaction(sig, &sa, nullptr);
        }
    }
    const int next = cur == 0 ? 1 : 0;
    InterruptNote& n = g_note[next];
    std::snprintf(n.text, sizeof n.text, "%s\n", msg.c_str());
    std::snprintf(n.if_exists, sizeof n.if_exists, "%s", once_exists.c_str());
    std::snprintf(n.then_text, sizeof n.then_text, "%s\n", then_msg.c_str());
    g_note_cur.store(next);
}

std::vector<std::string> complete_checkpoints(const std::string& dir) {
    std::map<int64_t, std::vector<std::string>> by_step;
    for (const std::string& f : list_dir(dir)) {
        int64_t s;
        std::string rest;
        if (parse_ckpt_name(f, &s, &rest)) by_step[s].push_back(rest);
    }
    std::vector<std::string> out;
    for (const auto& kv : by_step) {
        const auto has = [&](const char* ext) {
            return std::find(kv.second.begin(), kv.second.end(), std::string(ext)) != kv.second.end();
        };
        // A .state without a .done is an older single-process checkpoint; with several ranks the
        // .done marker is written last (doc/distributed.md), so it alone says "complete".
        if (has(".model") && (has(".done") || has(".state"))) {
            std::string base = dir + "/" + std::string("ckpt_") + strprintf("%06lld", (long long)kv.first);
            if (file_exists(base + ".model")) out.push_back(base);
        }
    }
    return out;
}

int remove_stale_temp_files(const std::string& dir) {
    int removed = 0;
    const time_t now = std::time(nullptr);
    for (const std::string& f : list_dir(dir)) {
        if (f.compare(0, 5, "ckpt_") != 0) continue;
        const size_t p = f.rfind(".tmp.");
        if (p == std::string::npos) continue;
        const std::string pid_s = f.substr(p + 5);
        if (pid_s.empty() || pid_s.find_first_not_of("0123456789") != std::string::npos) continue;
        const long pid = std::atol(pid_s.c_str());
        const std::string path = dir + "/" + f;
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0) continue;
        const bool dead = pid <= 0 || (::kill((pid_t)pid, 0) != 0 && errno == ESRCH);
        const bool old = now - st.st_mtime > 24 * 3600;
        if ((dead || old) && ::unlink(path.c_str()) == 0) removed++;
    }
    return removed;
}

void remove_checkpoint(const std::string& base) {
    const std::string dir = dirname_of(base), name = basename_of(base);
    for (const std::string& f : list_dir(dir))
        if (f.compare(0, name.size() + 1, name + ".") == 0) ::unlink((dir + "/" + f).c_str());
}

std::string resolve_resume(const std::string& resume, const std::string& out_dir) {
    if (resume != "latest" && resume != "auto") return resume;
    if (out_dir.empty())
        throw Error("--resume " + resume + " needs --out-dir (the directory whose newest checkpoint to use)");
    const std::vector<std::string> c = complete_checkpoints(out_dir);
    if (c.empty()) {
        if (resume == "auto") return "";
        throw Error("--resume latest: no complete checkpoint in " + out_dir);
    }
    return c.back();
}

void check_fresh_start(const std::string& out_dir, const std::string& log) {
    const char* remedy = "To continue that run, add --resume latest (or auto); to start afresh, ";
    if (!out_dir.empty()) {
        const std::vector<std::string> c = complete_checkpoints(out_dir);
        if (!c.empty())
            throw Error("--out-dir " + out_dir + " already holds the checkpoints of a run (the newest: " + c.back() +
                        ".model): a new run there would overwrite them, and --resume latest would then mix the two "
                        "runs. " + remedy + "choose another --out-dir or delete those checkpoints");
    }
    struct stat st {};
    if (!log.empty() && ::stat(log.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
        throw Error("--log " + log + " already holds a run's log (" + std::to_string((long long)st.st_size) +
                    " bytes): a new run would replace it. " + remedy + "choose another --log or delete it");
}

}  // namespace train
}  // namespace ldm
