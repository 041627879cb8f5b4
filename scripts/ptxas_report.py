#!/usr/bin/env python3
"""scripts/ptxas_report.py - registers, shared memory, stack and spills of every kernel the GPU
trainers compile (ptxas -v on sm_90 at the Makefile's -O3; its -lineinfo and compute_80 PTX do
not change the sm_90 code), as a markdown table. No GPU needed.

    scripts/ptxas_report.py [--out FILE.md] [--tsv FILE.tsv] [--arch 90] [--nvcc PATH] [SRC.cu ...]
    scripts/ptxas_report.py [--out ...] [--tsv ...] [--arch 90] --log SRC.cu=LOG [--log ...]

Default sources: train_gpt_baselines.cu and train_ldm.cu (every production kernel is instantiated
there). --log reads ptxas -v output that a build already made (the Makefile keeps each CUDA
target's in build/cuda/NAME.ptxas) instead of compiling SRC.cu again; every entry in it must be
for sm_ARCH (exit status 2 otherwise: the build used another CUDA_ARCH); the nvcc version in the
header is then that of --nvcc, not necessarily the build's. One row per kernel (demangled,
template arguments included; overloads merged, the worst of each column), with the sources that
compile it; the summary line counts kernels with spills.
Exit status: 0, or 1 when nvcc fails or its output has no kernel entries (the report would be
empty). --tsv also writes one line per mangled kernel name, "name<TAB>registers<TAB>static smem B"
(the worst over sources), for scripts/launch_check.py.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
PROPS = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def demangle(names):
    """Itanium names -> C++ (c++filt), unchanged when c++filt is missing."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(name):
    """Readable kernel name: no namespaces of this project, no parameter list."""
    name = name.replace("ldm::gpu::", "").replace("ldm::", "")
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list starts at the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    return name[:cut]


def parse(text):
    """ptxas -v output -> {mangled: dict(regs, smem, stack, spill_st, spill_ld)}."""
    k = {}
    cur = None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = m.group(1)
            k.setdefault(cur, {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0})
            continue
        m = PROPS.search(line)
        if m:
            cur = m.group(1)
            k.setdefault(cur, {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0})
            continue
        if cur is None:
            continue
        m = FRAME.search(line)
        if m:
            k[cur]["stack"] = int(m.group(1))
            k[cur]["spill_st"] = int(m.group(2))
            k[cur]["spill_ld"] = int(m.group(3))
            continue
        m = USED.search(line)
        if m:
            k[cur]["regs"] = int(m.group(1))
            k[cur]["smem"] = int(m.group(2) or 0)
    return k


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="*", help="default (without --log): train_gpt_baselines.cu train_ldm.cu")
    ap.add_argument("--out", help="write the markdown here (atomically) instead of stdout")
    ap.add_argument("--tsv", help="also write mangled name, registers, static smem per kernel here (atomically)")
    ap.add_argument("--arch", default="90", help="SM version to compile for (default 90: Hopper)")
    ap.add_argument("--log", action="append", default=[], metavar="SRC=LOG",
                    help="parse LOG (ptxas -v output of a build of SRC) instead of compiling; repeatable")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc",
                    help="the nvcc to use (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)")
    a = ap.parse_args()
    logs = []  # (source, ptxas -v text)
    for spec in a.log:
        src, sep, path = spec.partition("=")
        if not sep or not src or not path:
            print("error: --log wants SRC=LOG, got %r" % spec, file=sys.stderr)
            return 1
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            print("error: cannot read %s: %s" % (path, e), file=sys.stderr)
            return 1
        archs = set(m.group(2) for m in ENTRY.finditer(text))
        if archs != {"sm_" + a.arch}:
            print("error: %s has entries for %s, not sm_%s alone" % (path, ", ".join(sorted(archs)) or "no arch",
                                                                     a.arch), file=sys.stderr)
            return 2
        logs.append((src, text))
    if a.log and a.sources:
        print("error: give sources to compile or --log, not both", file=sys.stderr)
        return 1
    if not a.log and not a.sources:
        a.sources = ["train_gpt_baselines.cu", "train_ldm.cu"]
    if a.sources and not os.path.exists(a.nvcc):
        print("error: no nvcc (tried %s); pass --nvcc" % a.nvcc, file=sys.stderr)
        return 1
    for src in a.sources:
        path = os.path.join(ROOT, src) if not os.path.isabs(src) else src
        if not os.path.exists(path):
            print("error: no such source: %s" % src, file=sys.stderr)
            return 1
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [a.nvcc, "-O3", "-std=c++17", "-I" + ROOT, "-arch=sm_" + a.arch, "-cubin", "-Xptxas", "-v",
                   "-Xcompiler", "-fopenmp", "-o", os.path.join(tmp, "k.cubin"), path]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            print("error: nvcc failed on %s" % src, file=sys.stderr)
            return 1
        logs.append((src, p.stderr + p.stdout))
    merged = {}  # kernel name -> worst resources over instantiations and sources
    by_mangled = {}  # mangled name -> (registers, static smem), worst over sources
    for src, text in logs:
        k = parse(text)
        # ptxas's own notices (e.g. "Potential Performance Loss: wgmma.mma_async instructions are
        # serialized ..."), echoed so that callers (test_ptxas) can refuse them
        for line in text.splitlines():
            if "warning" in line.lower() or "performance loss" in line.lower():
                print("ptxas_report: ptxas notice (%s): %s" % (src, line.strip()))
        if not k:
            print("error: no kernel entries in ptxas output for %s" % src, file=sys.stderr)
            return 1
        names = demangle(sorted(k))
        for mangled, v in k.items():
            r0, s0 = by_mangled.get(mangled, (0, 0))
            by_mangled[mangled] = (max(r0, v["regs"]), max(s0, v["smem"]))
            key = short(names[mangled])
            w = merged.setdefault(key, dict(v, srcs=[]))
            if os.path.basename(src) not in w["srcs"]:
                w["srcs"].append(os.path.basename(src))
            for f in ("regs", "smem", "stack", "spill_st", "spill_ld"):
                w[f] = max(w[f], v[f])
    rows = [(", ".join(v["srcs"]), key, v) for key, v in merged.items()]
    ver = subprocess.run([a.nvcc, "--version"], capture_output=True, text=True).stdout if os.path.exists(a.nvcc) else ""
    m = re.search(r"release [0-9.]+, V([0-9.]+)", ver)
    nvcc_version = m.group(1) if m else "unknown"
    flags = ("the Makefile's flags and `-Xptxas -v` (the build's log)" if a.log else
             "`-O3 -arch=sm_%s -Xptxas -v`" % a.arch)
    rows.sort(key=lambda r: (-(r[2]["spill_st"] + r[2]["spill_ld"]), -r[2]["regs"], r[0], r[1]))
    spilling = [r for r in rows if r[2]["spill_st"] or r[2]["spill_ld"]]
    L = ["# ptxas resource usage of the GPU trainers' kernels (sm_%s)" % a.arch, "",
         "Generated by `scripts/ptxas_report.py` (nvcc %s, %s, the trainers' code; "
         "other nvcc versions move a few registers and spill bytes). "
         "One row per kernel (template arguments included) over the sources that instantiate it (the worst "
         "of each column); "
         "shared memory is the static `__shared__` size (dynamic shared memory is set at launch). "
         "%d kernels, %d with spills." % (nvcc_version, flags, len(rows), len(spilling)), "",
         "| source | kernel | registers | static smem B | stack B | spill stores B | spill loads B |",
         "|---|---|---|---|---|---|---|"]
    for src, key, v in rows:
        L.append("| %s | `%s` | %d | %d | %d | %d | %d |" % (
            src, key.replace("|", "\\|"), v["regs"], v["smem"], v["stack"], v["spill_st"], v["spill_ld"]))
    text = "\n".join(L) + "\n"
    if a.tsv:
        tmp = a.tsv + ".tmp"
        with open(tmp, "w") as f:
            for mangled in sorted(by_mangled):
                f.write("%s\t%d\t%d\n" % (mangled, by_mangled[mangled][0], by_mangled[mangled][1]))
        os.replace(tmp, a.tsv)
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, a.out)
        print("ptxas_report: %d kernels, %d with spills -> %s" % (len(rows), len(spilling), a.out))
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
