// data/prep_eval.h — eval-binary subcommands of the data tool (owner: evalprep).
//
// LINKAGE: the three cmd_* functions are ordinary C++ functions in the GLOBAL namespace (not in
// ldm::), declared exactly as in the agreed interface. The data tool's main (data/ldm_data.cpp)
// dispatches
//   ldm_data lambada   ...  -> cmd_lambada(argc, argv)
//   ldm_data wikitext  ...  -> cmd_wikitext(argc, argv)
//   ldm_data hellaswag ...  -> cmd_hellaswag(argc, argv)
// with argv[0] = the subcommand name ("lambada", ...) and argv[1..argc-1] its flags.
// Each parses its own flags (--tokenizer <bytes|dir|tokenizer.json> --input FILE --out FILE, --help),
// prints its own --help and a summary, writes the output atomically, and returns the exit
// status (0 ok; 1 on error after printing "error: ..." to stderr; 2 on bad usage). They catch
// ldm::Error themselves, so the caller may simply `return cmd_xxx(argc, argv);`.
// Spec: ../shared/spec/evals.md; file formats: core/evalfile.h and doc/formats.md "Eval binaries".
//
// The text-processing pieces are exposed in namespace ldm::evalprep for the tests.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer.h"

int cmd_lambada(int argc, char** argv);
int cmd_wikitext(int argc, char** argv);
int cmd_hellaswag(int argc, char** argv);

namespace ldm {
class Tokenizer;

namespace evalprep {

// ---- Python str semantics on UTF-8 text (Python 3.8+; the harness runs on CPython) ----------
// Throws ldm::Error "<source>: invalid UTF-8 at byte N" (strict, like Python's utf-8 decoder:
// no overlongs, no surrogates, nothing above U+10FFFF).
void check_utf8(std::string_view s, const std::string& source);
// Python's str.isspace() == the `\s` of `re` on str patterns: \t\n\v\f\r, U+001C..U+001F, space,
// U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool py_isspace(uint32_t cp);
std::string py_strip(std::string_view s);    // str.strip()
std::string py_rstrip(std::string_view s);   // str.rstrip()
size_t count_code_points(std::string_view s);  // len(str) of valid UTF-8
// len(re.split(r"\s+", s)): 1 + the number of maximal runs of py_isspace characters (so leading
// and trailing whitespace each add an empty string, and "" gives 1).
uint64_t py_split_ws_count(std::string_view s);
// Python text-mode reading with universal newlines: "\r\n" -> "\n", then lone "\r" -> "\n".
std::string universal_newlines(std::string_view s);
// str.capitalize() (3.8+): first character to title case, the rest to lower case (full lower
// mapping of U+0130 and the final-sigma rule included; other characters use the simple
// Unicode mappings of utf8proc).
std::string py_capitalize(std::string_view s);

// ---- WikiText-2 (evals.md "WikiText-2") ------------------------------------------------------
// Splits the text of wiki.test.raw (after universal_newlines) into pages exactly as the
// harness's EleutherAI/wikitext_document_level builder does: split on "\n"; a line starts a new
// page when, after replacing "= = =" by "===" and "= =" by "==" and str.strip(), it starts with
// "= " and ends with " ="; page = its lines joined by "\n" (title included; the last page keeps
// the "" after the file's final "\n", i.e. ends with "\n"). Whitespace-only pages are skipped.
std::vector<std::string> wikitext_split_pages(std::string_view text);
// lm-eval-harness `wikitext_detokenizer`, byte for byte (PCRE2 with Python `re` semantics; the
// `/' [0-9]/` rule, which never matches real text, is kept).
std::string wikitext_detokenize(std::string_view page);

// ---- LAMBADA (evals.md "LAMBADA") ----------------------------------------------------------
struct LambadaText {
  std::string context;  // text[:i], i = index of the LAST ' '
  std::string target;   // " " + text[i+1:]
};
// ldm::Error naming `where` when the text has no ASCII space.
LambadaText lambada_split(std::string_view text, const std::string& where);
// Parses lambada_test.jsonl (one JSON object per line with string field "text"; empty lines
// skipped). ldm::Error "<file>:<line>: ..." on bad JSON, missing/non-string field, no space.
std::vector<LambadaText> parse_lambada_jsonl(const std::string& data, const std::string& source);

// ---- HellaSwag (evals.md "Zero-shot multiple choice") --------------------------------------
struct HellaSwagText {
  std::string context;                 // the query (what precedes " " + choice)
  std::array<std::string, 4> endings;  // choices, without the leading space
  uint32_t label = 0;                  // 0..3
};
// lm-eval-harness hellaswag `preprocess`: strip; " [title]" -> ". "; remove `\[.*?\]`; "  " -> " ".
std::string hellaswag_preprocess(std::string_view text);
// Original rowanz hellaswag_val.jsonl: query = preprocess(activity_label + ": " + ctx_a + " " +
// capitalize(ctx_b)), choices = preprocess(ending). Label: int or digit string, must be 0..3.
std::vector<HellaSwagText> parse_hellaswag_jsonl(const std::string& data, const std::string& source);
// klosax 6-line reformatted copy: context line, label line, 4 ending lines, taken verbatim.
std::vector<HellaSwagText> parse_hellaswag_txt(const std::string& data, const std::string& source);

// ---- tokenization helpers ------------------------------------------------------------------
// lm-eval-harness `_encode_pair`: trailing whitespace of `context` (str.rstrip) moves to the
// front of the continuation; ctx = tok(context), cont = tok(context + continuation)[len(ctx):].
// An empty context becomes [eot] and cont = tok(continuation) (the harness's rule).
// `check_prefix`: ldm::Error (naming `where`) unless tok(context) is a prefix of the whole.
void encode_pair(const Tokenizer& tok, std::string_view context, std::string_view continuation,
                 std::vector<uint32_t>& ctx, std::vector<uint32_t>& cont, const std::string& where,
                 bool check_prefix);

// Reads a file; if it starts with the bzip2 magic "BZh" it is decompressed (all concatenated
// streams) with libbz2. ldm::Error naming the file on I/O or bzip2 errors.
std::string read_maybe_bz2(const std::string& path);

// The binaries' tokenizer fingerprint (core/tokenizer.h), under the name the tests use.
using ldm::tokenizer_fingerprint;

}  // namespace evalprep
}  // namespace ldm
