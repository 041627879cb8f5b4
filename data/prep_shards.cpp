// data/prep_shards.cpp — the data tool's shard builder and user subcommands. See
// data/prep_shards.h and doc/formats.md "Data tool".
#include "data/prep_shards.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <deque>
#include <glob.h>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/shard.h"
#include "data/prep_eval.h"

namespace ldm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kSkippedShown = 10;  // skipped documents named on stderr and in the summary

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// ---------------------------------------------------------------------------------------------
// Input reading. A Unit is one piece of work for the parallel encoder: a jsonl line (parsed and
// encoded by the worker) or a piece of a plain-text document (encoded by the worker).
struct Unit {
    std::string text;      // jsonl: the raw line; text: the piece
    bool json = false;
    bool doc_start = false;  // first piece of a document (gets the EOT prefix)
    size_t file = 0;         // index into the file list
    uint64_t line = 0;       // jsonl: 1-based line number
    uint64_t offset = 0;     // text: byte offset of the piece in its file
};

bool is_ascii_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_visible_ascii(unsigned char c) { return c >= 0x21 && c <= 0x7E; }

class Reader {
 public:
    // split_docs: cutting long plain-text documents into pieces is allowed (see line_cuts_are_safe).
    Reader(const std::vector<std::string>& files, const ShardsOptions& o, bool split_docs)
        : files_(files), o_(o), split_(split_docs) {}
    ~Reader() {
        if (f_) std::fclose(f_);
        std::free(line_);
    }
    // Next unit, or false at the end of all input.
    bool next(Unit& u) {
        while (ready_.empty()) {
            if (!fill()) return false;
        }
        u = std::move(ready_.front());
        ready_.pop_front();
        return true;
    }
    uint64_t bytes_read() const { return bytes_; }

 private:
    // Reads more input; returns false at the end of all files.
    bool fill() {
        if (!f_) {
            if (fi_ >= files_.size()) return false;
            f_ = std::fopen(files_[fi_].c_str(), "rb");
            if (!f_) throw Error("cannot open input " + files_[fi_] + ": " + std::strerror(errno));
            struct stat st;
            if (::fstat(::fileno(f_), &st) == 0 && S_ISDIR(st.st_mode))
                throw Error("input " + files_[fi_] + " is a directory");
            lineno_ = 0;
            off_ = 0;
            piece_.clear();
            piece_off_ = 0;
            doc_emitted_ = false;
            in_doc_ = false;
        }
        ssize_t n = ::getline(&line_, &cap_, f_);
        if (n < 0) {
            if (std::ferror(f_)) throw Error("read error on " + files_[fi_] + ": " + std::strerror(errno));
            end_file();
            std::fclose(f_);
            f_ = nullptr;
            fi_++;
            return true;
        }
        bytes_ += uint64_t(n);
        lineno_++;
        std::string_view L(line_, size_t(n));
        uint64_t line_off = off_;
        off_ += uint64_t(n);
        if (o_.format == "jsonl") {
            bool blank = true;
            for (char c : L)
                if (!is_ascii_space((unsigned char)c)) { blank = false; break; }
            if (blank) return true;
            Unit u;
            u.text.assign(L.data(), L.size());
            u.json = true;
            u.doc_start = true;
            u.file = fi_;
            u.line = lineno_;
            ready_.push_back(std::move(u));
            return true;
        }
        // plain text
        if (o_.text_split == "blank") {
            bool blank = true;
            for (char c : L)
                if (!is_ascii_space((unsigned char)c)) { blank = false; break; }
            if (blank) {
                if (in_doc_) emit_piece(true);
                return true;
            }
        }
        // A cut between the previous line and this one is safe for byte-level BPE pre-tokenizers
        // when the previous line ends "<visible ASCII>\n" and this one starts with visible ASCII:
        // no pre-token spans such a line break (see doc/formats.md).
        if (split_ && piece_.size() >= o_.piece_bytes && piece_.size() >= 2 && piece_.back() == '\n' &&
            is_visible_ascii((unsigned char)piece_[piece_.size() - 2]) && is_visible_ascii((unsigned char)L[0]))
            emit_piece(false);
        if (piece_.empty()) piece_off_ = line_off;
        piece_.append(L.data(), L.size());
        in_doc_ = true;
        return true;
    }
    void end_file() {
        if (o_.format == "jsonl") return;
        if (o_.text_split == "blank") {
            if (in_doc_) emit_piece(true);
        } else {
            emit_piece(true);  // the whole file is one document (possibly empty)
        }
    }
    void emit_piece(bool doc_end) {
        Unit u;
        u.text = std::move(piece_);
        u.doc_start = !doc_emitted_;
        u.file = fi_;
        u.offset = piece_off_;
        ready_.push_back(std::move(u));
        piece_.clear();
        piece_off_ = off_;
        doc_emitted_ = !doc_end;
        if (doc_end) in_doc_ = false;
    }

    const std::vector<std::string>& files_;
    const ShardsOptions& o_;
    bool split_;
    size_t fi_ = 0;
    FILE* f_ = nullptr;
    char* line_ = nullptr;
    size_t cap_ = 0;
    uint64_t lineno_ = 0, off_ = 0, bytes_ = 0;
    std::string piece_;
    uint64_t piece_off_ = 0;
    bool doc_emitted_ = false, in_doc_ = false;
    std::deque<Unit> ready_;
};

// Whether cutting a document between "<visible ASCII>\n" and "<visible ASCII>" leaves its tokens
// unchanged for the tokenizer at `path`: true for bytes, GPT-2 (encoder.json + vocab.bpe) and HF
// ByteLevel pre-tokenizers that split with the regex (use_regex true) and add no prefix space.
// Anything else, or an unknown path, -> false (documents are then encoded whole).
bool line_cuts_are_safe(const std::string& path, const Tokenizer& tok) {
    if (tok.is_bytes()) return true;  // one id per byte: any cut is exact
    if (path.empty()) return false;
    std::string json_path = path;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        if (file_exists(path + "/encoder.json") && file_exists(path + "/vocab.bpe")) return true;
        json_path = path + "/tokenizer.json";
    }
    try {
        nlohmann::json j = nlohmann::json::parse(read_file(json_path));
        const nlohmann::json& p = j.at("pre_tokenizer");
        if (p.value("type", std::string()) != "ByteLevel") return false;
        if (p.contains("use_regex") && !p["use_regex"].get<bool>()) return false;
        if (p.contains("add_prefix_space") && p["add_prefix_space"].get<bool>()) return false;
    } catch (const std::exception&) {
        return false;
    }
    // and a direct probe of the property
    const char* probe = "Hello world.\nThe end: 42 x\n";
    std::vector<uint32_t> whole = tok.encode(probe), a = tok.encode("Hello world.\n"),
                          b = tok.encode("The end: 42 x\n");
    a.insert(a.end(), b.begin(), b.end());
    return a == whole;
}

// Encodes one unit; returns the tokens (EOT first for a document start).
std::vector<uint32_t> encode_unit(const Unit& u, const std::vector<std::string>& files, const ShardsOptions& o,
                                  const Tokenizer& tok) {
    std::vector<uint32_t> out;
    if (u.json) {
        const std::string where = strprintf("%s:%llu", files[u.file].c_str(), (unsigned long long)u.line);
        // before the JSON parser, whose message would quote the bad bytes: "FILE:LINE: invalid
        // UTF-8 at byte K" (K counted from the start of the line)
        evalprep::check_utf8(u.text, where);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(u.text);
        } catch (const nlohmann::json::exception& e) {
            throw Error(where + ": bad JSON: " + e.what());
        }
        if (!j.is_object()) throw Error(where + ": bad JSON line: not an object");
        auto it = j.find(o.text_field);
        if (it == j.end()) throw Error(where + ": missing text field '" + o.text_field + "'");
        if (!it->is_string()) throw Error(where + ": text field '" + o.text_field + "' is not a string");
        const std::string& text = it->get_ref<const std::string&>();
        std::vector<uint32_t> ids = tok.encode(text, where + " field '" + o.text_field + "'", 0);
        out.reserve(ids.size() + 1);
        out.push_back(tok.eot_id());
        out.insert(out.end(), ids.begin(), ids.end());
        return out;
    }
    std::vector<uint32_t> ids = tok.encode(u.text, files[u.file], u.offset);
    if (!u.doc_start) return ids;
    out.reserve(ids.size() + 1);
    out.push_back(tok.eot_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
}

// Sequential output: the val shard, then train shards of exactly shard_tokens tokens.
class Output {
 public:
    // Shards are written into `dir` (the staging directory).
    Output(const ShardsOptions& o, const std::string& dir, bool u32, ShardsSummary& sum)
        : o_(o), dir_(dir), u32_(u32), sum_(sum) {
        if (o.val_docs >= 0) val_docs_ = uint64_t(o.val_docs);
        else val_tokens_ = o.val_tokens >= 0 ? uint64_t(o.val_tokens) : 10000000ull;
        use_docs_ = o.val_docs >= 0;
    }
    void add(const std::vector<uint32_t>& toks, bool doc_start) {
        if (doc_start) {
            in_val_ = use_docs_ ? sum_.docs < val_docs_ : (val_tokens_ > 0 && sum_.val_tokens < val_tokens_);
            sum_.docs++;
            if (in_val_) sum_.val_docs++;
            else sum_.train_docs++;
        }
        sum_.tokens += toks.size();
        if (in_val_) {
            if (!val_) val_.reset(new ShardWriter(path("val", 0), u32_));
            val_->append(toks.data(), toks.size());
            sum_.val_tokens += toks.size();
            return;
        }
        close_val();
        size_t at = 0;
        while (at < toks.size()) {
            if (!train_) train_.reset(new ShardWriter(path("train", ++train_index_), u32_));
            size_t m = size_t(std::min<uint64_t>(toks.size() - at, o_.shard_tokens - train_->size()));
            train_->append(toks.data() + at, m);
            at += m;
            sum_.train_tokens += m;
            if (train_->size() == o_.shard_tokens) finish(train_);
        }
    }
    void close() {
        close_val();
        if (train_) finish(train_);
    }
    uint64_t shards_written() const { return sum_.shards.size(); }

 private:
    std::string path(const char* split, int idx) const {
        return strprintf("%s/%s_%s_%06d.bin", dir_.c_str(), o_.name.c_str(), split, idx);
    }
    void close_val() {
        if (val_) finish(val_);
    }
    void finish(std::unique_ptr<ShardWriter>& w) {
        w->finish();
        sum_.shards.push_back(w->path());
        w.reset();
    }
    const ShardsOptions& o_;
    std::string dir_;
    bool u32_;
    ShardsSummary& sum_;
    bool use_docs_ = false, in_val_ = false;
    uint64_t val_docs_ = 0, val_tokens_ = 0;
    int train_index_ = 0;
    std::unique_ptr<ShardWriter> val_, train_;
};

// The file names NAME_{val,train}_NNNNNN.bin of regular files in dir (sorted): an earlier run's
// shards, which a commit replaces as a whole.
std::vector<std::string> shard_files_in(const ShardsOptions& o, const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = ::opendir(dir.c_str());
    if (!d) return names;
    while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        for (const char* split : {"_val_", "_train_"}) {
            const std::string pre = o.name + split;
            struct stat st;
            if (n.size() == pre.size() + 10 && n.compare(0, pre.size(), pre) == 0 &&
                n.compare(n.size() - 4, 4, ".bin") == 0 &&
                std::all_of(n.begin() + long(pre.size()), n.end() - 4, [](char c) { return c >= '0' && c <= '9'; }) &&
                ::stat((dir + "/" + n).c_str(), &st) == 0 && S_ISREG(st.st_mode))
                names.push_back(n);
        }
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

void fsync_dir(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

// The output directory of one run: creates out_dir (remembering which directories it made) and a
// private staging directory out_dir/.NAME.staging.<pid> for the shards. commit() replaces the
// earlier run's shards of the same name by the finished ones, all or nothing; without commit
// (an error unwinding) the destructor deletes the staging directory with its files and removes
// the directories this run created if they are empty, so a failed run leaves out_dir as it was.
class StagedOutput {
 public:
    explicit StagedOutput(const ShardsOptions& o) : o_(o) {
        created_ = mkdir_p(o.out_dir);
        staging_ = o.out_dir + "/." + o.name + ".staging." + std::to_string(::getpid());
        int rc = ::mkdir(staging_.c_str(), 0755);
        if (rc != 0 && errno == EEXIST) {  // left by a killed run that had our pid: nobody owns it
            remove_staging();
            rc = ::mkdir(staging_.c_str(), 0755);
        }
        if (rc != 0) {
            const int e = errno;
            remove_created();
            throw Error("cannot create the staging directory " + staging_ + ": " + std::strerror(e));
        }
    }
    ~StagedOutput() {
        if (committed_) return;
        remove_staging();
        remove_created();
    }
    const std::string& dir() const { return staging_; }
    // Replaces the earlier run's shards of this name in out_dir by the staged ones (paths inside
    // dir()); `shards` then holds the final paths. First the earlier shards move into
    // dir()/old, then the new ones into out_dir; if a rename fails, every move is undone (out_dir
    // as before the run) and ldm::Error is thrown. Earlier shards not replaced by a new one of the
    // same name (an earlier, larger run's) are deleted and named on stderr.
    void commit(std::vector<std::string>& shards) {
        const std::string old = staging_ + "/old";
        if (::mkdir(old.c_str(), 0755) != 0)
            throw Error("cannot create " + old + ": " + std::strerror(errno));
        const std::vector<std::string> prev = shard_files_in(o_, o_.out_dir);
        std::vector<std::string> moved_out, moved_in;  // names in old/; final paths in out_dir
        auto fail = [&](const std::string& from, const std::string& to, int e) {
            for (auto it = moved_in.rbegin(); it != moved_in.rend(); ++it)
                ::rename(it->c_str(), (staging_ + it->substr(o_.out_dir.size())).c_str());
            std::string lost;
            for (const std::string& n : moved_out)
                if (::rename((old + "/" + n).c_str(), (o_.out_dir + "/" + n).c_str()) != 0) lost += " " + n;
            throw Error("cannot move " + from + " to " + to + ": " + std::strerror(e) +
                        (lost.empty() ? std::string(" (the earlier shards are back in place)")
                                      : " (could not put back" + lost + ": they are in " + old + ")"));
        };
        for (const std::string& n : prev) {
            const std::string from = o_.out_dir + "/" + n, to = old + "/" + n;
            if (::rename(from.c_str(), to.c_str()) != 0) fail(from, to, errno);
            moved_out.push_back(n);
        }
        for (const std::string& p : shards) {
            const std::string dst = o_.out_dir + p.substr(staging_.size());
            if (::rename(p.c_str(), dst.c_str()) != 0) fail(p, dst, errno);
            moved_in.push_back(dst);
        }
        shards = moved_in;
        fsync_dir(o_.out_dir);
        committed_ = true;
        size_t replaced = 0;
        for (const std::string& n : prev) {
            if (std::find(shards.begin(), shards.end(), o_.out_dir + "/" + n) == shards.end())
                std::fprintf(stderr, "[shards] removed stale shard %s/%s\n", o_.out_dir.c_str(), n.c_str());
            else
                ++replaced;
        }
        if (replaced > 0)
            std::fprintf(stderr, "[shards] replaced %zu earlier shard%s of name %s in %s\n", replaced,
                         replaced == 1 ? "" : "s", o_.name.c_str(), o_.out_dir.c_str());
        remove_staging();
    }

 private:
    // Deletes the staged files and the staging directory. old/ (the earlier shards) is emptied
    // only after a commit; otherwise it is removed only when empty, so shards a failed commit
    // could not put back are never deleted.
    void remove_staging() {
        auto unlink_files = [](const std::string& dir) {
            if (DIR* d = ::opendir(dir.c_str())) {
                std::vector<std::string> names;
                while (dirent* e = ::readdir(d)) {
                    const std::string n = e->d_name;
                    if (n != "." && n != "..") names.push_back(dir + "/" + n);
                }
                ::closedir(d);
                for (const std::string& f : names) ::unlink(f.c_str());  // not directories
            }
        };
        if (committed_) unlink_files(staging_ + "/old");
        ::rmdir((staging_ + "/old").c_str());
        unlink_files(staging_);
        ::rmdir(staging_.c_str());
    }
    void remove_created() {
        for (auto it = created_.rbegin(); it != created_.rend(); ++it) ::rmdir(it->c_str());  // only if empty
    }
    const ShardsOptions& o_;
    std::vector<std::string> created_;
    std::string staging_;
    bool committed_ = false;
};

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
    std::vector<std::string> out;
    for (const std::string& p : patterns) {
        if (!has_glob_chars(p)) {
            if (!file_exists(p)) throw Error("input file " + p + " does not exist");
            out.push_back(p);
            continue;
        }
        glob_t g;
        std::memset(&g, 0, sizeof(g));
        int rc = ::glob(p.c_str(), 0, nullptr, &g);
        std::vector<std::string> m;
        if (rc == 0)
            for (size_t i = 0; i < g.gl_pathc; i++) m.push_back(g.gl_pathv[i]);
        ::globfree(&g);
        if (m.empty()) throw Error("no input files match '" + p + "'");
        std::sort(m.begin(), m.end());
        out.insert(out.end(), m.begin(), m.end());
    }
    if (out.empty()) throw Error("no input files given (--input)");
    return out;
}

ShardsSummary prepare_shards(const ShardsOptions& o, const Tokenizer* tok_in) {
    if (o.format != "jsonl" && o.format != "text")
        throw Error("--format must be jsonl or text, not '" + o.format + "'");
    if (o.text_split != "file" && o.text_split != "blank")
        throw Error("--text-split must be file or blank, not '" + o.text_split + "'");
    if (o.out_dir.empty()) throw Error("--out-dir is required");
    if (o.name.empty() || o.name.find('/') != std::string::npos)
        throw Error("--name is required and must not contain '/' (got '" + o.name + "')");
    if (o.shard_tokens == 0 || o.shard_tokens > 2147483647ull)
        throw Error("--shard-tokens must be in [1, 2147483647]");
    if (o.val_docs >= 0 && o.val_tokens >= 0) throw Error("give either --val-tokens or --val-docs, not both");
    if (o.text_field.empty()) throw Error("--text-field must not be empty");

    std::vector<std::string> files = expand_inputs(o.inputs);
    Tokenizer loaded;
    if (!tok_in) {
        if (o.tokenizer.empty()) throw Error("--tokenizer is required");
        loaded = Tokenizer::load(o.tokenizer);
        tok_in = &loaded;
    }
    const Tokenizer& tok = *tok_in;
    StagedOutput staged(o);

    ShardsSummary sum;
    sum.uint32_tokens = shard_needs_uint32(tok.vocab_size());
    const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
    const size_t batch_bytes = o.batch_bytes ? o.batch_bytes : size_t(4 << 20) * size_t(threads);
    const bool tty = ::isatty(2);

    // With skip_bad_docs a plain-text document is one unit, so that a bad one is dropped whole.
    Reader reader(files, o, o.format == "text" && !o.skip_bad_docs && line_cuts_are_safe(o.tokenizer, tok));
    Output out(o, staged.dir(), sum.uint32_tokens, sum);
    auto t0 = Clock::now();
    double last_report = 0;
    auto report = [&](bool final) {
        double t = seconds_since(t0);
        if (!o.progress || (!final && t - last_report < (tty ? 1.0 : 10.0))) return;
        last_report = t;
        double mb = reader.bytes_read() / 1e6;
        std::fprintf(stderr, "%s[shards] %.1f MB read, %.2f MB/s, %llu docs, %llu tokens, %llu shards done%s",
                     tty ? "\r" : "", mb, t > 0 ? mb / t : 0.0, (unsigned long long)sum.docs,
                     (unsigned long long)sum.tokens, (unsigned long long)out.shards_written(),
                     tty && !final ? "" : "\n");
        std::fflush(stderr);
    };

    std::vector<Unit> batch;
    std::vector<std::vector<uint32_t>> results;
    std::vector<std::string> errors;
    bool more = true;
    while (more) {
        batch.clear();
        size_t bytes = 0;
        Unit u;
        while (bytes < batch_bytes && (more = reader.next(u))) {
            bytes += u.text.size() + 1;
            batch.push_back(std::move(u));
        }
        if (batch.empty()) break;
        sum.pieces += batch.size();
        results.assign(batch.size(), {});
        errors.assign(batch.size(), {});
        const long nb = long(batch.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (long i = 0; i < nb; i++) {
            try {
                results[size_t(i)] = encode_unit(batch[size_t(i)], files, o, tok);
                batch[size_t(i)].text.clear();
                batch[size_t(i)].text.shrink_to_fit();
            } catch (const std::exception& e) {
                errors[size_t(i)] = e.what();
                if (errors[size_t(i)].empty()) errors[size_t(i)] = "unknown error";
            }
        }
        for (size_t i = 0; i < batch.size(); i++) {
            if (!errors[i].empty()) {
                if (!o.skip_bad_docs) throw Error(errors[i] + " (--skip-bad-docs leaves such documents out)");
                // every unit is a whole document here (jsonl line, or unsplit text document)
                sum.skipped_docs++;
                if (sum.skipped_examples.size() < kSkippedShown) {
                    sum.skipped_examples.push_back(errors[i]);
                    if (o.progress) std::fprintf(stderr, "[shards] skipped bad document: %s\n", errors[i].c_str());
                }
                continue;
            }
            out.add(results[i], batch[i].doc_start);
            std::vector<uint32_t>().swap(results[i]);
        }
        report(false);
    }
    out.close();
    sum.input_bytes = reader.bytes_read();
    sum.seconds = seconds_since(t0);
    report(true);
    if (sum.docs == 0)
        throw Error(sum.skipped_docs ? strprintf("no documents in the input but the %llu bad ones skipped",
                                                 (unsigned long long)sum.skipped_docs)
                                     : std::string("no documents in the input"));
    staged.commit(sum.shards);
    if (sum.skipped_docs && o.progress)
        std::fprintf(stderr, "[shards] skipped %llu bad documents (--skip-bad-docs)%s\n",
                     (unsigned long long)sum.skipped_docs,
                     sum.skipped_docs > sum.skipped_examples.size() ? "; the first ones are listed above" : "");
    if (sum.train_tokens == 0)
        std::fprintf(stderr,
                     "[shards] warning: no train shard written: all %llu tokens went to the validation shard "
                     "(lower --val-tokens / --val-docs)\n",
                     (unsigned long long)sum.tokens);
    return sum;
}

// ---------------------------------------------------------------------------------------------
// Command-line parsing shared by the subcommands.
namespace {

struct Args {
    std::map<std::string, std::vector<std::string>> flags;  // --flag -> values
    std::vector<std::string> positional;
};

// `multi`: flags that take every following non-flag argument; `boolean`: flags without value.
Args parse_args(int argc, char** argv, const std::vector<std::string>& known, const std::vector<std::string>& multi,
                const std::vector<std::string>& boolean) {
    Args a;
    for (int i = 1; i < argc; i++) {
        std::string s = argv[i];
        if (s.size() > 2 && s.compare(0, 2, "--") == 0) {
            std::string name = s, val;
            bool has_val = false;
            size_t eq = s.find('=');
            if (eq != std::string::npos) {
                name = s.substr(0, eq);
                val = s.substr(eq + 1);
                has_val = true;
            }
            if (std::find(known.begin(), known.end(), name) == known.end())
                throw std::invalid_argument("unknown flag " + name);
            auto& v = a.flags[name];
            if (std::find(boolean.begin(), boolean.end(), name) != boolean.end()) {
                if (has_val) throw std::invalid_argument(name + " takes no value");
                v.push_back("1");
                continue;
            }
            if (has_val) {
                v.push_back(val);
                continue;
            }
            if (std::find(multi.begin(), multi.end(), name) != multi.end()) {
                int start = i;
                while (i + 1 < argc && !(std::strlen(argv[i + 1]) > 2 && std::strncmp(argv[i + 1], "--", 2) == 0))
                    v.push_back(argv[++i]);
                if (i == start) throw std::invalid_argument(name + " needs at least one value");
                continue;
            }
            if (i + 1 >= argc) throw std::invalid_argument(name + " needs a value");
            v.push_back(argv[++i]);
        } else {
            a.positional.push_back(s);
        }
    }
    return a;
}

bool has_help(int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return true;
    return false;
}

std::string one(const Args& a, const std::string& f, const std::string& def = "") {
    auto it = a.flags.find(f);
    if (it == a.flags.end()) return def;
    if (it->second.size() != 1) throw std::invalid_argument(f + " given more than once");
    return it->second[0];
}

uint64_t parse_u64(const std::string& flag, const std::string& s) {
    if (s.empty() || s.find_first_not_of("0123456789_,") != std::string::npos)
        throw std::invalid_argument(flag + " expects a non-negative integer, got '" + s + "'");
    std::string d;
    for (char c : s)
        if (isdigit((unsigned char)c)) d += c;
    if (d.empty()) throw std::invalid_argument(flag + " expects a non-negative integer, got '" + s + "'");
    errno = 0;
    unsigned long long v = std::strtoull(d.c_str(), nullptr, 10);
    if (errno == ERANGE) throw std::invalid_argument(flag + " is out of range: " + s);
    return v;
}

// Runs body, mapping exceptions to exit codes: usage errors (std::invalid_argument) -> 2 with a
// hint, ldm::Error and others -> 1.
template <typename F>
int guarded(const char* cmd, F body) {
    try {
        return body();
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "error: %s: %s (see ldm_data %s --help)\n", cmd, e.what(), cmd);
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}

const char* kShardsHelp =
    "usage: ldm_data shards --tokenizer bytes|DIR|tokenizer.json --input FILE|GLOB... --out-dir DIR --name NAME\n"
    "                       [--format jsonl|text] [--text-field text] [--text-split file|blank]\n"
    "                       [--shard-tokens N] [--val-tokens N | --val-docs N] [--threads N]\n"
    "                       [--skip-bad-docs] [--quiet]\n"
    "\n"
    "Tokenizes documents into llm.c-compatible token shards (doc/formats.md):\n"
    "  DIR/NAME_val_000000.bin    the first documents (validation), then\n"
    "  DIR/NAME_train_000001.bin, NAME_train_000002.bin, ...  (--shard-tokens tokens each)\n"
    "Every document is written as <EOT> + its tokens; document text is ordinary text (a literal\n"
    "\"<|endoftext|>\" in it is not the EOT id). uint16 tokens when the vocabulary has <= 65536 ids\n"
    "(GPT-2, bytes), else the uint32 variant (magic 20240801). A failed run leaves no shard behind.\n"
    "\n"
    "  --tokenizer P     bytes (one id per UTF-8 byte + EOT 256; 257 ids), a GPT-2 directory\n"
    "                    (encoder.json + vocab.bpe) or a HF tokenizer.json\n"
    "  --input F...      input files or quoted globs, in order (each glob sorted)\n"
    "  --format F        jsonl (default): one JSON object per line, document = --text-field;\n"
    "                    text: plain UTF-8 text files\n"
    "  --text-field K    jsonl field holding the document (default: text)\n"
    "  --text-split S    text: 'file' (default) = each file is one document;\n"
    "                    'blank' = documents are separated by blank lines\n"
    "  --shard-tokens N  tokens per train shard (default 100000000)\n"
    "  --val-tokens N    whole documents go to the val shard until it holds >= N tokens\n"
    "                    (default 10000000; 0 = no val shard)\n"
    "  --val-docs N      instead: the first N documents form the val shard\n"
    "  --threads N       encoding threads (default: all cores)\n"
    "  --skip-bad-docs   leave out documents that cannot be read or encoded (invalid UTF-8, bad\n"
    "                    JSON line, missing text field) instead of failing; they are counted and\n"
    "                    the first ones named on stderr and in the summary (plain-text documents\n"
    "                    are then encoded whole, one thread each)\n"
    "  --quiet           no progress line\n";

const char* kEncodeHelp =
    "usage: ldm_data encode --tokenizer bytes|DIR|tokenizer.json [--file F | --text STRING] [--eot]\n"
    "Prints the token ids of the text (from --file, --text, or stdin), space-separated, one line,\n"
    "encoded as the shard builder encodes document text (special-token text is ordinary text).\n"
    "--eot prepends the end-of-text id, as the shard builder does for each document.\n";

const char* kDecodeHelp =
    "usage: ldm_data decode --tokenizer bytes|DIR|tokenizer.json [ID...]\n"
    "Writes the bytes the ids decode to (ids from the arguments, or whitespace-separated on stdin).\n";

const char* kInfoHelp =
    "usage: ldm_data info SHARD.bin [--tokenizer bytes|DIR|tokenizer.json] [--eot ID] [--vocab N]\n"
    "Checks a shard's header and size and prints its format, token count and token statistics\n"
    "(min/max id, distinct ids, documents = number of EOT ids (default 50256), most common ids).\n"
    "--vocab N: also fail (exit 1) if any id >= N. --tokenizer P sets --eot and --vocab to the\n"
    "tokenizer's (given explicitly they must agree with it).\n";

std::vector<uint32_t> parse_ids(const std::vector<std::string>& words, uint32_t vocab) {
    std::vector<uint32_t> ids;
    for (const std::string& w : words) {
        uint64_t v = parse_u64("id", w);
        if (v >= vocab) throw Error(strprintf("token id %llu is >= the vocabulary size %u", (unsigned long long)v, vocab));
        ids.push_back(uint32_t(v));
    }
    return ids;
}

}  // namespace

int cmd_shards(int argc, char** argv) {
    if (has_help(argc, argv)) {
        std::fputs(kShardsHelp, stdout);
        return 0;
    }
    return guarded("shards", [&] {
        Args a = parse_args(argc, argv,
                            {"--tokenizer", "--input", "--format", "--text-field", "--text-split", "--out-dir",
                             "--name", "--shard-tokens", "--val-tokens", "--val-docs", "--threads", "--quiet",
                             "--skip-bad-docs"},
                            {"--input"}, {"--quiet", "--skip-bad-docs"});
        if (!a.positional.empty()) throw std::invalid_argument("unexpected argument '" + a.positional[0] + "'");
        ShardsOptions o;
        o.tokenizer = one(a, "--tokenizer");
        if (a.flags.count("--input")) o.inputs = a.flags["--input"];
        o.format = one(a, "--format", "jsonl");
        o.text_field = one(a, "--text-field", "text");
        o.text_split = one(a, "--text-split", "file");
        o.out_dir = one(a, "--out-dir");
        o.name = one(a, "--name");
        if (o.tokenizer.empty()) throw std::invalid_argument("--tokenizer is required");
        if (o.inputs.empty()) throw std::invalid_argument("--input is required");
        if (o.out_dir.empty()) throw std::invalid_argument("--out-dir is required");
        if (o.name.empty()) throw std::invalid_argument("--name is required");
        if (a.flags.count("--shard-tokens")) o.shard_tokens = parse_u64("--shard-tokens", one(a, "--shard-tokens"));
        // the val shard is one shard: at most 2^31 - 1 tokens (checked here, not after writing them)
        if (a.flags.count("--val-tokens")) {
            const uint64_t v = parse_u64("--val-tokens", one(a, "--val-tokens"));
            if (v > 2147483647ull)
                throw std::invalid_argument("--val-tokens must be at most 2147483647 (one shard), got " +
                                            std::to_string(v));
            o.val_tokens = int64_t(v);
        }
        if (a.flags.count("--val-docs")) {
            const uint64_t v = parse_u64("--val-docs", one(a, "--val-docs"));
            if (v > uint64_t(INT64_MAX))
                throw std::invalid_argument("--val-docs is out of range: " + std::to_string(v));
            o.val_docs = int64_t(v);
        }
        if (o.val_docs >= 0 && o.val_tokens >= 0)
            throw std::invalid_argument("give either --val-tokens or --val-docs, not both");
        if (a.flags.count("--threads")) {
            const uint64_t t = parse_u64("--threads", one(a, "--threads"));
            if (t > uint64_t(kMaxThreads))
                throw std::invalid_argument("--threads must be between 0 (all cores) and " + std::to_string(kMaxThreads));
            o.threads = int(t);
        }
        o.progress = !a.flags.count("--quiet");
        o.skip_bad_docs = a.flags.count("--skip-bad-docs") > 0;
        ShardsSummary s = prepare_shards(o);
        std::printf("shards: %llu documents, %llu tokens (EOT included), %zu shards (%s tokens) in %s\n",
                    (unsigned long long)s.docs, (unsigned long long)s.tokens, s.shards.size(),
                    s.uint32_tokens ? "uint32" : "uint16", o.out_dir.c_str());
        std::printf("  val:   %llu documents, %llu tokens\n", (unsigned long long)s.val_docs,
                    (unsigned long long)s.val_tokens);
        std::printf("  train: %llu documents, %llu tokens\n", (unsigned long long)s.train_docs,
                    (unsigned long long)s.train_tokens);
        std::printf("  input: %.2f MB in %.2f s (%.2f MB/s)\n", s.input_bytes / 1e6, s.seconds,
                    s.seconds > 0 ? s.input_bytes / 1e6 / s.seconds : 0.0);
        if (o.skip_bad_docs) {
            std::printf("  skipped: %llu bad documents (--skip-bad-docs)\n", (unsigned long long)s.skipped_docs);
            for (const std::string& e : s.skipped_examples) std::printf("    %s\n", e.c_str());
            if (s.skipped_docs > s.skipped_examples.size())
                std::printf("    ... and %llu more\n", (unsigned long long)(s.skipped_docs - s.skipped_examples.size()));
        }
        for (const std::string& p : s.shards) std::printf("  %s\n", p.c_str());
        return 0;
    });
}

int cmd_encode(int argc, char** argv) {
    if (has_help(argc, argv)) {
        std::fputs(kEncodeHelp, stdout);
        return 0;
    }
    return guarded("encode", [&] {
        Args a = parse_args(argc, argv, {"--tokenizer", "--file", "--text", "--eot"}, {}, {"--eot"});
        if (!a.positional.empty()) throw std::invalid_argument("unexpected argument '" + a.positional[0] + "'");
        std::string tp = one(a, "--tokenizer");
        if (tp.empty()) throw std::invalid_argument("--tokenizer is required");
        if (a.flags.count("--file") && a.flags.count("--text"))
            throw std::invalid_argument("give --file or --text, not both");
        std::string text, source;
        if (a.flags.count("--file")) {
            source = one(a, "--file");
            text = read_file(source);
        } else if (a.flags.count("--text")) {
            source = "--text";
            text = one(a, "--text");
        } else {
            source = "<stdin>";
            std::ostringstream ss;
            ss << std::cin.rdbuf();
            text = ss.str();
        }
        Tokenizer tok = Tokenizer::load(tp);
        std::vector<uint32_t> ids = tok.encode(text, source, 0);
        if (a.flags.count("--eot")) ids.insert(ids.begin(), tok.eot_id());
        std::string line;
        for (size_t i = 0; i < ids.size(); i++) {
            if (i) line += ' ';
            line += std::to_string(ids[i]);
        }
        line += '\n';
        std::fwrite(line.data(), 1, line.size(), stdout);
        return 0;
    });
}

int cmd_decode(int argc, char** argv) {
    if (has_help(argc, argv)) {
        std::fputs(kDecodeHelp, stdout);
        return 0;
    }
    return guarded("decode", [&] {
        Args a = parse_args(argc, argv, {"--tokenizer"}, {}, {});
        std::string tp = one(a, "--tokenizer");
        if (tp.empty()) throw std::invalid_argument("--tokenizer is required");
        std::vector<std::string> words = a.positional;
        if (words.empty()) {
            std::string w;
            while (std::cin >> w) words.push_back(w);
        }
        Tokenizer tok = Tokenizer::load(tp);
        std::vector<uint32_t> ids;
        try {
            ids = parse_ids(words, tok.vocab_size());
        } catch (const std::invalid_argument& e) {
            throw Error(std::string("decode: ") + e.what());
        }
        std::string bytes = tok.decode(ids);
        std::fwrite(bytes.data(), 1, bytes.size(), stdout);
        if (::isatty(1)) std::fputc('\n', stdout);
        return 0;
    });
}

int cmd_info(int argc, char** argv) {
    if (has_help(argc, argv)) {
        std::fputs(kInfoHelp, stdout);
        return 0;
    }
    return guarded("info", [&] {
        Args a = parse_args(argc, argv, {"--eot", "--vocab", "--tokenizer"}, {}, {});
        if (a.positional.size() != 1) throw std::invalid_argument("expected exactly one shard file");
        const std::string path = a.positional[0];
        uint64_t eot = a.flags.count("--eot") ? parse_u64("--eot", one(a, "--eot")) : 50256;
        uint64_t vocab = a.flags.count("--vocab") ? parse_u64("--vocab", one(a, "--vocab")) : 0;
        if (a.flags.count("--tokenizer")) {
            const std::string tp = one(a, "--tokenizer");
            if (tp.empty()) throw std::invalid_argument("--tokenizer needs a value");
            const Tokenizer tok = Tokenizer::load(tp);
            if (a.flags.count("--eot") && eot != tok.eot_id())
                throw Error(strprintf("--eot %llu disagrees with --tokenizer %s (end-of-text id %u)",
                                      (unsigned long long)eot, tp.c_str(), tok.eot_id()));
            if (a.flags.count("--vocab") && vocab != tok.vocab_size())
                throw Error(strprintf("--vocab %llu disagrees with --tokenizer %s (%u ids)", (unsigned long long)vocab,
                                      tp.c_str(), tok.vocab_size()));
            eot = tok.eot_id();
            vocab = tok.vocab_size();
        }
        ShardInfo info = read_shard_info(path);
        std::printf("shard:    %s\n", path.c_str());
        std::printf("header:   magic %d, version %d (%s tokens)\n", info.magic, info.version,
                    info.token_bytes == 2 ? "uint16" : "uint32");
        std::printf("tokens:   %llu\n", (unsigned long long)info.num_tokens);
        std::printf("bytes:    %llu (= 1024 + %llu x %d)\n", (unsigned long long)info.file_size,
                    (unsigned long long)info.num_tokens, info.token_bytes);
        // statistics, streamed in blocks
        std::vector<uint64_t> dense(1 << 17, 0);  // counts of ids < 131072; rarer large ids in a map
        std::map<uint32_t, uint64_t> sparse;
        uint32_t mn = UINT32_MAX, mx = 0;
        uint64_t n_eot = 0, first_bad = UINT64_MAX, first_bad_id = 0;
        std::vector<uint32_t> buf;
        const uint64_t block = 1 << 20;
        for (uint64_t at = 0; at < info.num_tokens; at += block) {
            uint64_t m = std::min(block, info.num_tokens - at);
            buf.resize(size_t(m));
            read_shard_tokens(info, at, m, buf.data());
            for (uint64_t i = 0; i < m; i++) {
                uint32_t v = buf[i];
                mn = std::min(mn, v);
                mx = std::max(mx, v);
                if (v < dense.size()) dense[v]++;
                else sparse[v]++;
                if (v == eot) n_eot++;
                if (vocab && v >= vocab && first_bad == UINT64_MAX) {
                    first_bad = at + i;
                    first_bad_id = v;
                }
            }
        }
        if (info.num_tokens) {
            std::vector<std::pair<uint64_t, uint32_t>> top;  // (count, id)
            for (size_t v = 0; v < dense.size(); v++)
                if (dense[v]) top.push_back({dense[v], uint32_t(v)});
            for (auto& kv : sparse) top.push_back({kv.second, kv.first});
            std::printf("ids:      min %u, max %u, %zu distinct\n", mn, mx, top.size());
            std::printf("docs:     %llu (EOT id %llu)", (unsigned long long)n_eot, (unsigned long long)eot);
            if (n_eot) std::printf(", %.1f tokens per document", double(info.num_tokens) / double(n_eot));
            if (!n_eot && eot != 256 && mx <= 256 && info.num_tokens >= 4096)
                std::printf(" -- every id is <= 256: a byte-level shard? (--tokenizer bytes: EOT 256)");
            std::printf("\n");
            std::partial_sort(top.begin(), top.begin() + long(std::min<size_t>(5, top.size())), top.end(),
                              [](auto& x, auto& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
            std::printf("top ids: ");
            for (size_t i = 0; i < std::min<size_t>(5, top.size()); i++)
                std::printf(" %u (%.2f%%)", top[i].second, 100.0 * double(top[i].first) / double(info.num_tokens));
            std::printf("\n");
            std::vector<uint32_t> head(size_t(std::min<uint64_t>(12, info.num_tokens)));
            read_shard_tokens(info, 0, head.size(), head.data());
            std::printf("first:   ");
            for (uint32_t v : head) std::printf(" %u", v);
            std::printf("\n");
        }
        if (first_bad != UINT64_MAX)
            throw Error(strprintf("shard %s: token id %llu at index %llu is >= --vocab %llu", path.c_str(),
                                  (unsigned long long)first_bad_id, (unsigned long long)first_bad,
                                  (unsigned long long)vocab));
        return 0;
    });
}

}  // namespace ldm
