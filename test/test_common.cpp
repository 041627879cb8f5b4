#include "test/helpers.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/common.h"
#include "core/rendezvous.h"

TEST_CASE("write_file_atomic writes exactly and leaves no temp file", "[common]") {
    std::string d = scratch_dir("common");
    std::string path = d + "/a.bin";
    std::string payload = "hello\0world", big(3 << 20, 'x');
    for (size_t i = 0; i < big.size(); i++) big[i] = char((i * 2654435761u) >> 13);
    ldm::write_file_atomic(path, big.data(), big.size());
    REQUIRE(ldm::read_file(path) == big);
    ldm::write_file_atomic(path, payload.data(), payload.size());
    REQUIRE(ldm::read_file(path) == payload);
    REQUIRE(!ldm::file_exists(path + ".tmp." + std::to_string(::getpid())));
}

TEST_CASE("write_file_atomic into a missing directory throws and names the path", "[common]") {
    std::string d = scratch_dir("common2");
    try {
        ldm::write_file_atomic(d + "/nope/x.bin", "a", 1);
        FAIL("no exception");
    } catch (const ldm::Error& e) {
        REQUIRE(std::string(e.what()).find("nope/x.bin") != std::string::npos);
    }
}

TEST_CASE("read_file on a missing file throws", "[common]") {
    REQUIRE_THROWS_AS(ldm::read_file("/nonexistent/zzz"), ldm::Error);
}

TEST_CASE("strprintf formats", "[common]") {
    REQUIRE(ldm::strprintf("%d-%s-%.2f", 7, "ab", 1.5) == "7-ab-1.50");
    REQUIRE(ldm::strprintf("%s", std::string(5000, 'q').c_str()).size() == 5000);
}

TEST_CASE("the shared data directory is found", "[common]") {
    std::string d = data_dir_or_skip("data dir");
    if (d.empty()) return;
    REQUIRE(ldm::file_exists(d + "/gpt2_tokenizer/vocab.bpe"));
}

TEST_CASE("mkdir_p and prepare_output_dir: nested dirs made, a file in the way refused", "[common]") {
    const std::string d = scratch_dir("common_outdir");
    ldm::prepare_output_dir(d + "/a/b/c", "--out-dir");
    CHECK(ldm::file_exists(d + "/a/b/c"));
    ldm::mkdir_p(d + "/a/b/c");  // existing: fine
    ldm::write_file_atomic(d + "/f", "x", 1);
    CHECK_THROWS_WITH(ldm::prepare_output_dir(d + "/f", "--out-dir"), Catch::Contains("--out-dir: cannot write into") &&
                                                                      Catch::Contains("/f"));
    CHECK_THROWS_WITH(ldm::prepare_output_dir(d + "/f/sub", "--out"), Catch::Contains("--out: cannot write into"));
    CHECK_THROWS_AS(ldm::mkdir_p(d + "/f"), ldm::Error);
    // the probe file is removed again
    CHECK(std::system(("test -z \"$(ls -A '" + d + "/a/b/c')\"").c_str()) == 0);
}

TEST_CASE("dirname_of and basename_of follow POSIX dirname/basename", "[common]") {
    // Expected values are those of POSIX dirname(1)/basename(1).
    const struct { const char *path, *dir, *base; } cases[] = {
        {"a/b", "a", "b"},       {"b", ".", "b"},           {"/b", "/", "b"},
        {"a/b/", "a", "b"},      {"a//b", "a", "b"},        {"/", "/", "/"},
        {"//a//", "/", "a"},     {"x/y/z.bin", "x/y", "z.bin"}, {"./c", ".", "c"},
    };
    for (const auto& c : cases) {
        INFO(c.path);
        CHECK(ldm::dirname_of(c.path) == c.dir);
        CHECK(ldm::basename_of(c.path) == c.base);
    }
}

TEST_CASE("median: middle value, the mean of the two middle ones for an even count", "[common]") {
    // random order (the input is not sorted): {0.5, 1.5, ..., 10.5}; odd and even counts
    std::vector<double> v;
    for (int i = 0; i < 11; i++) v.push_back(i + 0.5);
    std::mt19937 rng(7);
    std::shuffle(v.begin(), v.end(), rng);
    CHECK(ldm::median(v) == 5.5);
    v.erase(std::find(v.begin(), v.end(), 10.5));  // {0.5 .. 9.5}: (4.5 + 5.5) / 2
    CHECK(ldm::median(v) == 5.0);
    CHECK(ldm::median({3.25}) == 3.25);
    CHECK(ldm::median({4.0, -2.0}) == 1.0);
    CHECK(ldm::median({2.0, 2.0, 9.0, 2.0}) == 2.0);  // ties
    CHECK_THROWS_AS(ldm::median({}), ldm::Error);
}

TEST_CASE("rendezvous file: read only when written by this launch", "[common][rendezvous]") {
    // A 128-byte payload like an NCCL unique id, random bytes including NUL and '\n'.
    std::mt19937 rng(7);
    std::string id(128, '\0'), got(128, '\0');
    for (char& ch : id) ch = char(rng() & 0xff);
    id[5] = '\n';
    id[9] = '\0';
    const std::string b = ldm::rendezvous_encode(id.data(), id.size(), 4, "slurm:812.0");
    REQUIRE(b.size() > id.size());
    std::string why;
    REQUIRE(ldm::rendezvous_decode(b, id.size(), 4, "slurm:812.0", &got[0], &why));
    CHECK(got == id);
    // an earlier job at the same path, or another world size: waited past, named
    got.assign(128, 'z');
    CHECK_FALSE(ldm::rendezvous_decode(b, id.size(), 4, "slurm:813.0", &got[0], &why));
    CHECK(why.find("another launch") != std::string::npos);
    CHECK(why.find("slurm:812.0") != std::string::npos);
    CHECK_FALSE(ldm::rendezvous_decode(b, id.size(), 8, "slurm:812.0", &got[0], &why));
    CHECK(got == std::string(128, 'z'));  // nothing copied from a file that was refused
    // the bare 128-byte file of older builds, a cut payload, an empty file
    CHECK_FALSE(ldm::rendezvous_decode(id, id.size(), 4, "slurm:812.0", &got[0], &why));
    CHECK(why.find("not a rendezvous file") != std::string::npos);
    CHECK_FALSE(ldm::rendezvous_decode(b.substr(0, b.size() - 1), id.size(), 4, "slurm:812.0", &got[0], &why));
    CHECK(why.find("127 bytes") != std::string::npos);
    CHECK_FALSE(ldm::rendezvous_decode("", id.size(), 4, "", &got[0], &why));
    // no launch identity in the environment: the world size alone is compared
    const std::string b0 = ldm::rendezvous_encode(id.data(), id.size(), 2, "");
    REQUIRE(ldm::rendezvous_decode(b0, id.size(), 2, "", &got[0], &why));
    CHECK(got == id);
}

TEST_CASE("rendezvous launch tag from Slurm or torchrun", "[common][rendezvous]") {
    struct Env {  // sets a variable for the test and restores what was there
        std::string name;
        bool had;
        std::string old;
        Env(const char* n, const char* v) : name(n), had(std::getenv(n) != nullptr), old(had ? std::getenv(n) : "") {
            if (v)
                ::setenv(n, v, 1);
            else
                ::unsetenv(n);
        }
        ~Env() {
            if (had)
                ::setenv(name.c_str(), old.c_str(), 1);
            else
                ::unsetenv(name.c_str());
        }
    };
    {
        Env a("SLURM_JOB_ID", "4711"), b("SLURM_STEP_ID", "3"), c("TORCHELASTIC_RUN_ID", "abc"),
            r("SLURM_RESTART_COUNT", nullptr);
        CHECK(ldm::rendezvous_launch_tag() == "slurm:4711.3.0");
        Env r2("SLURM_RESTART_COUNT", "2");  // a requeued job: same id, steps from 0 again
        CHECK(ldm::rendezvous_launch_tag() == "slurm:4711.3.2");
    }
    {
        Env a("SLURM_JOB_ID", nullptr), b("SLURM_STEP_ID", nullptr), c("TORCHELASTIC_RUN_ID", "abc"),
            r("TORCHELASTIC_RESTART_COUNT", "1");
        CHECK(ldm::rendezvous_launch_tag() == "torchrun:abc.1");
    }
    {
        Env a("SLURM_JOB_ID", nullptr), b("SLURM_STEP_ID", nullptr), c("TORCHELASTIC_RUN_ID", nullptr);
        CHECK(ldm::rendezvous_launch_tag().empty());
        Env d("TORCHELASTIC_RUN_ID", "none");  // torchrun's default: every job has it
        CHECK(ldm::rendezvous_launch_tag().empty());
    }
}
