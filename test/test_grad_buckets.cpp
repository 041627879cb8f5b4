// Tests of the GPU trainers' gradient-bucket plan and ZeRO-1 piece split (core/dist.h
// plan_grad_buckets, split_by_owner, padded_shard_range; issue #10 item 3). Pure host code, so
// it runs without a GPU: every element in exactly one bucket, buckets in backward order and never
// reduced before their gradients are final, pieces inside their owner's shard, uneven shards,
// world sizes 1, 2, 3, 8 (and 64), counts typed as dist::Elems.
#include <catch2/catch.hpp>

#include <algorithm>
#include <type_traits>

#include "core/config.h"
#include "core/dist.h"

using namespace ldm;

namespace {

// Counts are element counts in the strong type, never raw integers (or bytes).
static_assert(std::is_same<decltype(dist::GradBucket::count), dist::Elems>::value, "bucket count is Elems");
static_assert(std::is_same<decltype(dist::ReducePiece::count), dist::Elems>::value, "piece count is Elems");
static_assert(!std::is_convertible<int64_t, dist::Elems>::value, "Elems is explicit");

ModelConfig config(const std::string& preset, const std::string& scheme) {
    ModelConfig c = preset_config(preset, 50257);
    c.scheme = scheme;
    c.ldm_dk = 4;
    c.validate();
    return c;
}

// Every invariant of a plan over `specs`.
void check_plan(const std::vector<ParamSpec>& specs, int L, int64_t min_elems) {
    const std::vector<dist::GradBucket> bk = dist::plan_grad_buckets(specs, L, min_elems);
    int64_t n = 0;
    for (const auto& s : specs) n += s.numel;
    // backward order: stages non-decreasing
    for (size_t i = 1; i < bk.size(); i++) REQUIRE(bk[i - 1].stage <= bk[i].stage);
    // a partition of [0, n)
    std::vector<dist::GradBucket> by_off = bk;
    std::sort(by_off.begin(), by_off.end(), [](const dist::GradBucket& a, const dist::GradBucket& b) { return a.offset < b.offset; });
    int64_t end = 0;
    for (const auto& b : by_off) {
        REQUIRE(b.count.n > 0);
        REQUIRE(b.offset == end);
        end += b.count.n;
    }
    REQUIRE(end == n);
    // no bucket is reduced before all its gradients are final; without merging, exactly then
    for (const auto& s : specs) {
        if (s.numel == 0) continue;
        const int st = dist::grad_stage_of(s.name, L);
        int found = 0;
        for (const auto& b : bk)
            if (s.offset >= b.offset && s.offset + s.numel <= b.offset + b.count.n) {
                found++;
                CHECK(b.stage >= st);
                if (min_elems == 0) CHECK(b.stage == st);
            }
        INFO(s.name);
        REQUIRE(found == 1);  // a tensor never straddles two buckets
    }
    if (min_elems == 0) {  // one bucket per run of equal stage: L blocks + head + wte (+ scheme)
        CHECK(bk.size() >= size_t(L) + 2);
    }
    // ZeRO-1 pieces for several world sizes
    for (int W : {1, 2, 3, 8, 64}) {
        INFO("world " << W);
        const int64_t S = dist::padded_shard_size(n, W);
        REQUIRE(S % 64 == 0);
        REQUIRE(S * W >= n);
        std::vector<int64_t> per_rank(size_t(W), 0);
        std::vector<int64_t> covered;
        for (const auto& b : bk) {
            const std::vector<dist::ReducePiece> ps = dist::split_by_owner(b.offset, b.count, n, W);
            int64_t at = b.offset;
            int last_root = -1;
            for (const auto& p : ps) {
                REQUIRE(p.count.n > 0);
                REQUIRE(p.offset == at);  // in order, no gap, no overlap
                REQUIRE(p.root > last_root);
                last_root = p.root;
                const dist::Shard own = dist::padded_shard_range(n, W, p.root);
                REQUIRE(p.offset >= own.offset);
                REQUIRE(p.offset + p.count.n <= own.offset + own.count);
                per_rank[size_t(p.root)] += p.count.n;
                at += p.count.n;
            }
            REQUIRE(at == b.offset + b.count.n);
        }
        // the union of the pieces reduced to rank r is exactly r's shard
        int64_t total = 0;
        for (int r = 0; r < W; r++) {
            CHECK(per_rank[size_t(r)] == dist::padded_shard_range(n, W, r).count);
            total += per_rank[size_t(r)];
        }
        CHECK(total == n);
    }
}

}  // namespace

TEST_CASE("grad buckets: stages of the parameter names", "[dist][buckets]") {
    CHECK(dist::grad_stage_of("lm_head", 4) == 0);
    CHECK(dist::grad_stage_of("final_norm.w", 4) == 0);
    CHECK(dist::grad_stage_of("blocks.3.attn.wq", 4) == 1);
    CHECK(dist::grad_stage_of("blocks.0.mlp.w2", 4) == 4);
    CHECK(dist::grad_stage_of("wte", 4) == 5);
    CHECK(dist::grad_stage_of("scheme.ldm.theta", 4) == 5);
    CHECK_THROWS_AS(dist::grad_stage_of("blocks.4.attn.wq", 4), Error);
    CHECK_THROWS_AS(dist::grad_stage_of("blocks.x.attn.wq", 4), Error);
    CHECK_THROWS_AS(dist::grad_stage_of("nonsense", 4), Error);
    CHECK(dist::grad_stage_block(2, 4) == dist::grad_stage_of("blocks.2.attn_norm.w", 4));
    CHECK(dist::grad_stage_end(4) == 5);
}

TEST_CASE("grad buckets: plans over the presets and schemes cover every element once, in backward order", "[dist][buckets]") {
    for (const char* preset : {"tiny", "small", "llama-400m", "qwen-1.5b"})
        for (const char* scheme : {"preln", "mhc", "attnres-block", "ldm"}) {
            ModelConfig c = config(preset, scheme);
            INFO(preset << " " << scheme << " tied " << c.tied);
            const std::vector<ParamSpec> specs = param_specs(c);
            for (int64_t m : {int64_t(0), int64_t(1) << 16, int64_t(1) << 22, int64_t(1) << 40}) {
                INFO("min_elems " << m);
                check_plan(specs, c.n_layer, m);
            }
        }
}

TEST_CASE("grad buckets: the layout of llama-400m gives one bucket per block", "[dist][buckets]") {
    ModelConfig c = config("llama-400m", "preln");
    const std::vector<ParamSpec> specs = param_specs(c);
    const std::vector<dist::GradBucket> bk = dist::plan_grad_buckets(specs, c.n_layer, int64_t(1) << 22);
    // head (final norm + untied LM head), then the blocks from the last to the first, then wte
    REQUIRE(!c.tied);
    REQUIRE(bk.size() == size_t(c.n_layer) + 2);
    CHECK(bk.front().stage == 0);
    for (int k = 0; k < c.n_layer; k++) CHECK(bk[size_t(k) + 1].stage == k + 1);
    CHECK(bk.back().stage == c.n_layer + 1);
    CHECK(bk.back().offset == 0);  // wte
}

TEST_CASE("grad buckets: merging keeps gradients final (tied head, tiny blocks)", "[dist][buckets]") {
    // a synthetic layout: wte, 3 tiny blocks, final norm (tied: no lm_head), scheme parameters
    std::vector<ParamSpec> specs;
    int64_t off = 0;
    auto add = [&](const std::string& name, int64_t k) {
        ParamSpec s;
        s.name = name;
        s.offset = off;
        s.numel = k;
        off += k;
        specs.push_back(s);
    };
    add("wte", 1000);
    for (int l = 0; l < 3; l++) {
        add("blocks." + std::to_string(l) + ".attn_norm.w", 4);
        add("blocks." + std::to_string(l) + ".attn.wq", 16);
    }
    add("final_norm.w", 4);
    add("scheme.attnres.1.w", 4);
    check_plan(specs, 3, 0);
    check_plan(specs, 3, 30);
    check_plan(specs, 3, 1000000);
    // min 30: the head (4) absorbs block 2 (20) and block 1 (20) -> one bucket at stage 2
    const std::vector<dist::GradBucket> bk = dist::plan_grad_buckets(specs, 3, 30);
    REQUIRE(bk.size() >= 2);
    CHECK(bk[0].stage == 2);
    CHECK(bk[0].offset == 1020);
    CHECK(bk[0].count.n == 44);
    // a hole in the layout is refused
    specs.back().offset += 1;
    CHECK_THROWS_AS(dist::plan_grad_buckets(specs, 3, 0), Error);
}

TEST_CASE("grad buckets: ZeRO-1 pieces with uneven and empty shards", "[dist][buckets]") {
    // n smaller than W * 64: trailing ranks own nothing
    for (int W : {1, 2, 3, 8}) {
        for (int64_t n : {int64_t(1), int64_t(63), int64_t(64), int64_t(65), int64_t(1000), int64_t(1) << 20,
                          (int64_t(1) << 20) + 7}) {
            INFO("n " << n << " world " << W);
            int64_t total = 0;
            for (int r = 0; r < W; r++) {
                const dist::Shard s = dist::padded_shard_range(n, W, r);
                CHECK(s.offset == std::min(n, int64_t(r) * dist::padded_shard_size(n, W)));
                total += s.count;
            }
            CHECK(total == n);
            const auto ps = dist::split_by_owner(0, dist::Elems(n), n, W);
            int64_t at = 0;
            for (const auto& p : ps) {
                CHECK(p.offset == at);
                at += p.count.n;
            }
            CHECK(at == n);
            CHECK(dist::split_by_owner(n, dist::Elems(0), n, W).empty());
        }
    }
    CHECK_THROWS_AS(dist::split_by_owner(10, dist::Elems(5), 12, 2), Error);
    CHECK_THROWS_AS(dist::padded_shard_range(10, 2, 2), Error);
}
