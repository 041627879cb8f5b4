// Helpers for tests: locating the shared data and skipping visibly when it is absent.
#pragma once
#include <catch2/catch.hpp>

#include <string>

#include "core/common.h"

// Returns the data directory, or "" after printing a visible SKIP message (the caller then
// returns early). Here the data exists, so in this environment these tests always run.
inline std::string data_dir_or_skip(const char* what) {
    std::string d = ldm::find_data_dir();
    if (d.empty()) {
        WARN("SKIP " << what << ": no data directory ($LDM_DATA_DIR or ../shared/data)");
    }
    return d;
}

// A scratch directory under build/test_tmp/<name>, emptied on creation.
std::string scratch_dir(const std::string& name);
