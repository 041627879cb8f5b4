#!/usr/bin/env python3
"""dev/emu/gen.py - writes host-emulation copies of CUDA headers and workbenches (see
dev/emu/emu.h and doc/cuda.md "Emulating kernels on the CPU").

    python3 dev/emu/gen.py --out BUILD/emu cuda/scheme_ldm.cuh [dev/cuda/rmsnorm.cu ...]

cuda/X.cuh -> OUT/cuda_emu/X.cuh, dev/cuda/X.cuh -> OUT/cuda_emu/dev_cuda/X.cuh, and a
workbench dev/cuda/X.cu -> OUT/cuda_emu/dev_cuda/X.cu.h; the same, recursively, for every
cuda/*.cuh or dev/cuda/*.cuh they include. Rewrites:
  * `#include "dev/emu/emu.h"` first (the CUDA built-ins and runtime API on the host);
  * `#include "cuda/Y.cuh"` -> `#include "cuda_emu/Y.cuh"` (compile with -IOUT), same for
    dev/cuda/Y.cuh;
  * `kernel<<<grid, block[, smem[, stream]]>>>(args)` -> `::emu::launch(grid, block, smem,
    stream, kernel, args)`;
  * `extern __shared__ [__align__(n)] T name[];` -> `T* name = (T*)::emu::dyn_smem();`;
  * `__shared__ T a[..], b;` inside a function -> `static T a__emu[..], b__emu;` plus
    `auto& a = ::emu::block_shared(a__emu);` for each declarator (the object poisoned once per
    block; under ThreadSanitizer a fresh copy per block);
  * `__trap();  // host: KEY` -> `EMU_HOST_KEY;` (lets a harness define emulations of inline-asm
    paths, e.g. `#define EMU_HOST_mma ::emu::mma_m16n8k16_bf16(c, a, b)`);
  * `__global__ void [__launch_bounds__(N[, ..])] name(..) {` -> the same with
    `::emu::kernel_entry();` as the body's first statement (where a thread ends under
    $EMU_LAUNCH_ONLY), preceded by `::emu::check_launch_bounds((long)(N));` where the kernel
    declares __launch_bounds__ (aborts on a launch with more threads per block than N, which a
    GPU refuses);
  * `reinterpret_cast<E*>(p)` -> `::emu::aligned_cast<E*>(p)` (aborts when p is not aligned to
    alignof(E): a misaligned vector access faults on a GPU, not on x86);
  * `struct Matmul {...};` (cuBLASLt, matmul.cuh) -> dev/emu/matmul_host.h (host loops);
  * `#include <nccl.h>` -> dev/emu/nccl_emu.h (NCCL on host memory; MPI between ranks);
  * in a workbench, `int main(` -> `int workbench_main(` (a harness calls its static check
    functions, or workbench_main with its flags: test/emu_workbench_cases.h). A top-level program (train_ldm.cu ->
    OUT/cuda_emu/train_ldm.cu.h) keeps its main(): dev/emu/program.cpp includes it to build the
    emulated program, and a test that includes it defines TESTING first (the main is guarded).
Prints one line per file with the number of rewrites; exits non-zero when a file does not exist.
"""
import argparse
import os
import re
import sys

INCLUDE_RE = re.compile(r'#include\s+"((?:dev/)?cuda/[A-Za-z0-9_]+\.cuh|[A-Za-z0-9_]+\.cu)"')
NCCL_RE = re.compile(r'#include\s+<nccl\.h>')
KERNEL_NAME = r'((?:::)?[A-Za-z_][A-Za-z_0-9:]*(?:<[^<>;]*(?:<[^<>;]*>[^<>;]*)*>)?)'
LAUNCH_RE = re.compile(KERNEL_NAME + r'\s*<<<(.*?)>>>\s*\(', re.S)
EXTERN_SHARED_RE = re.compile(
    r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][A-Za-z_0-9:<>\s]*?)\s+([A-Za-z_]\w*)\s*\[\s*\]\s*;')
SHARED_RE = re.compile(r'^([ \t]*)__shared__\s+((?:__align__\s*\(\s*\d+\s*\)\s+)?[^;]*);', re.M)
TRAP_RE = re.compile(r'__trap\(\);\s*//\s*host:\s*([A-Za-z_0-9]+)')
# reinterpret_cast<TYPE*>( with TYPE possibly one level templated (Vec4<T>*, const float4*)
PTR_CAST_RE = re.compile(r'\breinterpret_cast\s*<((?:[^<>;(){}]|<[^<>;(){}]*>)*\*)\s*>\s*\(')


def split_top(s, sep=','):
    """Splits s at `sep` outside (), [], {}, <> nesting."""
    out, depth, cur = [], 0, ''
    for ch in s:
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ''
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out]


GLOBAL_RE = re.compile(r'\b__global__\b')
KERNEL_RE = re.compile(r'__global__\s+void\s+')
LAUNCH_BOUNDS_RE = re.compile(r'__launch_bounds__\s*\(')


def match_paren(s, i):
    """Index of the ')' closing the '(' at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == '(':
            depth += 1
        elif s[j] == ')':
            depth -= 1
            if depth == 0:
                return j
    raise SystemExit('gen.py: unbalanced parentheses after: %s' % s[i:i + 60])


def rewrite_kernels(s):
    """Inserts ::emu::kernel_entry() as the first statement of every kernel body
    (`__global__ void [__launch_bounds__(N, ..)] name(..) {`), preceded by
    ::emu::check_launch_bounds(N) where the kernel declares __launch_bounds__; a declaration without
    a body is left alone, and so is `__global__` in a // comment; any other spelling of a kernel
    is an error (its threads would not end at kernel_entry). Returns (s, kernels, bounds)."""
    out, pos, n, nb = [], 0, 0, 0
    while True:
        g = GLOBAL_RE.search(s, pos)
        if not g:
            break
        if '//' in s[s.rfind('\n', 0, g.start()) + 1:g.start()]:
            out.append(s[pos:g.end()])
            pos = g.end()
            continue
        m = KERNEL_RE.match(s, g.start())
        if not m:
            raise SystemExit('gen.py: a kernel not spelled `__global__ void [__launch_bounds__(..)] name(..)`: %s'
                             % s[g.start():g.start() + 80])
        lb = LAUNCH_BOUNDS_RE.match(s, m.end())
        bound = None
        after = m.end()
        if lb:
            close = match_paren(s, lb.end() - 1)
            args = split_top(s[lb.end():close])
            if not args or not args[0]:
                raise SystemExit('gen.py: empty __launch_bounds__: %s' % s[m.start():close + 1])
            bound, after = args[0], close + 1
        params = s.index('(', after)
        end = match_paren(s, params)
        body = re.match(r'[^;{]*([;{])', s[end + 1:])
        if not body:
            raise SystemExit('gen.py: no body or ";" after a kernel: %s' % s[m.start():end + 1])
        at = end + 1 + body.end()
        out.append(s[pos:at])
        if body.group(1) == '{':
            if bound is not None:
                out.append(' ::emu::check_launch_bounds((long)(%s));' % bound)
                nb += 1
            out.append(' ::emu::kernel_entry();')
            n += 1
        pos = at
    out.append(s[pos:])
    return ''.join(out), n, nb


def rewrite_launch(m):
    name, cfg = m.group(1), split_top(m.group(2).replace('\\\n', ' '))
    if not 2 <= len(cfg) <= 4:
        raise SystemExit('gen.py: cannot parse launch configuration <<<%s>>>' % m.group(2))
    while len(cfg) < 4:
        cfg.append('0')
    return '::emu::launch(%s, %s, ' % (', '.join(cfg), name)


def rewrite_shared(m):
    indent, decl = m.group(1), m.group(2).strip()
    # type = leading tokens before the first declarator; declarators split at top-level commas
    parts = split_top(decl)
    first = parts[0]
    # the declarator name is the LAST identifier before the array brackets
    head = re.match(r'^(.*\W)?([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$', first.split('=')[0].strip(), re.S)
    if not head:
        raise SystemExit('gen.py: cannot parse __shared__ declaration: %s' % decl)
    typ = (head.group(1) or '').strip()
    names = [head.group(2)]
    for p in parts[1:]:
        pm = re.match(r'^\**\s*([A-Za-z_]\w*)', p)
        if not pm:
            raise SystemExit('gen.py: cannot parse __shared__ declarator: %s' % p)
        names.append(pm.group(1))
    if not typ:
        raise SystemExit('gen.py: no type in __shared__ declaration: %s' % decl)
    if not indent:  # namespace scope (no statement possible): a static, not poisoned per block
        return 'static %s;' % decl
    # each declarator's object becomes NAME__emu; NAME is a reference to what the running block
    # sees (emu::block_shared: NAME__emu poisoned once per block, or a per-block copy under
    # ThreadSanitizer)
    renamed = [re.sub(r'\b%s\b' % re.escape(n), n + '__emu', p, count=1) for n, p in zip(names, parts)]
    refs = ' '.join('auto& %s = ::emu::block_shared(%s__emu);' % (n, n) for n in names)
    return '%sstatic %s; %s' % (indent, ', '.join(renamed), refs)


def emu_name(rel):
    """Repository path of a header/workbench -> its path under OUT (and in #include lines)."""
    rel = os.path.normpath(rel)
    if rel.startswith('dev/cuda/'):
        base = 'cuda_emu/dev_cuda/' + os.path.basename(rel)
    elif rel.startswith('cuda/'):
        base = 'cuda_emu/' + os.path.basename(rel)
    elif '/' not in rel and rel.endswith('.cu'):  # a top-level program (train_ldm.cu, ...)
        base = 'cuda_emu/' + rel
    else:
        raise SystemExit('gen.py: only cuda/*.cuh, dev/cuda/*.cuh, dev/cuda/*.cu and top-level *.cu are converted: %s' % rel)
    return base + '.h' if base.endswith('.cu') else base


def replace_matmul(s):
    """Replaces `struct Matmul { ... };` (cuBLASLt) by the host stand-in dev/emu/matmul_host.h."""
    i = s.find('struct Matmul {')
    if i < 0:
        return s, 0
    depth, j = 0, s.index('{', i)
    while True:
        if s[j] == '{':
            depth += 1
        elif s[j] == '}':
            depth -= 1
            if depth == 0:
                break
        j += 1
    end = s.index(';', j) + 1
    return s[:i] + '#include "dev/emu/matmul_host.h"  // host GEMM instead of cuBLASLt' + s[end:], 1


def convert(rel, root, out_dir, done, log):
    rel = os.path.normpath(rel)
    if rel in done:
        return
    done.add(rel)
    src_path = os.path.join(root, rel)
    if not os.path.exists(src_path):
        raise SystemExit('gen.py: no such file: %s' % src_path)
    s = open(src_path).read()
    deps = INCLUDE_RE.findall(s)
    s = INCLUDE_RE.sub(lambda m: '#include "%s"' % emu_name(m.group(1)), s)
    s, n_launch = LAUNCH_RE.subn(rewrite_launch, s)
    s, n_ext = EXTERN_SHARED_RE.subn(
        lambda m: '%s* %s = reinterpret_cast<%s*>(::emu::dyn_smem());' % (m.group(1).strip(), m.group(2), m.group(1).strip()), s)
    s, n_sh = SHARED_RE.subn(rewrite_shared, s)
    s, n_kern, n_lb = rewrite_kernels(s)
    s, n_trap = TRAP_RE.subn(lambda m: 'EMU_HOST_%s;' % m.group(1), s)
    s, n_cast = PTR_CAST_RE.subn(lambda m: '::emu::aligned_cast<%s>(' % m.group(1).strip(), s)
    s, n_mm = replace_matmul(s)
    s, n_nccl = NCCL_RE.subn('#include "dev/emu/nccl_emu.h"  // NCCL on host memory (MPI for several ranks)', s)
    n_main = 0
    if rel.startswith('dev/cuda/') and rel.endswith('.cu'):  # a workbench: main() -> workbench_main() for a harness
        s, n_main = re.subn(r'\bint\s+main\s*\(', 'int workbench_main(', s)
    header = ('// GENERATED by dev/emu/gen.py from %s for host emulation: do not edit.\n'
              '#include "dev/emu/emu.h"\n' % rel)
    if '#pragma once' in s:
        s = s.replace('#pragma once', '#pragma once\n' + header, 1)
    else:
        s = '#pragma once\n' + header + s
    dst = os.path.join(out_dir, emu_name(rel))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = dst + '.tmp'
    with open(tmp, 'w') as f:
        f.write(s)
    os.replace(tmp, dst)
    log.append('%s -> %s: %d launches, %d kernels (%d with launch bounds), %d extern shared, %d shared, %d host traps, '
               '%d pointer casts%s%s' % (
        rel, emu_name(rel), n_launch, n_kern, n_lb, n_ext, n_sh, n_trap, n_cast, ', Matmul -> host GEMM' if n_mm else '',
        ', main -> workbench_main' if n_main else '') + (', NCCL -> dev/emu/nccl_emu.h' if n_nccl else ''))
    for d in deps:
        convert(d, root, out_dir, done, log)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', required=True, help='output directory (headers go to OUT/cuda_emu/)')
    ap.add_argument('--root', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'),
                    help='repository root (default: two levels above this script)')
    ap.add_argument('-q', '--quiet', action='store_true')
    ap.add_argument('headers', nargs='+', help='cuda/X.cuh, dev/cuda/X.cuh or dev/cuda/X.cu (workbench), '
                    'relative to the repository root')
    a = ap.parse_args()
    done, log = set(), []
    root = os.path.abspath(a.root)
    for h in a.headers:
        rel = os.path.relpath(os.path.abspath(h), root) if os.path.exists(h) else h
        convert(rel, root, a.out, done, log)
    if not a.quiet:
        for line in log:
            print('gen.py:', line)


if __name__ == '__main__':
    main()
