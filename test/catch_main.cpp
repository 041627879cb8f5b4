// Catch2 v2 runner shared by every test binary in test/. Besides Catch2's own summary it
// prints one machine-readable line "LDM_TEST_TOTALS <passed> <failed> <skipped>" (test cases)
// that scripts/run_tests.sh adds up into the suite's closing line, and one line
// "LDM_TEST_FAILED <test case name>" per failed test case, which it repeats at the suite's end.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

void end_scratch_dirs(bool passed);         // test/helpers.cpp
void end_binary_scratch_dirs(bool passed);  // test/helpers.cpp
void set_test_binary_name(const char* argv0);  // test/helpers.cpp

namespace {
struct TotalsListener : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    // Scratch directories of a passed test case are deleted (see register_scratch_dir).
    void testCaseEnded(Catch::TestCaseStats const& s) override {
        const bool ok = s.totals.assertions.failed == 0 && s.totals.testCases.failed == 0;
        end_scratch_dirs(ok);
        if (!ok) {
            std::printf("LDM_TEST_FAILED %s\n", s.testInfo.name.c_str());
            std::fflush(stdout);
        }
        TestEventListenerBase::testCaseEnded(s);
    }
    void testRunEnded(Catch::TestRunStats const& s) override {
        end_binary_scratch_dirs(s.totals.testCases.failed == 0 && s.totals.assertions.failed == 0);
        std::printf("LDM_TEST_TOTALS %llu %llu\n",
                    (unsigned long long)s.totals.testCases.passed,
                    (unsigned long long)(s.totals.testCases.failed + s.totals.testCases.failedButOk));
        std::fflush(stdout);
    }
};
}  // namespace
CATCH_REGISTER_LISTENER(TotalsListener)

int main(int argc, char* argv[]) {
    set_test_binary_name(argc > 0 ? argv[0] : "test");
    return Catch::Session().run(argc, argv);
}
