#include "core/cli.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/common.h"

namespace ldm {

int64_t parse_int(const std::string& s, const std::string& flag) {
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE)
        throw Error(flag + ": expected an integer, got '" + s + "'");
    return v;
}

double parse_double(const std::string& s, const std::string& flag) {
    errno = 0;
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || errno == ERANGE)
        throw Error(flag + ": expected a number, got '" + s + "'");
    // no flag takes an infinite or NaN value (inf would pass a "> 0" check, e.g. --adam-eps inf)
    if (!std::isfinite(v)) throw Error(flag + ": expected a finite number, got '" + s + "'");
    return v;
}

static std::string fmt_double(double v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

ArgParser::ArgParser(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void ArgParser::add_flag(const std::string& names, const std::string& type, const std::string& def,
                         const std::string& help, bool is_switch,
                         std::function<void(const std::string&, const std::string&)> set) {
    Flag f;
    std::stringstream ss(names);
    std::string n;
    while (std::getline(ss, n, ',')) {
        if (n.empty() || n[0] != '-') throw Error("ArgParser: bad flag spelling '" + n + "'");
        f.names.push_back(n);
    }
    f.type = type;
    f.def = def;
    f.help = help;
    f.is_switch = is_switch;
    f.set = std::move(set);
    flags_.push_back(std::move(f));
}

void ArgParser::section(const std::string& title) { sections_.emplace_back(flags_.size(), title); }

void ArgParser::add(const std::string& names, std::string* dst, const std::string& help) {
    add_flag(names, "STR", dst->empty() ? "\"\"" : *dst, help, false,
             [dst](const std::string&, const std::string& v) { *dst = v; });
}
void ArgParser::add(const std::string& names, int* dst, const std::string& help) {
    add_flag(names, "INT", std::to_string(*dst), help, false, [dst](const std::string& fl, const std::string& v) {
        int64_t x = parse_int(v, fl);
        if (x < INT_MIN || x > INT_MAX) throw Error(fl + ": value out of range: " + v);
        *dst = int(x);
    });
}
void ArgParser::add(const std::string& names, int64_t* dst, const std::string& help) {
    add_flag(names, "INT", std::to_string(*dst), help, false,
             [dst](const std::string& fl, const std::string& v) { *dst = parse_int(v, fl); });
}
void ArgParser::add(const std::string& names, double* dst, const std::string& help) {
    add_flag(names, "NUM", fmt_double(*dst), help, false,
             [dst](const std::string& fl, const std::string& v) { *dst = parse_double(v, fl); });
}
void ArgParser::add(const std::string& names, bool* dst, const std::string& help) {
    add_flag(names, "", *dst ? "on" : "off", help, true, [dst](const std::string& fl, const std::string& v) {
        if (v == "" || v == "1" || v == "true") *dst = true;
        else if (v == "0" || v == "false") *dst = false;
        else throw Error(fl + ": expected true|false, got '" + v + "'");
    });
}

std::string ArgParser::help() const {
    std::string out = "usage: " + program_ + " [flags]\n" + description_ + "\n";
    size_t si = 0;
    for (size_t i = 0; i < flags_.size(); i++) {
        while (si < sections_.size() && sections_[si].first == i) out += "\n" + sections_[si++].second + ":\n";
        const Flag& f = flags_[i];
        std::string left = "  ";
        for (size_t k = 0; k < f.names.size(); k++) left += (k ? ", " : "") + f.names[k];
        if (!f.type.empty()) left += " " + f.type;
        if (left.size() < 30) left.resize(30, ' ');
        else left += "\n" + std::string(30, ' ');
        out += left + f.help + " (default: " + f.def + ")\n";
    }
    out += "  -h, --help                  print this help and exit\n";
    return out;
}

namespace {
// Levenshtein distance of a and b (short strings: flag names).
size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); j++) row[j] = j;
    for (size_t i = 1; i <= a.size(); i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); j++) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
            diag = up;
        }
    }
    return row[b.size()];
}
}  // namespace

std::string ArgParser::suggest(const std::string& name) const {
    // the one flag `name` begins (--warmup -> --warmup-steps), else the nearest within 2 edits
    std::string prefix_of, nearest;
    int prefixes = 0;
    size_t best = 3;
    for (const Flag& f : flags_)
        for (const auto& n : f.names) {
            if (name.size() >= 3 && n.size() > name.size() && n.compare(0, name.size(), name) == 0) {
                prefix_of = n;
                prefixes++;
            }
            const size_t d = edit_distance(name, n);
            if (d < best) best = d, nearest = n;
        }
    return prefixes == 1 ? prefix_of : nearest;
}

bool ArgParser::parse(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(help().c_str(), stdout);
            return false;
        }
        if (a.size() < 2 || a[0] != '-') {
            // after a flag's value: likely a pattern the shell expanded into several paths
            const bool after_value = i >= 2 && argv[i - 1][0] != '-';
            throw Error("unexpected argument '" + a + "' (flags start with -; see --help)" +
                        (after_value ? std::string("; if the shell expanded a pattern such as dir/*.bin into several "
                                                   "files, quote it: 'dir/*.bin'")
                                     : std::string()));
        }
        std::string name = a, value;
        bool has_value = false;
        size_t eq = a.find('=');
        if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
            name = a.substr(0, eq);
            value = a.substr(eq + 1);
            has_value = true;
        }
        const Flag* found = nullptr;
        for (const Flag& f : flags_)
            for (const auto& n : f.names)
                if (n == name) found = &f;
        if (!found) {
            const std::string near = suggest(name);
            throw Error("unknown flag '" + name + "' (" + (near.empty() ? "" : "did you mean " + near + "? ") +
                        "see --help)");
        }
        if (!found->is_switch && !has_value) {
            if (i + 1 >= argc) throw Error(name + ": missing value");
            value = argv[++i];
        }
        found->set(name, value);
        for (const auto& n : found->names) seen_.insert(n);
    }
    return true;
}

bool ArgParser::was_set(const std::string& name) const { return seen_.count(name) > 0; }

std::vector<std::string> ArgParser::flag_names() const {
    std::vector<std::string> out;
    for (const Flag& f : flags_) out.push_back(f.names.back());
    return out;
}

}  // namespace ldm
