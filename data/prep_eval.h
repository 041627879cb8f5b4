// data/prep_eval.h — eval-binary subcommands of the data tool (owner: evalprep).
//
// LINKAGE: these are ordinary C++ functions in the GLOBAL namespace (not in ldm::), declared
// exactly as in the agreed interface. The data tool's main (data/ldm_data.cpp) dispatches
//   ldm_data lambada   ...  -> cmd_lambada(argc, argv)
//   ldm_data wikitext  ...  -> cmd_wikitext(argc, argv)
//   ldm_data hellaswag ...  -> cmd_hellaswag(argc, argv)
// with argv[0] = the subcommand name ("lambada", ...) and argv[1..argc-1] its flags.
// Each parses its own flags (--tokenizer <dir|tokenizer.json> --input FILE --out FILE, --help),
// prints its own --help and a summary, writes the output atomically, and returns the exit
// status (0 ok, 1 on error after printing "error: ..." to stderr; 2 on bad usage). They catch
// ldm::Error themselves, so the caller may simply `return cmd_xxx(argc, argv);`.
// Spec: ../shared/spec/evals.md; file formats: doc/formats.md "Eval binaries".
#pragma once

int cmd_lambada(int argc, char** argv);
int cmd_wikitext(int argc, char** argv);
int cmd_hellaswag(int argc, char** argv);
