#!/usr/bin/env python3
"""scripts/launch_check.py - checks the launches an emulated run made against the resources ptxas
gives each kernel on sm_90: what the CPU emulation (dev/emu) cannot see, since it knows neither
registers nor the static shared memory of declarations no thread reached. No GPU needed.

    scripts/launch_check.py --ptxas KERNELS.tsv --launches LOG [--min-matched N]

KERNELS.tsv: scripts/ptxas_report.py --tsv (mangled name, registers, static smem B). LOG: the
$EMU_LAUNCH_LOG of emulated runs (dev/emu/emu.h: mangled name, threads, dynamic smem B, opt-in B
or -1, static smem B the emulation saw). Per launch configuration, the sm_90 limits:
  * registers: per warp ceil(regs / 8) * 256 (allocation unit 256 per warp), at most 65536 per
    block (a block above fails with "too many resources requested for launch");
  * shared memory: ptxas static + dynamic <= 48 KiB without the opt-in; with it dynamic <= opt-in
    and static + opt-in <= 227 KiB;
  * the emulation's static count is at most ptxas's (else the two disagree about the kernel: the
    emulation counts every __shared__ declaration a thread reaches, ptxas drops an array the kernel
    never reads or writes, so a kernel should not declare one it does not use).
Prints one line per violation and a summary; exit status 1 on a violation, on a malformed line,
or when fewer than N launch configurations were matched to a ptxas kernel (default 1).
"""
import argparse
import sys

REGS_PER_BLOCK = 65536
REG_UNIT_PER_WARP = 256
SMEM_DEFAULT = 48 * 1024
SMEM_OPTIN = 227 * 1024


def block_registers(regs, threads):
    """Registers a block of `threads` takes on sm_90 for a kernel of `regs` per thread."""
    warps = (threads + 31) // 32
    per_warp = -(-regs * 32 // REG_UNIT_PER_WARP) * REG_UNIT_PER_WARP
    return warps * per_warp


def violations(name, regs, static, threads, dyn, optin, emu_static):
    """The limits one launch configuration breaks (list of messages; the static disagreement last)."""
    out = []
    br = block_registers(regs, threads)
    if br > REGS_PER_BLOCK:
        out.append("%d threads x %d registers need %d registers per block (limit %d)" % (
            threads, regs, br, REGS_PER_BLOCK))
    if optin < 0 and static + dyn > SMEM_DEFAULT:
        out.append("%d B static + %d B dynamic shared memory above 48 KiB without the opt-in" % (static, dyn))
    if optin >= 0 and dyn > optin:
        out.append("%d B dynamic shared memory above the opt-in of %d B" % (dyn, optin))
    if optin >= 0 and static + optin > SMEM_OPTIN:
        out.append("%d B static + opt-in %d B above 227 KiB" % (static, optin))
    if emu_static > static:
        out.append("the emulation saw %d B static shared memory, ptxas %d B" % (emu_static, static))
    return out


def read_tsv(path, nfields):
    """The lines of a tab-separated file, each split into its nfields fields (ValueError otherwise)."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            c = line.rstrip("\n").split("\t")
            if len(c) != nfields:
                raise ValueError("%s:%d: expected %d tab-separated fields" % (path, i, nfields))
            rows.append(c)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ptxas", required=True, help="scripts/ptxas_report.py --tsv output")
    ap.add_argument("--launches", required=True, help="$EMU_LAUNCH_LOG of emulated runs")
    ap.add_argument("--min-matched", type=int, default=1,
                    help="fail when fewer launch configurations than this match a ptxas kernel (default 1)")
    a = ap.parse_args()
    try:
        kernels = {c[0]: (int(c[1]), int(c[2])) for c in read_tsv(a.ptxas, 3)}
        configs = {(c[0], int(c[1]), int(c[2]), int(c[3]), int(c[4])) for c in read_tsv(a.launches, 5)}
    except (OSError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    matched, unresolved, unknown, bad = 0, 0, set(), 0
    worst = (0.0, "")
    for name, threads, dyn, optin, emu_static in sorted(configs):
        if name == "?":
            unresolved += 1
            continue
        if name not in kernels:
            unknown.add(name)
            continue
        matched += 1
        regs, static = kernels[name]
        frac = block_registers(regs, threads) / REGS_PER_BLOCK
        if frac > worst[0]:
            worst = (frac, "%s (%d threads, %d registers)" % (name, threads, regs))
        for v in violations(name, regs, static, threads, dyn, optin, emu_static):
            print("VIOLATION %s: %s" % (name, v))
            bad += 1
    print("launch_check: %d launch configurations, %d matched to ptxas kernels, %d unresolved symbols, "
          "%d kernels ptxas did not report, %d violations; most registers per block: %.0f%% of the limit, %s" % (
              len(configs), matched, unresolved, len(unknown), bad, 100 * worst[0], worst[1] or "-"))
    for name in sorted(unknown):
        print("  not in the ptxas report: %s" % name)
    if matched < a.min_matched:
        print("error: only %d launch configurations matched (need %d)" % (matched, a.min_matched), file=sys.stderr)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
