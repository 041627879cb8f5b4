#include "core/checkpoint.h"

#include <cstdint>
#include <cstring>

#include "core/common.h"

namespace ldm {

using nlohmann::json;

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static size_t dtype_size(const std::string& dt, const std::string& path) {
    if (dt == "f32" || dt == "i32") return 4;
    if (dt == "f64") return 8;
    if (dt == "u8") return 1;
    throw Error(path + ": unknown tensor dtype '" + dt + "'");
}

static int64_t shape_numel(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t x : s) n *= x;
    return n;
}

void write_container(const std::string& path, const char magic[8], const json& header_in,
                     const std::vector<CkptTensor>& tensors) {
    json header = header_in;
    json tl = json::array();
    uint64_t off = 0;
    for (const auto& t : tensors) {
        size_t es = dtype_size(t.dtype, path);
        if (uint64_t(shape_numel(t.shape)) * es != t.bytes.size())
            throw Error(strprintf("%s: tensor %s has %zu bytes, shape needs %lld", path.c_str(), t.name.c_str(),
                                  t.bytes.size(), (long long)(shape_numel(t.shape) * int64_t(es))));
        tl.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"offset", off},
                      {"nbytes", t.bytes.size()}});
        off += t.bytes.size();
    }
    header["tensors"] = tl;
    std::string hs = header.dump();
    while ((16 + hs.size()) % 64 != 0) hs.push_back(' ');
    std::string out;
    out.reserve(16 + hs.size() + off + 8);
    out.append(magic, 8);
    uint32_t ver = 1, hl = uint32_t(hs.size());
    out.append(reinterpret_cast<const char*>(&ver), 4);
    out.append(reinterpret_cast<const char*>(&hl), 4);
    out += hs;
    for (const auto& t : tensors) out += t.bytes;
    uint64_t h = fnv1a64(out.data(), out.size());
    out.append(reinterpret_cast<const char*>(&h), 8);
    write_file_atomic(path, out.data(), out.size());
}

const CkptTensor& Container::tensor(const std::string& name, const std::string& path) const {
    for (const auto& t : tensors)
        if (t.name == name) return t;
    throw Error(path + ": missing tensor '" + name + "'");
}

Container read_container(const std::string& path, const char magic[8], const char* what) {
    std::string buf;
    try {
        buf = read_file(path);
    } catch (const Error& e) {
        throw Error(std::string(what) + ": " + e.what());
    }
    const std::string w = std::string(what) + " " + path;
    if (buf.size() < 16 + 8) throw Error(w + ": file too small (" + std::to_string(buf.size()) + " bytes): truncated or not a checkpoint");
    if (std::memcmp(buf.data(), magic, 8) != 0)
        throw Error(w + ": bad magic '" + buf.substr(0, 8) + "' (expected '" + std::string(magic, 8) + "'): not a " + what);
    uint32_t ver, hl;
    std::memcpy(&ver, buf.data() + 8, 4);
    std::memcpy(&hl, buf.data() + 12, 4);
    if (ver != 1) throw Error(w + ": unsupported format version " + std::to_string(ver) + " (expected 1)");
    if (uint64_t(16) + hl + 8 > buf.size()) throw Error(w + ": truncated (header length " + std::to_string(hl) + " exceeds the file size)");
    uint64_t stored;
    std::memcpy(&stored, buf.data() + buf.size() - 8, 8);
    uint64_t h = fnv1a64(buf.data(), buf.size() - 8);
    Container c;
    try {
        c.header = json::parse(buf.begin() + 16, buf.begin() + 16 + hl);
    } catch (const std::exception& e) {
        throw Error(w + ": corrupt JSON header (" + e.what() + ")");
    }
    const uint64_t payload = 16 + uint64_t(hl), payload_end = buf.size() - 8;
    try {
        uint64_t expect_off = 0;
        for (const auto& tj : c.header.at("tensors")) {
            CkptTensor t;
            t.name = tj.at("name").get<std::string>();
            t.dtype = tj.at("dtype").get<std::string>();
            t.shape = tj.at("shape").get<std::vector<int64_t>>();
            uint64_t off = tj.at("offset").get<uint64_t>(), nb = tj.at("nbytes").get<uint64_t>();
            // numel * element size without wrap-around (a corrupt shape must not pass as small)
            const uint64_t es = dtype_size(t.dtype, path);
            uint64_t numel = 1;
            bool fits = true;
            for (int64_t d : t.shape) {
                if (d < 0 || (d > 0 && numel > UINT64_MAX / uint64_t(d))) fits = false;
                if (fits) numel *= uint64_t(d);
            }
            if (!fits || numel > UINT64_MAX / es || off != expect_off || nb != numel * es)
                throw Error(w + ": inconsistent tensor table at '" + t.name + "'");
            if (nb > payload_end - payload - off)  // off == expect_off <= payload_end - payload
                throw Error(strprintf("%s: truncated: tensor '%s' needs %llu bytes at payload offset %llu, the file "
                                      "has %llu bytes (payload %llu)",
                                      w.c_str(), t.name.c_str(), (unsigned long long)nb, (unsigned long long)off,
                                      (unsigned long long)buf.size(), (unsigned long long)(payload_end - payload)));
            t.bytes.assign(buf.data() + payload + off, nb);
            expect_off += nb;
            c.tensors.push_back(std::move(t));
        }
        if (payload + expect_off != payload_end)
            throw Error(strprintf("%s: file size %llu does not match its tensor table (expected %llu): truncated or corrupt",
                                  w.c_str(), (unsigned long long)buf.size(), (unsigned long long)(payload + expect_off + 8)));
    } catch (const json::exception& e) {
        throw Error(w + ": corrupt header (" + e.what() + ")");
    }
    if (h != stored)
        throw Error(strprintf("%s: checksum mismatch (stored %016llx, computed %016llx): the file is corrupt", w.c_str(),
                              (unsigned long long)stored, (unsigned long long)h));
    return c;
}

json config_to_json(const ModelConfig& c) {
    return json{{"preset", c.preset},
                {"vocab_size", c.vocab_size},
                {"padded_vocab", c.padded_vocab},
                {"d_model", c.d_model},
                {"n_layer", c.n_layer},
                {"n_head", c.n_head},
                {"n_kv_head", c.n_kv_head},
                {"head_dim", c.head_dim},
                {"ffn", c.ffn},
                {"seq_len", c.seq_len},
                {"tied", c.tied},
                {"qkv_bias", c.qkv_bias},
                {"qk_norm", c.qk_norm},
                {"rope_theta", c.rope_theta},
                {"norm_eps", c.norm_eps},
                {"scheme", c.scheme},
                {"hc_streams", c.hc_streams},
                {"sinkhorn_iters", c.sinkhorn_iters},
                {"attnres_blocks", c.attnres_blocks},
                {"ldm_rule", c.ldm_rule},
                {"ldm_residual", c.ldm_residual},
                {"ldm_forget", c.ldm_forget},
                {"ldm_heads", c.ldm_heads},
                {"ldm_dk", c.ldm_dk},
                {"ldm_delta", c.ldm_delta},
                {"ldm_lambda_min", c.ldm_lambda_min}};
}

template <typename X>
static void get_field(const json& j, const char* k, X& dst) {
    if (!j.contains(k)) throw Error(std::string("config: missing field '") + k + "'");
    try {
        dst = j.at(k).get<X>();
    } catch (const json::exception&) {
        throw Error(std::string("config: field '") + k + "' has the wrong type: " + j.at(k).dump());
    }
}

ModelConfig config_from_json(const json& j) {
    if (!j.is_object()) throw Error("config: not a JSON object");
    ModelConfig c;
    get_field(j, "preset", c.preset);
    get_field(j, "vocab_size", c.vocab_size);
    get_field(j, "padded_vocab", c.padded_vocab);
    get_field(j, "d_model", c.d_model);
    get_field(j, "n_layer", c.n_layer);
    get_field(j, "n_head", c.n_head);
    get_field(j, "n_kv_head", c.n_kv_head);
    get_field(j, "head_dim", c.head_dim);
    get_field(j, "ffn", c.ffn);
    get_field(j, "seq_len", c.seq_len);
    get_field(j, "tied", c.tied);
    get_field(j, "qkv_bias", c.qkv_bias);
    get_field(j, "qk_norm", c.qk_norm);
    get_field(j, "rope_theta", c.rope_theta);
    get_field(j, "norm_eps", c.norm_eps);
    get_field(j, "scheme", c.scheme);
    get_field(j, "hc_streams", c.hc_streams);
    get_field(j, "sinkhorn_iters", c.sinkhorn_iters);
    get_field(j, "attnres_blocks", c.attnres_blocks);
    get_field(j, "ldm_rule", c.ldm_rule);
    get_field(j, "ldm_residual", c.ldm_residual);
    get_field(j, "ldm_forget", c.ldm_forget);
    get_field(j, "ldm_heads", c.ldm_heads);
    get_field(j, "ldm_dk", c.ldm_dk);
    get_field(j, "ldm_delta", c.ldm_delta);
    get_field(j, "ldm_lambda_min", c.ldm_lambda_min);
    c.validate();
    return c;
}

std::string config_diff(const ModelConfig& a, const ModelConfig& b) {
    json ja = config_to_json(a), jb = config_to_json(b);
    std::string out;
    for (auto it = ja.begin(); it != ja.end(); ++it) {
        if (it.key() == "preset") continue;  // a label only; shapes are compared field by field
        if (jb[it.key()] != it.value())
            out += (out.empty() ? "" : "; ") + it.key() + ": " + it.value().dump() + " vs " + jb[it.key()].dump();
    }
    return out;
}

static json specs_json(const ModelConfig& cfg) {
    json a = json::array();
    for (const auto& s : param_specs(cfg))
        a.push_back({{"name", s.name}, {"shape", s.shape}, {"offset", s.offset}, {"numel", s.numel}, {"decay", s.decay}});
    return a;
}

template <typename R>
static std::string raw_bytes(const R* p, int64_t n) {
    return std::string(reinterpret_cast<const char*>(p), size_t(n) * sizeof(R));
}

template <typename R>
static const char* dt_name() {
    return sizeof(R) == 8 ? "f64" : "f32";
}

template <typename R>
void save_model(const std::string& path, const ModelConfig& cfg, const R* params, int64_t step) {
    const int64_t n = count_params(cfg);
    json h{{"kind", "model"}, {"config", config_to_json(cfg)}, {"param_count", n}, {"step", step},
           {"param_specs", specs_json(cfg)}};
    std::vector<float> f(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) f[size_t(i)] = float(params[i]);
    write_container(path, "LDMMODEL", h, {{"params", "f32", {n}, raw_bytes(f.data(), n)}});
}
template void save_model<float>(const std::string&, const ModelConfig&, const float*, int64_t);
template void save_model<double>(const std::string&, const ModelConfig&, const double*, int64_t);

std::string model_file_of(const std::string& path, const std::string& flag) {
    if (file_exists(path)) return path;
    if (file_exists(path + ".model")) return path + ".model";
    throw Error(flag + ": " + path + " does not exist");
}

ModelCheckpoint load_model(const std::string& path) {
    Container c = read_container(path, "LDMMODEL", "model checkpoint");
    ModelCheckpoint m;
    try {
        m.cfg = config_from_json(c.header.at("config"));
        m.step = c.header.at("step").get<int64_t>();
        const int64_t n = c.header.at("param_count").get<int64_t>();
        if (n != count_params(m.cfg))
            throw Error(strprintf("model checkpoint %s: param_count %lld does not match its config (%lld)", path.c_str(),
                                  (long long)n, (long long)count_params(m.cfg)));
        const CkptTensor& t = c.tensor("params", path);
        if (t.dtype != "f32" || t.shape != std::vector<int64_t>{n})
            throw Error("model checkpoint " + path + ": tensor 'params' must be f32 [param_count]");
        m.params.resize(size_t(n));
        std::memcpy(m.params.data(), t.bytes.data(), t.bytes.size());
    } catch (const json::exception& e) {
        throw Error("model checkpoint " + path + ": bad header (" + e.what() + ")");
    } catch (const Error& e) {
        std::string msg = e.what();
        if (msg.find(path) == std::string::npos) msg = "model checkpoint " + path + ": " + msg;
        throw Error(msg);
    }
    return m;
}

void save_train_state(const std::string& path, const TrainState& s) {
    if (s.dtype != "fp32" && s.dtype != "fp64") throw Error("train state: bad dtype " + s.dtype);
    const std::string dt = s.dtype == "fp64" ? "f64" : "f32";
    const int64_t es = s.dtype == "fp64" ? 8 : 4;
    if (s.m.size() != s.v.size() || s.m.size() % size_t(es) != 0) throw Error("train state: moment sizes differ");
    const int64_t n = int64_t(s.m.size()) / es;
    json h{{"kind", "train_state"}, {"step", s.step}, {"dtype", s.dtype}, {"flags", s.flags}, {"extra", s.extra},
           {"param_count", n}};
    std::vector<CkptTensor> t;
    t.push_back({"adam_m", dt, {n}, s.m});
    t.push_back({"adam_v", dt, {n}, s.v});
    if (!s.exact_params.empty()) t.push_back({"exact_params", dt, {int64_t(s.exact_params.size()) / es}, s.exact_params});
    t.push_back({"loader_state", "u8", {int64_t(s.loader_state.size())},
                 std::string(s.loader_state.begin(), s.loader_state.end())});
    t.push_back({"rng_state", "u8", {int64_t(s.rng_state.size() * 8)}, raw_bytes(s.rng_state.data(), int64_t(s.rng_state.size()))});
    write_container(path, "LDMSTATE", h, t);
}

TrainState load_train_state(const std::string& path) {
    Container c = read_container(path, "LDMSTATE", "training state");
    TrainState s;
    try {
        s.step = c.header.at("step").get<int64_t>();
        s.dtype = c.header.at("dtype").get<std::string>();
        if (s.dtype != "fp32" && s.dtype != "fp64")
            throw Error("training state " + path + ": unknown dtype '" + s.dtype + "' (expected fp32 or fp64)");
        s.flags = c.header.at("flags");
        s.extra = c.header.value("extra", json::object());
        const int64_t n = c.header.at("param_count").get<int64_t>();
        const std::string dt = s.dtype == "fp64" ? "f64" : "f32";
        const size_t es = s.dtype == "fp64" ? 8 : 4;
        const CkptTensor& m = c.tensor("adam_m", path);
        const CkptTensor& v = c.tensor("adam_v", path);
        if (m.dtype != dt || v.dtype != dt || m.bytes.size() != size_t(n) * es || v.bytes.size() != size_t(n) * es)
            throw Error("training state " + path + ": moment tensors do not match dtype/param_count");
        s.m = m.bytes;
        s.v = v.bytes;
        for (const auto& t : c.tensors)
            if (t.name == "exact_params") {
                if (t.dtype != dt || t.bytes.size() != size_t(n) * es)
                    throw Error("training state " + path + ": exact_params does not match dtype/param_count");
                s.exact_params = t.bytes;
            }
        const CkptTensor& ls = c.tensor("loader_state", path);
        s.loader_state.assign(ls.bytes.begin(), ls.bytes.end());
        const CkptTensor& rs = c.tensor("rng_state", path);
        if (rs.bytes.size() % 8) throw Error("training state " + path + ": bad rng_state size");
        s.rng_state.resize(rs.bytes.size() / 8);
        std::memcpy(s.rng_state.data(), rs.bytes.data(), rs.bytes.size());
    } catch (const json::exception& e) {
        throw Error("training state " + path + ": bad header (" + e.what() + ")");
    }
    return s;
}

void check_resume_flags(const json& saved, const json& now, const std::string& path) {
    std::string out;
    for (auto it = now.begin(); it != now.end(); ++it) {
        json a = saved.contains(it.key()) ? saved.at(it.key()) : json("<absent>");
        if (a != it.value()) {
            if (it.key() == "config" && a.is_object() && it.value().is_object()) {
                try {
                    std::string d = config_diff(config_from_json(a), config_from_json(it.value()));
                    out += "\n  model config differs (checkpoint vs command line): " + d;
                    continue;
                } catch (const Error&) {
                }
            }
            out += "\n  " + it.key() + " differs: checkpoint " + a.dump() + ", command line " + it.value().dump();
        }
    }
    if (!out.empty()) throw Error("resume from " + path + ": the run does not match the checkpoint:" + out);
}

template <typename R>
void save_debug_state(const std::string& path, const ModelConfig& cfg, const R* params, const int32_t* inputs,
                      const int32_t* targets, int B, int T, const R* logits, double loss, const R* grads) {
    const int64_t n = count_params(cfg), N = int64_t(B) * T, Vp = cfg.padded_vocab;
    json h{{"kind", "debug"},
           {"config", config_to_json(cfg)},
           {"dtype", sizeof(R) == 8 ? "fp64" : "fp32"},
           {"B", B},
           {"T", T},
           {"loss", loss},
           {"param_count", n},
           {"param_specs", specs_json(cfg)}};
    std::vector<CkptTensor> t;
    t.push_back({"params", dt_name<R>(), {n}, raw_bytes(params, n)});
    t.push_back({"inputs", "i32", {B, T}, raw_bytes(inputs, N)});
    t.push_back({"targets", "i32", {B, T}, raw_bytes(targets, N)});
    t.push_back({"logits", dt_name<R>(), {N, Vp}, raw_bytes(logits, N * Vp)});
    t.push_back({"grads", dt_name<R>(), {n}, raw_bytes(grads, n)});
    write_container(path, "LDMDEBUG", h, t);
}
template void save_debug_state<float>(const std::string&, const ModelConfig&, const float*, const int32_t*,
                                      const int32_t*, int, int, const float*, double, const float*);
template void save_debug_state<double>(const std::string&, const ModelConfig&, const double*, const int32_t*,
                                       const int32_t*, int, int, const double*, double, const double*);

}  // namespace ldm
