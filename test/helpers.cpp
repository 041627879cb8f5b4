#include "test/helpers.h"

#include <cstdlib>

std::string scratch_dir(const std::string& name) {
#ifdef LDM_SOURCE_DIR
    std::string base = std::string(LDM_SOURCE_DIR) + "/build/test_tmp/";
#else
    std::string base = "build/test_tmp/";
#endif
    std::string d = base + name;
    std::string cmd = "rm -rf '" + d + "' && mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) throw ldm::Error("cannot create scratch dir " + d);
    return d;
}
