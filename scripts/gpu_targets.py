#!/usr/bin/python3
"""The GPU targets of ../shared/spec/performance.md (and of issues #17 and #18), each marked met,
missed or not measured, from the results of one GPU run.

  gpu_targets.py DIR [--out FILE]
      DIR: the log folder of scripts/gpu_check.sh (bench_lines.txt: one `label<TAB>BENCH json` line
      per C++ benchmark and PyTorch peer; wb_attention.log: the attention workbench's CHECK/BENCH
      lines). Prints the table (markdown) and writes it to FILE (default DIR/targets.md).
  scripts/torch_bench.py report --kind gpu calls evaluate() on scripts/bench_gpu.sh's rows.

What each target compares (all within the one run):
- MFU: the C++ BENCH line's `mfu` (model FLOPs against the cuBLASLt peak it measured).
- step-time ratios: the median step of the scheme over PreLN's, same preset, T, B and dtype.
- the traffic floor: a scheme's counted bytes per token and sublayer at `llama-400m` bf16
  (doc/results_gpu.md, "Every scheme side by side"; KB = 1000 bytes) minus PreLN's own 16 KB,
  times 2·n_layer sublayers and B·T tokens, over the device-to-device copy bandwidth the trainer
  measured in the same process (`copy_tbs`). The counts hold for that preset and those scheme
  shapes only; other shapes get no floor row.
- attention: the best fwd+bwd TFLOP/s of a bf16 variant none of whose CHECK lines failed.
- a scheme is compared with the PreLN run of its own --cuda-graph setting.
Rows without the measurement they need say "not measured" (e.g. under the CPU emulation, which
has no device peak or bandwidth). A paragraph above the table names the card (and its measured
peak and bandwidth); on a card other than the H200 it says how each group of rows reads there,
and the step-time limits against PreLN are marked *(H200 limit)*. The Depth Memory paper's claim
(LDM within ~5% of Block AttnRes) is a second table, not counted with the targets.
doc/benchmarks.md lists every row.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

LLAMA = ("llama-400m", 2048, 8)  # preset, T, B of the spec's scheme targets
PRESET_LAYERS = {"llama-400m": 24, "qwen-1.5b": 28}  # the presets' own depths (targets need the full model)
ATTN_SHAPES = (("llama-400m", "B=8,T=2048,nh=16,nkv=16,hd=64", 300.0),
               ("qwen3-1.7b", "B=2,T=8192,nh=16,nkv=8,hd=128", 350.0))
ATTN_PRODUCTION = "mma"  # the workbench's name of production's bf16 kernels at head_dim 64 / 128
# Counted traffic per token and sublayer, forward + backward, KB (1000 bytes), llama-400m
# (d = 1024, 24 layers), bf16, today's kernels: doc/results_gpu.md "Every scheme side by side".
FLOOR_KB = {"hc": 22.5 + 49, "mhc": 31 + 50, "attnres-block": 17.5 + 36.1, "attnres-full": 54 + 86,
            "ldm-dk8": 92 + 176, "ldm-dk4": 58 + 104.5}
PRELN_KB = 16.0  # PreLN's own residual traffic per token and sublayer, which a scheme replaces
PEERS = ("torch-eager", "torch-compile")
# the rows whose limit holds for the H200 only (a step-time ratio against PreLN: the schemes are
# bandwidth-bound, PreLN mostly not), marked as such on another card
H200_ONLY = re.compile(r" step time <= [0-9.]+x PreLN")
# issue #17: PreLN llama-400m peak memory "no worse than today": 22.1 GiB on the H200 run of
# 2026-11-30, as printed (one decimal), so anything that prints as 22.1 passes
PRELN_MEM_GIB = 22.1


def ldm_key(rule, residual, dk, mode="unwind"):
    """rls with the residual path in unwind mode is the targets' LDM ("ldm-dk8", "ldm-dk4"); every
    other rule, mode or --no-residual gets its own id (its PyTorch peer ignores the mode)"""
    if rule == "rls" and residual:
        return "ldm-dk%s" % dk if mode == "unwind" else "ldm-rls-%s-dk%s" % (mode, dk)
    return "ldm-%s%s-dk%s" % (rule, "" if residual else "-nores", dk)


def canon(label, j):
    """The scheme id a C++ BENCH json measures, or None when no target or peer row can use it
    (NCCL, --profile-stages and recompute runs; scheme shapes other than the presets' n = 4 streams,
    8 blocks, 4 LDM heads; an LDM run without scheme_config)."""
    if any(x in label for x in ("nccl", "recompute", "profile")) or j.get("recompute", 0) or \
            j.get("nccl") or j.get("profile_stages"):
        return None
    s = j.get("scheme")
    c = j.get("scheme_config") or {}
    if s in ("preln", "attnres-full"):
        return s
    if s in ("hc", "mhc"):
        return s if c.get("n", 4) == 4 else None
    if s == "attnres-block":
        return s if c.get("blocks", 8) == 8 else None
    if s == "ldm" and c.get("d_k") and c.get("heads", 4) == 4:
        return ldm_key(c.get("rule"), c.get("residual", True), c["d_k"], c.get("mode"))
    return None


def peer_key(j):
    s = j.get("scheme")
    if s == "ldm":
        return ldm_key(j.get("ldm_rule"), j.get("ldm_residual", True), j.get("ldm_dk")) if j.get("ldm_dk") else None
    return s


def shape_of(j):
    # n_layer: trainers before 2026-12-06 did not print it; they ran the preset's depth unless told
    return (j.get("preset"), int(j.get("T") or 0), int(j.get("B") or 0), j.get("dtype"),
            j.get("n_layer") or PRESET_LAYERS.get(j.get("preset")))


def usable(j):
    """A BENCH json the rows can use: an object with T, B and a finite positive step time and rate."""
    try:
        return j["T"] is not None and j["B"] is not None and \
            all(math.isfinite(float(j[k])) and float(j[k]) > 0 for k in ("tokens_per_s", "step_ms"))
    except (KeyError, TypeError, ValueError):  # TypeError: j is no object, or a value is no number
        return False


def parse_attention(lines):
    """[(variant, dtype, shape, fwd+bwd TFLOP/s)], {variant: number of failed CHECKs}, {variant: CHECKs}"""
    bench, failed, checks = [], {}, {}
    for l in lines:
        m = re.match(r"CHECK attention (\S+) (\S+) (\S+):\S+ .* (PASS|FAIL)\s*$", l)
        if m:
            checks[m.group(1)] = checks.get(m.group(1), 0) + 1
            if m.group(4) == "FAIL":
                failed[m.group(1)] = failed.get(m.group(1), 0) + 1
            continue
        m = re.match(r"BENCH attention (\S+) (\S+) (\S+):fwd\+bwd ms=\S+ GB/s=\S+ TFLOP/s=(\S+)", l)
        if m:
            try:
                t = float(m.group(4))
            except ValueError:
                continue
            if math.isfinite(t) and t > 0:
                bench.append((m.group(1), m.group(2), m.group(3), t))
    return bench, failed, checks


def evaluate(runs, attention_lines=None):
    """runs: [{"label", "impl": "cpp" | "torch-eager" | "torch-compile", "bench": BENCH json}].
    Returns [(kind, what, measured, verdict)]: kind "target" (verdict "met", "missed" or "not
    measured") or "claim" (a published claim checked on our kernels: "holds", "does not hold" or
    "not measured")."""
    cpp, peer = {}, {}
    for r in runs:
        j = r["bench"]
        if not usable(j):
            continue
        if r["impl"] == "cpp":
            k = canon(r["label"], j)
            if k:
                cpp.setdefault((shape_of(j), k, 1 if j.get("cuda_graph") else 0), j)
        else:
            k = peer_key(j)
            if k:
                peer.setdefault((shape_of(j), k, r["impl"]), j)
    out = []

    def add(what, measured, ok, kind="target"):
        v = "not measured" if ok is None else (("met" if ok else "missed") if kind == "target" else
                                                ("holds" if ok else "does not hold"))
        out.append((kind, what, measured, v))

    def find(preset, k, g, T=None, B=None):
        """The bf16 run of scheme k at the preset's full depth (--cuda-graph g), or None."""
        for (sh, kk, gg), j in sorted(cpp.items(), key=lambda x: str(x[0])):
            if kk == k and gg == g and sh[0] == preset and sh[3] == "bf16" and sh[4] == PRESET_LAYERS.get(preset) \
                    and (T is None or sh[1] == T) and (B is None or sh[2] == B):
                return j
        return None

    def llama(k, g=0):
        return find(LLAMA[0], k, g, LLAMA[1], LLAMA[2])

    def pair(k, other):
        """(scheme k's llama-400m run, other's run with the same --cuda-graph setting, None) for the
        eager pair if both ran, else the graph pair; else (None, None, why not)"""
        for g in (0, 1):
            j, o = llama(k, g), llama(other, g)
            if j and o:
                return j, o, None
        if not (llama(k, 0) or llama(k, 1)):
            return None, None, "no %s run" % k
        return None, None, "no %s run with the same --cuda-graph setting" % other

    # 1. PreLN MFU (issue #17: >= 50% first, 55% stretch; qwen-1.5b >= 50%) and memory. The verdict
    # is on `mfu` (against the constant-input GEMM peak, the higher of the two: the conservative
    # one); the MFU against the random-input peak is shown beside it.
    def random_peak_note(j):
        r = j.get("mfu_random_peak")
        return "; %.1f%% against the random-input GEMM peak" % (100 * r) if r is not None else ""

    for g, name in ((0, "PreLN"), (1, "PreLN --cuda-graph 1")):
        j = llama("preln", g)
        m = j.get("mfu") if j else None
        for need in (0.50, 0.55):
            add("%s llama-400m T=2048 B=8 MFU >= %d%%" % (name, round(100 * need)),
                "%.1f%%%s" % (100 * m, random_peak_note(j)) if m is not None else
                ("no device peak (emulated?)" if j else "no run"),
                None if m is None else m >= need)
    j = find("qwen-1.5b", "preln", 0, 2048) or find("qwen-1.5b", "preln", 1, 2048)
    m = j.get("mfu") if j else None
    add("PreLN qwen-1.5b T=2048 MFU >= 50%", "%.1f%% (B=%d)%s" % (100 * m, j["B"], random_peak_note(j))
        if m is not None else ("no device peak" if j else "no run"), None if m is None else m >= 0.50)
    pre = llama("preln", 0) or llama("preln", 1)
    if pre and pre.get("peak_mem_gib") is None:
        pre = None
    add("PreLN llama-400m peak memory <= %.1f GiB as printed (issue #17: no worse than the 2026-11-30 run)"
        % PRELN_MEM_GIB, "%.2f GiB (%.1f)" % (pre["peak_mem_gib"], pre["peak_mem_gib"]) if pre else "no run",
        round(pre["peak_mem_gib"], 1) <= PRELN_MEM_GIB if pre else None)

    # 2. attention forward + backward
    bench, failed, checks = parse_attention(attention_lines) if attention_lines is not None else ([], {}, {})
    # the workbench's last line ("attention: N failed checks") is missing when it crashed or was stopped
    unfinished = attention_lines is not None and not any(re.match(r"attention: \d+ failed checks", l)
                                                         for l in attention_lines)
    for name, shp, need in ATTN_SHAPES:
        what = "attention fwd+bwd >= %.0f TFLOP/s at %s (%s)" % (need, name, shp)
        rows = [(v, t) for v, d, s, t in bench if d == "bf16" and s == shp]
        ok_rows = [(t, v) for v, t in rows if checks.get(v, 0) > 0 and failed.get(v, 0) == 0]
        bad = sorted({v for v, _ in rows if failed.get(v, 0) or not checks.get(v, 0)})
        note = ("; excluded (failed or no CHECKs): " + ", ".join(bad)) if bad else ""
        if unfinished:
            note += "; the workbench did not finish (later variants not timed)"
        if ok_rows:
            t, v = max(ok_rows)
            prod = dict(rows).get(ATTN_PRODUCTION)
            add(what, "%.1f (%s)%s%s" % (t, v, "; production (%s) %.1f" % (ATTN_PRODUCTION, prod)
                                         if prod is not None and v != ATTN_PRODUCTION else "", note), t >= need)
        else:
            add(what, ("no passing variant" + note) if rows else "no run" + note, None)

    # 3. the PyTorch peer: every scheme >= 1.3x eager and >= 1.0x torch.compile, same shape
    shapes = sorted({sh for (sh, _, _) in cpp} | {sh for (sh, _, _) in peer}, key=str)

    def shape_text(sh):
        same = [s2 for s2 in shapes if s2[:4] == sh[:4]]
        return "%s T=%d B=%d" % sh[:3] + (" L=%s" % sh[4] if len(same) > 1 else "")
    for sh in shapes:
        ks = sorted({k for (s2, k, _) in cpp if s2 == sh} | {k for (s2, k, _) in peer if s2 == sh})
        if not any(s2 == sh for (s2, _, _) in peer) and not (sh[:3] == LLAMA and sh[4] == PRESET_LAYERS[LLAMA[0]]):
            continue
        unpeered = [k for k in ks if not any((sh, k, i) in peer for i in PEERS)]
        if unpeered:  # one row for the schemes without any PyTorch run
            add("%s %s: C++ >= 1.3x torch-eager and >= 1.0x torch-compile tokens/s" % (", ".join(unpeered),
                                                                                     shape_text(sh)),
                "no PyTorch run", None)
        for k in ks:
            if k in unpeered:
                continue
            c = cpp.get((sh, k, 0)) or cpp.get((sh, k, 1))
            for impl, need in zip(PEERS, (1.3, 1.0)):
                p = peer.get((sh, k, impl))
                r = c["tokens_per_s"] / p["tokens_per_s"] if c and p else None
                add("%s %s: C++ >= %.1fx %s tokens/s" % (k, shape_text(sh), need, impl),
                    "%.2fx (%.0f vs %.0f tok/s; %s)" % (r, c["tokens_per_s"], p["tokens_per_s"],
                                                         p.get("attention_backend") or "attention backend not reported")
                    if r else
                    ("no C++ run" if not c else "no %s run" % impl), None if r is None else r >= need)

    # 4. the schemes against PreLN at llama-400m: step-time ratio limits, floors, LDM's
    for k, lim in (("hc", 1.10), ("mhc", 1.10), ("attnres-block", 1.05), ("ldm-dk8", 1.5), ("ldm-dk4", 1.25)):
        j, p, why = pair(k, "preln")
        r = j["step_ms"] / p["step_ms"] if not why else None
        add("%s step time <= %.2fx PreLN (llama-400m)" % (k, lim),
            "%.3fx (%.1f vs %.1f ms)" % (r, j["step_ms"], p["step_ms"]) if r else why, None if r is None else r <= lim)
    for k in ("hc", "mhc", "attnres-block", "attnres-full", "ldm-dk8", "ldm-dk4"):
        j, p, why = pair(k, "preln")
        what = "%s extra step time over PreLN <= 1.3x its traffic floor (llama-400m)" % k
        bw = (j or {}).get("copy_tbs")
        if why or not bw:
            add(what, why or "no bandwidth measured", None)
            continue
        # tokens per optimizer step (B*T times the accumulation) = tokens/s x the median step time
        tokens = j["tokens_per_s"] * j["step_ms"] / 1e3 if j.get("tokens_per_s") else j["B"] * j["T"]
        floor_ms = (FLOOR_KB[k] - PRELN_KB) * 1e3 * 2 * shape_of(j)[4] * tokens / (bw * 1e12) * 1e3
        extra = j["step_ms"] - p["step_ms"]
        add(what, "extra %.1f ms, floor %.1f ms (%.1f KB per token and sublayer at %.2f TB/s): %.2fx" %
            (extra, floor_ms, FLOOR_KB[k], bw, extra / floor_ms), extra <= 1.3 * floor_ms)
    for k in ("ldm-dk8", "ldm-dk4"):
        for other in ("mhc", "attnres-full"):
            what = "%s faster than %s (llama-400m step time)" % (k, other)
            j, o, why = pair(k, other)
            if why:
                add(what, why, None)
                continue
            r = j["step_ms"] / o["step_ms"]
            add(what, "%.3fx (%.1f vs %.1f ms)" % (r, j["step_ms"], o["step_ms"]), r < 1.0)
        j, p, why = pair(k, "preln")
        if not why and (not j.get("peak_mem_gib") or not p.get("peak_mem_gib")):
            why = "no peak memory reported"
        r = j["peak_mem_gib"] / p["peak_mem_gib"] if not why else None
        add("%s peak memory <= PreLN + 20%% (llama-400m)" % k,
            "%.3fx (%.2f vs %.2f GiB)" % (r, j["peak_mem_gib"], p["peak_mem_gib"]) if r else why,
            None if r is None else r <= 1.2)
    # the Depth Memory paper's claims on our kernels (issue #18 item 4): LDM faster than mHC and
    # Full (the targets above) and within ~5% of Block AttnRes
    for k in ("ldm-dk8", "ldm-dk4"):
        what = "%s within 5%% of attnres-block's step time (llama-400m)" % k
        j, o, why = pair(k, "attnres-block")
        if why:
            add(what, why, None, "claim")
            continue
        r = j["step_ms"] / o["step_ms"]
        add(what, "%.3fx (%.1f vs %.1f ms)" % (r, j["step_ms"], o["step_ms"]), r <= 1.05, "claim")
    return out


def device_info(runs):
    """(note, other): a paragraph naming the card the runs measured on (the C++ BENCH json's `device`
    with the bf16 GEMM peak and copy bandwidth it measured, the PyTorch peer's `gpu`) and, on a card
    other than the H200 the targets were set on, how each group of rows reads there; `other` is
    True then. ("", False) when no run names a device."""
    devs = {}
    for r in runs:
        j = r.get("bench")
        if not isinstance(j, dict):
            continue
        d = j.get("device") if r.get("impl") == "cpp" else j.get("gpu")
        name = d.split(",")[0].strip() if isinstance(d, str) else ""  # "NVIDIA H200, sm_90, ..." -> the name
        if name:
            devs.setdefault(name, []).append(j)

    def median(js, key):  # over the runs that report a finite positive value, else None
        v = []
        for j in js:
            try:
                x = float(j.get(key))
            except (TypeError, ValueError):
                continue
            if math.isfinite(x) and x > 0:
                v.append(x)
        return statistics.median(v) if v else None
    if not devs:
        return "", False
    parts = []
    for d in sorted(devs):
        peak, bw = median(devs[d], "peak_bf16_tflops"), median(devs[d], "copy_tbs")
        peak_r = median(devs[d], "peak_bf16_tflops_random")
        m = ["bf16 GEMM %.0f TFLOP/s%s" % (peak, " (random inputs: %.0f)" % peak_r if peak_r else "") if peak else None,
             "copy %.2f TB/s" % bw if bw else None]
        m = [x for x in m if x]
        parts.append(d + (" (%s, medians of its runs)" % ", ".join(m) if m else ""))
    s = "Measured on: " + "; ".join(parts) + "."
    if len(devs) > 1:
        s += " **The runs name more than one device**: ratios between them compare different cards."
    other = any(not is_target_device(d) for d in devs if "emulation" not in d)
    if other:
        sxm = all(re.search(r"\bH100\b", d) and "HBM3" in d and "NVL" not in d and "PCIe" not in d
                  for d in devs if "emulation" not in d)
        s += "\n\n" + "\n".join([
            "The targets were set on an H200 SXM (dense bf16 989 TFLOP/s on paper, as on an H100 SXM; about 4.3 TB/s "
            "copied). On this card:",
            "- carry over: the MFU rows (against the peak measured here), the PyTorch ratios, the floor rows (at the "
            "bandwidth measured here), the memory rows, and which of two schemes is faster (both are bound by "
            "bandwidth);",
            "- attention TFLOP/s rows: absolute, so they carry over only at the H200's bf16 peak%s;" % (
                " (this card, an H100 SXM, has it)" if sxm else
                " (an H100 SXM has it; an H100 PCIe, an H200 NVL or an A100 does not)"),
            "- the step-time limits against PreLN, marked *(H200 limit)*, and the LDM-within-5%-of-Block claim do "
            "not: the schemes are bound by memory bandwidth and PreLN mostly by the tensor cores, so a card with "
            "less bandwidth per FLOP/s than the H200 (an H100 SXM copies about 3.0 TB/s) puts every scheme's ratio "
            "higher. Read them beside the floor rows."])
    return s, other


def is_target_device(name):
    """Whether a device name is the card the targets were set on: an H200 SXM ("NVIDIA H200"), not a
    GH200 (an H100-class chip) or an H200 NVL (a lower power limit)."""
    return re.search(r"\bH200\b", name) is not None and "NVL" not in name


def markdown(rows, title="Targets (../shared/spec/performance.md, issues #17 and #18)", runs=None):
    """The targets table (markdown). With `runs` (evaluate()'s input): the device paragraph above it,
    and on a card other than the H200 the step-time limits against PreLN marked *(H200 limit)* and
    counted apart."""
    device, other = device_info(runs) if runs is not None else ("", False)
    t = [r for r in rows if r[0] == "target"]
    c = [r for r in rows if r[0] == "claim"]
    h200 = [other and H200_ONLY.search(r[1]) is not None for r in t]
    n = {v: sum(1 for r in t if r[3] == v) for v in ("met", "missed", "not measured")}
    k = sum(1 for r, h in zip(t, h200) if h and r[3] != "not measured")
    L = ["## " + title, ""] + ([device, ""] if device else []) + [
         "%d met, %d missed, %d not measured%s." % (n["met"], n["missed"], n["not measured"],
                                                    " (%d of the met and missed: H200 limits)" % k if k else ""), "",
         "| target | measured | result |", "|---|---|---|"]
    for (_, what, m, v), h in zip(t, h200):
        v = "**missed**" if v == "missed" else v
        L.append("| %s | %s | %s |" % (what, m, v + " *(H200 limit)*" if h and v != "not measured" else v))
    if c:
        L += ["", "Published claims checked on our kernels (the Depth Memory paper; issue #18), not targets:", "",
              "| claim | measured | result |", "|---|---|---|"]
        for _, what, m, v in c:
            L.append("| %s | %s | %s |" % (what, m, v))
    return "\n".join(L) + "\n"


def load_gpu_check(d):
    """The runs of a gpu_check.sh log folder (bench_lines.txt) and the attention workbench's lines."""
    runs = []
    p = os.path.join(d, "bench_lines.txt")
    if os.path.exists(p):
        for line in open(p):
            if "\t" not in line:
                continue
            label, js = line.rstrip("\n").split("\t", 1)
            try:
                j = json.loads(js)
            except ValueError:
                continue
            runs.append({"label": label, "impl": label if label.startswith("torch-") else "cpp", "bench": j})
    a = os.path.join(d, "wb_attention.log")
    att = open(a, errors="replace").read().splitlines() if os.path.exists(a) else None
    return runs, att


def main():
    ap = argparse.ArgumentParser(description="Every GPU target of the spec and issues #17/#18 marked met, missed or "
                                 "not measured, from one scripts/gpu_check.sh log folder.")
    ap.add_argument("dir", help="gpu_check.sh's log folder (its OUT)")
    ap.add_argument("--out", help="markdown file to write (default DIR/targets.md)")
    a = ap.parse_args()
    if not os.path.isdir(a.dir):
        print("gpu_targets: error: %s is not a directory" % a.dir, file=sys.stderr)
        return 1
    runs, att = load_gpu_check(a.dir)
    md = markdown(evaluate(runs, att), runs=runs)
    sys.stdout.write(md)
    sys.stdout.flush()
    out = a.out or os.path.join(a.dir, "targets.md")
    try:
        with open(out + ".tmp", "w") as f:
            f.write(md)
        os.replace(out + ".tmp", out)
    except OSError as e:
        print("gpu_targets: error: cannot write %s: %s" % (out, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
