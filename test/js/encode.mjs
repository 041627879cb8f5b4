// test/js/encode.mjs — independent reference encoders for the tokenizer cross-check tests
// (test/test_tokenizer_xcheck.cpp) and the benchmark (scripts/bench_tokenizer.sh).
//
//   node encode.mjs gpt2 IN OUT            js-tiktoken, `gpt2` encoding (ranks shipped in the package)
//   node encode.mjs gpt2-special IN OUT    the same with allowedSpecial "all" (<|endoftext|> -> 50256)
//   node encode.mjs hf TOKENIZER_JSON IN OUT   @huggingface/tokenizers (tokenizers.js) on a local tokenizer.json
//   node encode.mjs hf-ordinary TOKENIZER_JSON IN OUT   the same with the added tokens marked
//                                          "special" removed from the file (HF split_special_tokens)
//   node encode.mjs bench-gpt2 FILE... / bench-hf TOKENIZER_JSON FILE...   timing only (see below)
//
// IN: binary list of texts: uint32 count, then per text uint32 byte length + UTF-8 bytes (little
// endian). OUT: per text uint32 token count + uint32 ids. Invalid UTF-8 in IN is an error.
// "<|endoftext|>" inside text is ordinary text for gpt2 (disallowedSpecial = []) and hf-ordinary,
// and the special token for gpt2-special and hf (as HF tokenizers does). Exit status 1 with
// "error: ..." on failure.
import fs from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2ranks from "js-tiktoken/ranks/gpt2";
import { Tokenizer } from "@huggingface/tokenizers";

function readTexts(path) {
  const buf = fs.readFileSync(path);
  const dec = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }); // keep a leading U+FEFF
  let off = 0;
  const n = buf.readUInt32LE(off); off += 4;
  const texts = new Array(n);
  for (let i = 0; i < n; i++) {
    const len = buf.readUInt32LE(off); off += 4;
    texts[i] = dec.decode(buf.subarray(off, off + len));
    off += len;
  }
  if (off !== buf.length) throw new Error(`${path}: trailing bytes after ${n} texts`);
  return texts;
}

function writeIds(path, lists) {
  let total = 0;
  for (const l of lists) total += 1 + l.length;
  const out = new Uint32Array(total);
  let k = 0;
  for (const l of lists) { out[k++] = l.length; for (const id of l) out[k++] = id; }
  const tmp = `${path}.tmp.${process.pid}`;
  fs.writeFileSync(tmp, Buffer.from(out.buffer));
  fs.renameSync(tmp, path);
}

function makeGpt2(special = false) {
  const enc = new Tiktoken(gpt2ranks);
  return special ? (t) => enc.encode(t, "all", []) : (t) => enc.encode(t, [], []);
}

function makeHf(jsonPath, ordinary = false) {
  const tj = JSON.parse(fs.readFileSync(jsonPath, "utf8"));
  if (ordinary) tj.added_tokens = tj.added_tokens.filter((a) => !a.special);
  const tok = new Tokenizer(tj, {});
  return (t) => tok.encode(t, { add_special_tokens: false }).ids;
}

function main() {
  const [mode, ...args] = process.argv.slice(2);
  if (mode === "gpt2" || mode === "gpt2-special" || mode === "hf" || mode === "hf-ordinary") {
    const [enc, inp, out] = mode.startsWith("gpt2") ? [makeGpt2(mode === "gpt2-special"), args[0], args[1]]
                                                    : [makeHf(args[0], mode === "hf-ordinary"), args[1], args[2]];
    if (!inp || !out) throw new Error("usage: encode.mjs gpt2|gpt2-special IN OUT | hf|hf-ordinary TOKENIZER_JSON IN OUT");
    writeIds(out, readTexts(inp).map((t) => enc(t)));
  } else if (mode === "bench-gpt2" || mode === "bench-hf") {
    // Encodes each file's texts (IN format) once to warm up, then times `reps` passes.
    // Prints one line per file: "<file> <bytes> <seconds per pass> <tokens> <CPU seconds per pass>"
    // (CPU = process user+system time, which includes V8's helper threads, e.g. the GC).
    const enc = mode === "bench-gpt2" ? makeGpt2() : makeHf(args.shift());
    for (const f of args) {
      const texts = readTexts(f);
      let bytes = 0;
      for (const t of texts) bytes += Buffer.byteLength(t, "utf8");
      let ntok = 0;
      for (const t of texts) ntok += enc(t).length;
      const reps = 3;
      const t0 = process.hrtime.bigint();
      const c0 = process.cpuUsage();
      for (let r = 0; r < reps; r++) for (const t of texts) enc(t);
      const sec = Number(process.hrtime.bigint() - t0) / 1e9 / reps;
      const c = process.cpuUsage(c0);
      const cpu = (c.user + c.system) / 1e6 / reps;
      console.log(`${f} ${bytes} ${sec} ${ntok} ${cpu}`);
    }
  } else {
    throw new Error("usage: encode.mjs gpt2|gpt2-special IN OUT | hf|hf-ordinary TOKENIZER_JSON IN OUT | bench-gpt2 IN... | bench-hf TOKENIZER_JSON IN...");
  }
}

try { main(); } catch (e) { console.error(`error: ${e.message}`); process.exit(1); }
