// data/ldm_data.cpp — the data tool: raw text -> token shards and eval binaries (issue #2 items
// 5 and 6). Each subcommand lives in a library function so tests can call it directly:
//   shards, encode, decode, info      -> data/prep_shards.h (owner: data)
//   lambada, wikitext, hellaswag      -> data/prep_eval.h   (owner: evalprep)
// Exit status: 0 ok, 1 error ("error: ..." on stderr), 2 usage error.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "data/prep_eval.h"
#include "data/prep_shards.h"

namespace {

const char* kHelp =
    "usage: ldm_data <subcommand> [flags]   (ldm_data <subcommand> --help for its flags)\n"
    "\n"
    "Token shards (doc/formats.md \"Token shards\", \"Data tool\"):\n"
    "  shards     jsonl or plain-text documents -> NAME_val_000000.bin, NAME_train_000001.bin, ...\n"
    "  info       check a shard and print its header and token statistics\n"
    "  encode     print the token ids of a text\n"
    "  decode     print the text of token ids\n"
    "Eval binaries (doc/formats.md \"Eval binaries\"):\n"
    "  lambada    LAMBADA (OpenAI lambada_test.jsonl)\n"
    "  wikitext   WikiText-2 raw (wiki.test.raw)\n"
    "  hellaswag  HellaSwag (hellaswag_val.jsonl or the preprocessed copy)\n"
    "\n"
    "--tokenizer (every subcommand but info, where it is optional) takes one of (doc/tokenizer.md):\n"
    "  bytes                 byte tokenizer: id = UTF-8 byte value, end-of-text 256 (257 ids)\n"
    "  DIR                   GPT-2: a directory with encoder.json + vocab.bpe (50257 ids)\n"
    "  FILE.json             a Hugging Face byte-level BPE tokenizer.json (GPT-NeoX-20B, OLMo)\n"
    "\n"
    "example:\n"
    "  ldm_data shards --tokenizer $LDM_DATA_DIR/gpt2_tokenizer \\\n"
    "      --input $LDM_DATA_DIR/fineweb_edu_sample/fineweb_edu_sample.jsonl \\\n"
    "      --out-dir data/fineweb_sample --name fineweb --val-docs 10 --shard-tokens 50000\n";

}  // namespace

int main(int argc, char** argv) {
    try {
        if (argc < 2) {
            std::fputs(kHelp, stderr);
            return 2;
        }
        std::string cmd = argv[1];
        int sub_argc = argc - 1;
        char** sub_argv = argv + 1;
        if (cmd == "--help" || cmd == "-h" || cmd == "help") {
            std::fputs(kHelp, stdout);
            return 0;
        }
        if (cmd == "shards") return ldm::cmd_shards(sub_argc, sub_argv);
        if (cmd == "encode") return ldm::cmd_encode(sub_argc, sub_argv);
        if (cmd == "decode") return ldm::cmd_decode(sub_argc, sub_argv);
        if (cmd == "info") return ldm::cmd_info(sub_argc, sub_argv);
        if (cmd == "lambada") return cmd_lambada(sub_argc, sub_argv);
        if (cmd == "wikitext") return cmd_wikitext(sub_argc, sub_argv);
        if (cmd == "hellaswag") return cmd_hellaswag(sub_argc, sub_argv);
        std::fprintf(stderr, "error: unknown subcommand '%s'\n\n%s", cmd.c_str(), kHelp);
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
