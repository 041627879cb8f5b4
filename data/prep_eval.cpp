// data/prep_eval.cpp — eval-binary subcommands (work in progress; see data/prep_eval.h).
#include "data/prep_eval.h"

#include <cstdio>

static int not_built(const char* name) {
    std::fprintf(stderr, "error: %s: not built yet\n", name);
    return 1;
}

int cmd_lambada(int, char**) { return not_built("lambada"); }
int cmd_wikitext(int, char**) { return not_built("wikitext"); }
int cmd_hellaswag(int, char**) { return not_built("hellaswag"); }
