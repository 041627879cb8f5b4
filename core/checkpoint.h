// core/checkpoint.h — model checkpoints, training state and the debug-state dump.
//
// All three files share one container layout (documented in doc/formats.md, sections
// "Checkpoints" and "Debug state"); all integers little-endian:
//   offset 0   char[8]  magic: "LDMMODEL" (model), "LDMSTATE" (training state), "LDMDEBUG" (debug)
//   offset 8   uint32   format version (1)
//   offset 12  uint32   H = length of the JSON header in bytes (padded with spaces so 16 + H is
//                       a multiple of 64: the payload starts 64-byte aligned)
//   offset 16  H bytes  JSON header (UTF-8). Always has "tensors": [{"name", "dtype" (f32|f64|i32|u8),
//                       "shape": [...], "offset" (bytes from the payload start), "nbytes"}, ...]
//   16 + H     payload: the tensors' raw bytes, back to back in the listed order
//   last 8     uint64   FNV-1a 64-bit hash of every byte before it (header and payload)
// Writers are atomic (temp file + fsync + rename). Readers check the magic, version, header
// JSON, every tensor's offset and size against the file size, and the checksum, and throw
// ldm::Error naming the file and what is wrong (truncated, corrupt, wrong kind, ...).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace ldm {

// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over n bytes, continuing
// from `h` (pass the basis to start).
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// One payload tensor of a container file. `bytes` holds the raw little-endian values.
struct CkptTensor {
    std::string name, dtype;       // dtype: f32 | f64 | i32 | u8
    std::vector<int64_t> shape;
    std::string bytes;
};

// Writes a container atomically. `header` must be a JSON object; "tensors" is filled in here.
void write_container(const std::string& path, const char magic[8], const nlohmann::json& header,
                     const std::vector<CkptTensor>& tensors);
struct Container {
    nlohmann::json header;
    std::vector<CkptTensor> tensors;
    const CkptTensor& tensor(const std::string& name, const std::string& path) const;  // ldm::Error if absent
};
// Reads and fully validates a container with the expected magic (`what` names the kind of file
// in error messages, e.g. "model checkpoint").
Container read_container(const std::string& path, const char magic[8], const char* what);

// The full ModelConfig as JSON (every field) and back. config_from_json throws ldm::Error naming
// a missing or mistyped field, then validates the config.
nlohmann::json config_to_json(const ModelConfig& c);
ModelConfig config_from_json(const nlohmann::json& j);
// Human-readable list of differing fields ("n_layer: 2 vs 3; d_model: ..."), "" when equal.
std::string config_diff(const ModelConfig& a, const ModelConfig& b);

// ---- Model checkpoint (magic "LDMMODEL"): header {"kind":"model","config":{...},
// "param_count": N, "step": s, "param_specs": [{"name","shape","offset","numel","decay"}...]},
// one tensor "params" f32 [N] in param_specs order. Parameters are stored as fp32 whatever the
// training dtype (the training state holds the exact fp64 values of fp64 runs).
template <typename R>
void save_model(const std::string& path, const ModelConfig& cfg, const R* params, int64_t step);
struct ModelCheckpoint {
    ModelConfig cfg;
    int64_t step = 0;
    std::vector<float> params;  // [count_params(cfg)]
};
// Checks magic/version/checksum, that the config is valid and that param_count equals
// count_params(config) and the tensor size; ldm::Error otherwise.
ModelCheckpoint load_model(const std::string& path);
// The model file a --checkpoint value names: the path itself, or path + ".model" when the path is
// a checkpoint's base (dir/ckpt_000100, as --resume takes it). ldm::Error "FLAG: PATH does not
// exist" when neither is a file.
std::string model_file_of(const std::string& path, const std::string& flag = "--checkpoint");

// ---- Training state (magic "LDMSTATE"). Everything needed, with the model file, to continue a
// run bit-exactly: AdamW moments in the training dtype, the exact parameters (fp64 runs only),
// the completed step count, the data loader's opaque state, the RNG state, and `flags`: the
// settings that must be equal on resume (config, dtype, B, T, total batch, seed, data, ...).
struct TrainState {
    int64_t step = 0;                 // optimizer steps completed
    std::string dtype = "fp32";       // fp32 | fp64: dtype of m, v, exact_params
    nlohmann::json flags = nlohmann::json::object();
    std::string m, v;                 // raw [N] values of dtype
    std::string exact_params;         // raw [N] values of dtype, or empty (fp32: use the model file)
    std::vector<uint8_t> loader_state;
    std::vector<uint64_t> rng_state;
    nlohmann::json extra = nlohmann::json::object();  // free-form (e.g. last losses), not checked
};
void save_train_state(const std::string& path, const TrainState& s);
TrainState load_train_state(const std::string& path);
// Compares the saved flags with the current run's; ldm::Error listing every mismatch
// ("resume: <key> differs: checkpoint <a>, command line <b>").
void check_resume_flags(const nlohmann::json& saved, const nlohmann::json& now, const std::string& path);

// ---- Debug state (magic "LDMDEBUG"): the ground truth the GPU tests and scripts/torch_ref.py
// compare against. Header {"kind":"debug","config":{...},"dtype":"fp32|fp64","B","T","loss",
// "param_count","param_specs":[...]}, tensors: "params" [N], "inputs" i32 [B,T],
// "targets" i32 [B,T], "logits" [B*T, Vp] (columns >= V are 0), "grads" [N] (d mean loss / d p),
// float tensors in the model's dtype.
template <typename R>
void save_debug_state(const std::string& path, const ModelConfig& cfg, const R* params,
                      const int32_t* inputs, const int32_t* targets, int B, int T, const R* logits,
                      double loss, const R* grads);

}  // namespace ldm
