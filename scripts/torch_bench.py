#!/usr/bin/python3
"""PyTorch peer of the training benchmark (../shared/spec/performance.md), the per-item runner
and the report writer used by scripts/bench_cpu_schemes.sh and scripts/bench_gpu.sh.

  torch_bench.py bench --preset small --scheme ldm [--ldm-rule rls] [--no-residual] -B 4 -T 256
        [--steps 10] [--warmup 2] [--device cpu|cuda] [--mode eager|compile] [--dtype fp32|bf16]
        [--n-layer N] [--d-model D] [--vocab-size V] [--threads N] [--grad-clip C]
        [--spec-bin build/generate_cpu]
      One training configuration in PyTorch: forward + backward + global-norm gradient clip
      (--grad-clip, default 1.0 as the C++ trainers; 0 = off) + AdamW step on a fixed random
      batch, median step time of --steps steps after --warmup steps. Prints
      BENCH {"tokens_per_s", "step_ms", "peak_mem_gib", ...}.
  torch_bench.py run --rows ROWS.jsonl --impl cpp|torch-eager|torch-compile --label SCHEME
        --shape NAME [--timeout S] [--log FILE] -- CMD ARGS...
      Runs CMD (its own process group), keeps its output in --log, takes its last `BENCH {json}`
      line, its wall time and its peak RSS (wait4), and appends one JSON row to ROWS (status ok |
      error | timeout | oom). Exit status 0 even when CMD failed (the row says so).
  torch_bench.py check DUMP [DUMP ...]
      The peer's loss on `train_cpu --dump-debug-state` dumps equals the C++ reference's (fp64:
      1e-9 relative, fp32: 1e-4): the peer is the same model.
  torch_bench.py report --kind cpu|gpu --rows ROWS.jsonl --out DIR [--title TEXT]
      Writes DIR/bench.md, DIR/bench.csv, DIR/bench_tokens.png and DIR/bench_memory.png:
      tokens/s and peak memory per scheme and shape, ratios vs PreLN and vs PyTorch (eager,
      torch.compile), MFU (GPU), and the spec's targets marked met / missed.

The model is the spec §1 backbone written here in PyTorch (RMSNorm, RoPE rotate-half, causal GQA
attention through F.scaled_dot_product_attention when available, SwiGLU, tied or untied head,
cross-entropy over the real V) with the depth-aggregation schemes of scripts/torch_ref.py (HC,
mHC, AttnRes Full/Block, LDM rls/delta/outer, written from the spec, autograd backward). The
configuration and the parameter layout come from the C++ side (`generate_cpu --print-config`),
so both sides time exactly the same shapes. Parameter values are random (timing does not depend
on them): matrices N(0, 0.02), norm gains 1, biases 0, scheme parameters at their spec init
(HC/mHC/AttnRes) or small values (LDM).
"""
import argparse
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ---------------------------------------------------------------------------------------------
# bench: the PyTorch peer
# ---------------------------------------------------------------------------------------------

def load_spec(a):
    cmd = [a.spec_bin, "--preset", a.preset, "--scheme", a.scheme, "--seq-len", str(a.T), "--print-config",
           "--ldm-rule", a.ldm_rule]
    if a.no_residual:
        cmd.append("--no-residual")
    if a.n_layer:
        cmd += ["--n-layer", str(a.n_layer)]
    if a.d_model:
        cmd += ["--d-model", str(a.d_model)]
    if a.vocab_size:
        cmd += ["--vocab-size", str(a.vocab_size)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def init_params(torch, cfg, specs, device):
    """Random parameters in param_specs order (values irrelevant for timing, kept well-scaled)."""
    g = torch.Generator(device=device).manual_seed(1234)
    P = {}
    n = cfg["hc_streams"]
    for s in specs:
        name, shape = s["name"], s["shape"]
        leaf = name.split(".")[-1]
        t = None
        if name.endswith("norm.w") or (name.startswith("scheme.attnres") and leaf == "g"):
            t = torch.ones(shape)
        elif leaf in ("bq", "bk", "bv", "b_pre", "b_post", "b_res", "bbeta", "theta") or \
                (name.startswith("scheme.attnres") and leaf == "w"):
            t = torch.zeros(shape)
        elif leaf in ("s_a", "s_b", "a_pre", "a_post", "a_res"):
            t = torch.full(shape, 0.01)
        elif leaf == "a_m0":
            j = int(name.split(".")[2])
            t = torch.zeros(shape)
            t[(j - 1) % n] = 1
        elif leaf == "a_r0":
            t = torch.eye(n)
        elif leaf == "b0":
            t = torch.ones(shape)
        elif name.startswith("scheme.ldm.a."):
            t = torch.ones(shape)
        elif name.startswith("scheme.hc.") and leaf in ("w_m", "w_r", "w_b"):
            t = torch.zeros(shape)
        if t is None:  # matrices: N(0, 0.02), drawn on the device (fast for the large presets)
            t = torch.randn(shape, generator=g, device=device) * 0.02
        P[name] = t.to(device).requires_grad_(True)
    return P


def sdpa_choice(torch, cfg, T, device, dtype):
    """Which backend F.scaled_dot_product_attention runs for this model's causal attention
    (q [1, n_head, T, head_dim], k/v with n_kv_head heads, dtype) on `device`, and whether it takes
    the GQA heads natively (enable_gqa=True) or after repeat_interleave. Returns (backend name,
    gqa) with gqa in "native" | "repeat" | "none" (n_head == n_kv_head). The backend is PyTorch's
    own choice (torch._fused_sdp_choice, the function SDPA dispatches on); "unknown (...)" when this
    torch version cannot tell. GQA is taken natively only where that keeps a fused backend."""
    F = torch.nn.functional
    if getattr(F, "scaled_dot_product_attention", None) is None:
        return "none (no F.scaled_dot_product_attention: explicit softmax)", "repeat" if cfg["n_head"] != cfg["n_kv_head"] else "none"
    nh, nkv, hd = cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    q = torch.zeros(1, nh, T, hd, device=device, dtype=dtype)
    kv = torch.zeros(1, nkv, T, hd, device=device, dtype=dtype)

    def choice(k, **kw):
        try:
            from torch.nn.attention import SDPBackend
            return SDPBackend(int(torch._fused_sdp_choice(q, k, k, is_causal=True, **kw))).name.lower()
        except Exception as e:  # private API: absent or different in this version
            return "unknown (%s)" % type(e).__name__

    if nh == nkv:
        return choice(kv), "none"
    native = choice(kv, enable_gqa=True)
    if native in ("flash_attention", "efficient_attention", "cudnn_attention"):
        return native, "native"
    return choice(kv.repeat_interleave(nh // nkv, dim=1)), "repeat"


def make_loss_fn(torch, ref, cfg, T, device, table_dtype=None, gqa_native=False):
    """The loss of the model (spec §1 + the scheme) as a function of (P, tokens, targets).
    gqa_native: grouped K/V go to SDPA with enable_gqa=True (see sdpa_choice), else they are
    repeated to n_head heads first."""
    F = torch.nn.functional
    d, nh, nkv, hd = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    V, eps, theta, L = cfg["vocab_size"], cfg["norm_eps"], cfg["rope_theta"], cfg["n_layer"]
    scheme, group = cfg["scheme"], nh // nkv
    half = hd // 2
    inv = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    tdt = table_dtype or torch.float32
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(device=device, dtype=tdt)  # [T, hd]
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(device=device, dtype=tdt)
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()

    def rms(x, w):  # statistics in at least fp32 (bf16 activations under autocast)
        xs = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return w * x * torch.rsqrt(xs.pow(2).mean(dim=-1, keepdim=True) + eps).to(x.dtype)

    def rope(x):  # [B, H, T, hd]
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)

    class LdmMemoryOn(ref.LdmMemory):
        """torch_ref's LdmMemory with its initial state (S = 0, P = I/delta) allocated on the
        embedding's device (torch_ref allocates on the default device, the CPU)."""

        def __init__(self, cfg, P, e):  # the same fields as ref.LdmMemory.__init__
            self.P_, self.cfg = P, cfg
            B, T, d = e.shape
            self.Hm, self.dk = cfg["ldm_heads"], cfg["ldm_dk"]
            self.dv = d // self.Hm
            self.rule, self.res = cfg["ldm_rule"], cfg["ldm_residual"]
            self.forget = cfg["ldm_forget"] and self.rule != "delta"
            self.D = 2 * cfg["n_layer"]
            self.S = torch.zeros(B, T, self.Hm, self.dv, self.dk, dtype=e.dtype, device=e.device)
            eye = torch.eye(self.dk, dtype=e.dtype, device=e.device) / cfg["ldm_delta"]
            self.Pm = eye.expand(B, T, self.Hm, self.dk, self.dk).clone()
            self.src = e
            self.write(0, e)

    def loss_fn(P, tokens, targets):
        B = tokens.shape[0]
        h = P["wte"][tokens]
        mem = None
        if scheme == "ldm":
            mem = LdmMemoryOn(cfg, P, h)
        elif scheme in ("hc", "mhc"):
            mem = ref.HyperStreams(cfg, P, h, scheme == "mhc")
        elif scheme in ("attnres-full", "attnres-block"):
            mem = ref.AttnResidual(cfg, P, h, scheme == "attnres-block")
        for l in range(L):
            p = "blocks.%d." % l
            x = rms(mem.input(2 * l + 1) if mem else h, P[p + "attn_norm.w"])
            q, k, v = x @ P[p + "attn.wq"].T, x @ P[p + "attn.wk"].T, x @ P[p + "attn.wv"].T
            if cfg["qkv_bias"]:
                q, k, v = q + P[p + "attn.bq"], k + P[p + "attn.bk"], v + P[p + "attn.bv"]
            q = q.view(B, T, nh, hd).transpose(1, 2)
            k = k.view(B, T, nkv, hd).transpose(1, 2)
            v = v.view(B, T, nkv, hd).transpose(1, 2)
            if cfg["qk_norm"]:
                q, k = rms(q, P[p + "attn.q_norm.w"]), rms(k, P[p + "attn.k_norm.w"])
            q, k = rope(q), rope(k)
            native = group > 1 and gqa_native and sdpa is not None
            if group > 1 and not native:
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            if native:
                a = sdpa(q, k, v, is_causal=True, enable_gqa=True)
            elif sdpa is not None:
                a = sdpa(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
                a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
            o = a.transpose(1, 2).reshape(B, T, nh * hd) @ P[p + "attn.wo"].T
            if mem:
                mem.output(2 * l + 1, o)
            else:
                h = h + o
            x = rms(mem.input(2 * l + 2) if mem else h, P[p + "mlp_norm.w"])
            o = (F.silu(x @ P[p + "mlp.w1"].T) * (x @ P[p + "mlp.w3"].T)) @ P[p + "mlp.w2"].T
            if mem:
                mem.output(2 * l + 2, o)
            else:
                h = h + o
        y = rms(mem.input(2 * L + 1) if mem else h, P["final_norm.w"])
        W = P["wte"] if cfg["tied"] else P["lm_head"]
        logits = (y @ W.T)[..., :V]
        lg = logits.reshape(B * T, V)
        return F.cross_entropy(lg.float() if lg.dtype in (torch.float16, torch.bfloat16) else lg, targets.reshape(B * T))

    return loss_fn


def cmd_bench(a):
    import torch
    sys.path.insert(0, HERE)
    import torch_ref as ref  # the spec's schemes (HC, mHC, AttnRes, LDM)

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    elif a.device == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spec = load_spec(a)
    cfg = spec["config"]
    dev = torch.device(a.device)
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda but torch.cuda.is_available() is false", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    P = init_params(torch, cfg, spec["param_specs"], dev)
    params = list(P.values())
    kw = {"lr": 1e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}
    opt = None
    if a.device == "cuda":
        try:
            opt = torch.optim.AdamW(params, fused=True, **kw)
        except (TypeError, RuntimeError):
            opt = None
    if opt is None:
        opt = torch.optim.AdamW(params, **kw)
    g = torch.Generator().manual_seed(7)
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (a.B, a.T), generator=g).to(dev)
    targets = torch.randint(0, V, (a.B, a.T), generator=g).to(dev)
    backend, gqa = sdpa_choice(torch, cfg, a.T, dev, torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    loss_fn = make_loss_fn(torch, ref, cfg, a.T, dev, gqa_native=gqa == "native")
    if a.mode == "compile":
        if not hasattr(torch, "compile"):
            print("error: torch %s has no torch.compile" % torch.__version__, file=sys.stderr)
            return 2
        loss_fn = torch.compile(loss_fn)
    use_amp = a.dtype == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        if use_amp:
            with torch.autocast(device_type=a.device, dtype=torch.bfloat16):
                loss = loss_fn(P, tokens, targets)
        else:
            loss = loss_fn(P, tokens, targets)
        loss.backward()
        if a.grad_clip > 0:  # as the C++ trainers (global-norm clip, --grad-clip 1.0 by default)
            torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        return loss

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    t_start = time.time()
    for _ in range(a.warmup):
        loss = step()
    sync()
    warm_s = time.time() - t_start
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    lv = float(loss.detach().float().cpu())
    times.sort()
    med = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
    r = {"type": "bench", "trainer": "torch-" + a.mode, "device": a.device, "preset": a.preset,
         "scheme": cfg["scheme"], "ldm_rule": cfg["ldm_rule"], "ldm_residual": cfg["ldm_residual"],
         "ldm_dk": cfg.get("ldm_dk"),
         "dtype": a.dtype, "B": a.B, "T": a.T, "n_layer": cfg["n_layer"], "param_count": spec["param_count"],
         "steps_timed": a.steps, "step_ms": med * 1e3, "step_ms_mean": 1e3 * sum(times) / len(times),
         "tokens_per_s": a.B * a.T / med, "warmup_s": warm_s, "loss": lv, "torch": torch.__version__,
         "threads": torch.get_num_threads(), "attention_backend": backend, "gqa": gqa,
         "grad_clip": a.grad_clip}
    if a.device == "cuda":
        r["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
        r["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2 ** 30
        r["gpu"] = torch.cuda.get_device_name(0)
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r["peak_mem_gib"] = rss / 2 ** 20
        r["rss_at_start_gib"] = rss0 / 2 ** 20
    print("BENCH " + json.dumps(r, sort_keys=True))
    sys.stdout.flush()
    return 0


def cmd_check(a):
    """The peer's loss on debug-state dumps of the C++ reference (train_cpu --dump-debug-state)."""
    import numpy as np
    import torch
    sys.path.insert(0, HERE)
    import torch_ref as ref
    bad = 0
    for path in a.dumps:
        header, ts = ref.read_container(path)
        cfg = header["config"]
        dt = torch.float64 if header["dtype"] == "fp64" else torch.float32
        tol = 1e-9 if header["dtype"] == "fp64" else 1e-4
        P = {}
        for s in header["param_specs"]:
            v = ts["params"][s["offset"]:s["offset"] + s["numel"]].reshape(s["shape"])
            P[s["name"]] = torch.tensor(v.astype(np.float64), dtype=dt)
        tokens = torch.tensor(ts["inputs"].astype(np.int64))
        targets = torch.tensor(ts["targets"].astype(np.int64))
        loss = float(make_loss_fn(torch, ref, cfg, header["T"], torch.device("cpu"), dt)(P, tokens, targets))
        rel = abs(loss - header["loss"]) / abs(header["loss"])
        ok = rel <= tol
        bad += not ok
        print("%s %s: C++ loss %.12g, torch_bench %.12g, rel %.2e %s" % (
            path, cfg["scheme"], header["loss"], loss, rel, "PASS" if ok else "FAIL"))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------
# run: one benchmark item with timeout, output log, BENCH line and peak RSS
# ---------------------------------------------------------------------------------------------

def cmd_run(a):
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        print("error: run needs a command after --", file=sys.stderr)
        return 2
    row = {"impl": a.impl, "label": a.label, "shape": a.shape, "cmd": " ".join(cmd)}
    if a.n_layer:
        row["n_layer"] = a.n_layer
    log = open(a.log, "w") if a.log else open(os.devnull, "w")
    t0 = time.time()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                             start_new_session=True)
    except OSError as e:
        row.update(status="error", note=str(e))
        p = None
    bench, lines, timed_out = None, [], False
    if p is not None:
        import threading

        def kill():
            nonlocal timed_out
            timed_out = True
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        timer = threading.Timer(a.timeout, kill) if a.timeout > 0 else None
        if timer:
            timer.start()
        for line in p.stdout:
            log.write(line)
            lines.append(line)
            lines = lines[-40:]
            if line.startswith("BENCH "):
                try:
                    bench = json.loads(line[6:])
                except ValueError:
                    pass
        _, status, ru = os.wait4(p.pid, 0)
        if timer:
            timer.cancel()
        rc = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else (status >> 8)
        row["rc"] = rc
        row["wall_s"] = time.time() - t0
        row["max_rss_gib"] = ru.ru_maxrss / 2 ** 20
        tail = "".join(lines[-6:]).strip()
        if timed_out:
            row.update(status="timeout", note="killed after %g s" % a.timeout)
        elif rc == 0 and bench is not None:
            row["status"] = "ok"
        else:
            low = tail.lower()
            oom = "out of memory" in low or "outofmemory" in low or "cudaerrormemoryallocation" in low
            row.update(status="oom" if oom else "error", note=tail[-400:])
    log.close()
    if bench is not None:
        row["bench"] = bench
    with open(a.rows, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
    msg = "%-14s %-16s %-22s %s" % (a.impl, a.label, a.shape, row.get("status"))
    if bench:
        msg += "  %.0f tokens/s  %.1f ms/step" % (bench.get("tokens_per_s", 0), bench.get("step_ms", 0))
    print(msg)
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------------------------------
# report: md + csv + png
# ---------------------------------------------------------------------------------------------

IMPLS = ("cpp", "torch-eager", "torch-compile")


def fmt(x, spec="%.0f"):
    return "-" if x is None else spec % x


def ratio(a, b):
    return a / b if (a is not None and b) else None


def cmd_report(a):
    rows = [json.loads(l) for l in open(a.rows) if l.strip()]
    gpu = a.kind == "gpu"
    shapes, labels = [], []
    for r in rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
        if r["label"] not in labels:
            labels.append(r["label"])
    by = {(r["shape"], r["label"], r["impl"]): r for r in rows}

    def metric(shape, label, impl, key):
        r = by.get((shape, label, impl))
        if not r or r.get("status") != "ok":
            return None
        b = r.get("bench", {})
        if key == "mem":  # GPU: the trainer's / allocator's peak; CPU: peak RSS of the process
            return b.get("peak_mem_gib") if gpu else r.get("max_rss_gib")
        return b.get(key)

    def status(shape, label, impl):
        r = by.get((shape, label, impl))
        return r.get("status") if r else None

    out_rows = []
    for sh in shapes:
        base_tps = metric(sh, "preln", "cpp", "tokens_per_s")
        base_mem = metric(sh, "preln", "cpp", "mem")
        for lb in labels:
            for impl in IMPLS:
                r = by.get((sh, lb, impl))
                if not r:
                    continue
                tps, mem = metric(sh, lb, impl, "tokens_per_s"), metric(sh, lb, impl, "mem")
                ib_tps, ib_mem = metric(sh, "preln", impl, "tokens_per_s"), metric(sh, "preln", impl, "mem")
                b = r.get("bench", {})
                fpt = metric(sh, lb, "cpp", "model_flops_per_token")
                peak = metric(sh, lb, "cpp", "peak_bf16_tflops") or metric(sh, "preln", "cpp", "peak_bf16_tflops")
                mfu = b.get("mfu") if impl == "cpp" else (fpt * tps / 1e12 / peak if (fpt and tps and peak) else None)
                out_rows.append({
                    "shape": sh, "scheme": lb, "impl": impl, "status": r.get("status"),
                    "B": b.get("B"), "T": b.get("T"), "tokens_per_s": tps, "step_ms": b.get("step_ms"),
                    "peak_mem_gib": mem, "mfu": mfu if gpu else None,
                    "tokens_vs_preln_same_impl": ratio(tps, ib_tps), "mem_vs_preln_same_impl": ratio(mem, ib_mem),
                    "tokens_vs_cpp_preln": ratio(tps, base_tps), "mem_vs_cpp_preln": ratio(mem, base_mem),
                    "cpp_vs_this": ratio(metric(sh, lb, "cpp", "tokens_per_s"), tps) if impl != "cpp" else None,
                    "attention_backend": b.get("attention_backend") if impl != "cpp" else None,
                    "note": (r.get("note") or "").replace("\n", " ")[:200]})
    os.makedirs(a.out, exist_ok=True)
    import csv
    keys = ["shape", "scheme", "impl", "status", "B", "T", "tokens_per_s", "step_ms", "peak_mem_gib", "mfu",
            "tokens_vs_preln_same_impl", "mem_vs_preln_same_impl", "tokens_vs_cpp_preln", "mem_vs_cpp_preln",
            "cpp_vs_this", "attention_backend", "note"]
    with open(os.path.join(a.out, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in out_rows:
            w.writerow({k: ("%.6g" % r[k] if isinstance(r[k], float) else ("" if r[k] is None else r[k])) for k in keys})

    # ---- targets (spec performance.md, "On the CPU"; the GPU's: scripts/gpu_targets.py, below)
    targets = []  # (shape, text, met: True/False/None)
    for sh in shapes if not gpu else []:
        tp = {lb: metric(sh, lb, "cpp", "tokens_per_s") for lb in labels}
        pre = tp.get("preln")
        for lb in labels:
            if (sh, lb, "torch-eager") in by:
                r = ratio(tp.get(lb), metric(sh, lb, "torch-eager", "tokens_per_s"))
                targets.append((sh, "%s: C++ >= 2x PyTorch eager (got %s)" % (lb, fmt(r, "%.2fx")),
                                None if r is None else r >= 2))
        for lb in labels:
            if lb != "preln" and pre:  # spec: every scheme's step <= 1.5x PreLN's
                r = ratio(pre, tp.get(lb))
                targets.append((sh, "%s cost <= 1.5x PreLN (step-time ratio %s)" % (lb, fmt(r, "%.2f")),
                                None if r is None else r <= 1.5))

    # ---- markdown
    L = ["# %s" % (a.title or ("GPU benchmark" if gpu else "CPU benchmark")), ""]
    L.append("Generated by `scripts/torch_bench.py report` on %s. Each row is one run of the C++ trainer "
             "(`%s --bench`) or of the PyTorch peer (`scripts/torch_bench.py bench`), all in the same session. "
             "tokens/s: training (forward + backward + AdamW), median step. Memory: %s." %
             (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "train_gpt_baselines / train_ldm" if gpu else "train_cpu",
              "the trainer's peak device memory (C++: cudaMemGetInfo high-water mark; PyTorch: "
              "torch.cuda.max_memory_allocated)" if gpu else "peak RSS of the process (wait4), PyTorch's includes "
              "its ~0.3 GiB library footprint"))
    L.append("")
    for sh in shapes:
        L.append("## %s" % sh)
        L.append("")
        hdr = ["scheme", "C++ tokens/s", "vs PreLN", "PyTorch eager", "C++ / eager"]
        if gpu:
            hdr += ["torch.compile", "C++ / compile", "MFU", "C++ ms/layer"]
        hdr += ["C++ peak mem GiB", "mem vs PreLN", "eager mem GiB"]
        L.append("| " + " | ".join(hdr) + " |")
        L.append("|" + "---|" * len(hdr))
        for lb in labels:
            c = metric(sh, lb, "cpp", "tokens_per_s")
            e = metric(sh, lb, "torch-eager", "tokens_per_s")
            k = metric(sh, lb, "torch-compile", "tokens_per_s")

            def st(impl, v, f="%.0f"):
                s = status(sh, lb, impl)
                return fmt(v, f) if v is not None else (s if s and s != "ok" else "-")
            cells = [lb, st("cpp", c), fmt(ratio(c, metric(sh, "preln", "cpp", "tokens_per_s")), "%.3f"),
                     st("torch-eager", e), fmt(ratio(c, e), "%.2fx")]
            if gpu:
                m = metric(sh, lb, "cpp", "mfu")
                rr = by.get((sh, lb, "cpp")) or {}
                ms = metric(sh, lb, "cpp", "step_ms")
                cells += [st("torch-compile", k), fmt(ratio(c, k), "%.2fx"), fmt(m and 100 * m, "%.1f%%"),
                          fmt(ms / rr["n_layer"] if (ms and rr.get("n_layer")) else None, "%.2f")]
            cm = metric(sh, lb, "cpp", "mem")
            cells += [fmt(cm, "%.3f"), fmt(ratio(cm, metric(sh, "preln", "cpp", "mem")), "%.3f"),
                      fmt(metric(sh, lb, "torch-eager", "mem"), "%.3f")]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
        # which SDPA backend the PyTorch rows ran (torch_bench.py sdpa_choice)
        used = sorted({"%s: %s (GQA %s)" % (impl, r["bench"]["attention_backend"], r["bench"].get("gqa", "?"))
                       for (s2, _, impl), r in by.items()
                       if s2 == sh and impl.startswith("torch") and "attention_backend" in r.get("bench", {})})
        if used:
            L.append("PyTorch attention backend: " + "; ".join(used) + ".")
            L.append("")
    if gpu:  # every GPU target of the spec and of issues #17 / #18, from the same evaluator as gpu_check.sh's
        sys.path.insert(0, HERE)
        import gpu_targets
        runs = [{"label": r["label"], "impl": r["impl"], "bench": r["bench"]} for r in rows
                if r.get("status") == "ok" and isinstance(r.get("bench"), dict)]
        att = open(a.attention, errors="replace").read().splitlines() if a.attention and os.path.exists(a.attention) else None
        L.append(gpu_targets.markdown(gpu_targets.evaluate(runs, att), runs=runs))
    else:
        L.append("## Targets (../shared/spec/performance.md)")
        L.append("")
        L.append("| shape | target | result |")
        L.append("|---|---|---|")
        for sh, text, ok in targets:
            L.append("| %s | %s | %s |" % (sh, text, "n/a (not measured)" if ok is None else ("met" if ok else "**missed**")))
        L.append("")
    bad = [r for r in rows if r.get("status") != "ok"]
    if bad:
        L.append("## Items that did not finish")
        L.append("")
        for r in bad:
            L.append("- %s / %s / %s: %s %s" % (r["shape"], r["label"], r["impl"], r.get("status"),
                                                 (r.get("note") or "").replace("\n", " ")[-200:]))
        L.append("")
    with open(os.path.join(a.out, "bench.md"), "w") as f:
        f.write("\n".join(L))

    # ---- plots: tokens/s and memory relative to PreLN (per implementation), one panel per shape
    try:
        import matplotlib
    except ImportError:  # the tables above are written; the plots need python3-matplotlib
        print("report: %s/bench.md, bench.csv (%d rows, %d not ok); no plots: matplotlib is not installed for %s "
              "(scripts/install_deps.sh installs python3-matplotlib)" % (a.out, len(rows), len(bad), sys.executable))
        return 0
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for what, key, fname, ylabel in (("tokens", "tokens_per_s", "bench_tokens.png", "training tokens/s / PreLN's"),
                                     ("memory", "mem", "bench_memory.png", "peak memory / PreLN's")):
        fig, axes = plt.subplots(1, len(shapes), figsize=(max(6, 1.2 * len(labels)) * len(shapes) ** 0.5 + 2, 4.2),
                                 squeeze=False)
        impls = [i for i in IMPLS if any((sh, lb, i) in by for sh in shapes for lb in labels)]
        width = 0.8 / max(1, len(impls))
        for ax, sh in zip(axes[0], shapes):
            for n, impl in enumerate(impls):
                base = metric(sh, "preln", impl, key)
                vals = [ratio(metric(sh, lb, impl, key), base) or 0 for lb in labels]
                xs = [i + (n - (len(impls) - 1) / 2) * width for i in range(len(labels))]
                ax.bar(xs, vals, width, label=impl)
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
            ax.set_title(sh, fontsize=9)
            ax.set_ylabel(ylabel, fontsize=8)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(("GPU" if gpu else "CPU") + " benchmark: " + what + " relative to PreLN", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, fname), dpi=110)
        plt.close(fig)
    print("report: %s/bench.md, bench.csv, bench_tokens.png, bench_memory.png (%d rows, %d not ok)" %
          (a.out, len(rows), len(bad)))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd_name")
    b = sub.add_parser("bench", help="time one configuration in PyTorch")
    b.add_argument("--preset", default="small")
    b.add_argument("--scheme", default="preln")
    b.add_argument("--ldm-rule", default="rls")
    b.add_argument("--no-residual", action="store_true")
    b.add_argument("--n-layer", type=int, default=0)
    b.add_argument("--d-model", type=int, default=0)
    b.add_argument("--vocab-size", type=int, default=0)
    b.add_argument("-B", type=int, default=4)
    b.add_argument("-T", type=int, default=256)
    b.add_argument("--steps", type=int, default=10)
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    b.add_argument("--mode", default="eager", choices=["eager", "compile"])
    b.add_argument("--dtype", default=None, choices=["fp32", "bf16"], help="default: fp32 on cpu, bf16 on cuda")
    b.add_argument("--threads", type=int, default=0)
    b.add_argument("--grad-clip", type=float, default=1.0,
                   help="global gradient-norm clip before each AdamW step, as the C++ trainers' --grad-clip (0 = off)")
    b.add_argument("--spec-bin", default=os.path.join(ROOT, "build", "generate_cpu"))
    r = sub.add_parser("run", help="run one benchmark command and append a row")
    r.add_argument("--rows", required=True)
    r.add_argument("--impl", required=True, choices=list(IMPLS))
    r.add_argument("--label", required=True)
    r.add_argument("--shape", required=True)
    r.add_argument("--timeout", type=float, default=0)
    r.add_argument("--log", default="")
    r.add_argument("--n-layer", type=int, default=0, help="blocks of the model (GPU table: ms per layer)")
    r.add_argument("cmd", nargs=argparse.REMAINDER)
    c = sub.add_parser("check", help="compare the peer's loss with C++ debug-state dumps")
    c.add_argument("dumps", nargs="+")
    p = sub.add_parser("report", help="write bench.md/csv/png from the rows")
    p.add_argument("--kind", required=True, choices=["cpu", "gpu"])
    p.add_argument("--attention", help="GPU: the attention workbench's output (its BENCH/CHECK lines), for the "
                   "attention targets")
    p.add_argument("--rows", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="")
    a = ap.parse_args()
    if a.cmd_name == "bench":
        if a.dtype is None:
            a.dtype = "bf16" if a.device == "cuda" else "fp32"
        return cmd_bench(a)
    if a.cmd_name == "run":
        return cmd_run(a)
    if a.cmd_name == "check":
        return cmd_check(a)
    if a.cmd_name == "report":
        return cmd_report(a)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
