// core/cli.h — a small command-line flag parser shared by the trainers (CPU and GPU).
//
// Flags are registered with a pointer to the variable that receives the value; the variable's
// value at registration time is the default shown by --help. Accepted forms: `--name value`,
// `--name=value`, `-B value` (short alias), and bare `--name` for boolean flags (also
// `--name=true|false|1|0`). Unknown flags, missing values and unparsable numbers throw
// ldm::Error naming the flag; --help / -h makes parse() return false after printing help().
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace ldm {

class ArgParser {
 public:
    ArgParser(std::string program, std::string description);

    // `names`: comma-separated spellings, e.g. "-B,--batch-size" or "--lr". `help`: one line.
    void add(const std::string& names, std::string* dst, const std::string& help);
    void add(const std::string& names, int* dst, const std::string& help);
    void add(const std::string& names, int64_t* dst, const std::string& help);
    void add(const std::string& names, double* dst, const std::string& help);
    void add(const std::string& names, bool* dst, const std::string& help);  // a switch
    // A section heading shown in --help between groups of flags.
    void section(const std::string& title);

    // Parses argv[1..argc). Returns false when --help was requested (help already printed to
    // stdout); throws ldm::Error on bad input. Positional arguments are an error.
    bool parse(int argc, char** argv);
    std::string help() const;
    // The flag a mistyped `name` most likely meant: the only flag it is a prefix of (3+
    // characters), else the nearest name within 2 edits; "" when none.
    std::string suggest(const std::string& name) const;
    // Whether the flag (any of its spellings, e.g. "--seq-len") appeared on the command line.
    bool was_set(const std::string& name) const;
    // The flags registered so far, one spelling each (the last of `names`), in order.
    std::vector<std::string> flag_names() const;

 private:
    struct Flag {
        std::vector<std::string> names;
        std::string help, def, type;
        bool is_switch = false;
        std::function<void(const std::string&, const std::string&)> set;  // (spelling, value)
    };
    void add_flag(const std::string& names, const std::string& type, const std::string& def,
                  const std::string& help, bool is_switch,
                  std::function<void(const std::string&, const std::string&)> set);
    std::string program_, description_;
    std::vector<Flag> flags_;
    std::vector<std::pair<size_t, std::string>> sections_;  // (index of next flag, title)
    std::set<std::string> seen_;  // canonical (last) names of flags that were set
};

// Strict number parsing for flags: the whole string must be a number in range (parse_double: a
// finite one, no inf or nan); else ldm::Error("<flag>: expected an integer, got '<s>'" / "...
// a number ..." / "... a finite number ...").
int64_t parse_int(const std::string& s, const std::string& flag);
double parse_double(const std::string& s, const std::string& flag);

}  // namespace ldm
