#!/usr/bin/python3
"""Independent PyTorch reference of the spec §1 backbone (PreLN, or LDM of §2.5), checked against a debug-state dump.

Usage:  /usr/bin/python3 scripts/torch_ref.py DUMP [DUMP ...] [--tol 1e-4] [--dtype float64|float32]

DUMP is the file written by `build/train_cpu --dump-debug-state FILE` (or by the tests): the
container format of doc/formats.md ("Debug state"): parameters, one batch (inputs, targets),
logits, loss and every gradient of the C++ reference. This script rebuilds the model from the
spec alone (RMSNorm, RoPE rotate-half, causal GQA attention with consecutive grouping, optional
QKV bias and QK-norm, SwiGLU, tied or untied LM head, cross-entropy over the real V of the Vp
padded logits), loads the dumped parameters and batch, runs forward and autograd backward in
float64 (default), and compares the loss, the logits and every gradient tensor with the dump:

    rel = ||g_cpp - g_torch||_2 / max(||g_torch||_2, 1e-30)     per tensor, must be <= --tol

It prints one table row per tensor and exits 1 if any comparison fails (in any of the given
dumps), 2 on unusable input.
Uses Debian's python3-torch (torch 1.13, CPU) and numpy only; run it with /usr/bin/python3.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

try:
    import torch
except ImportError as e:  # the caller (a test) must see a failure, not a skip
    print("error: PyTorch is not importable by %s (%s); install python3-torch (scripts/install_deps.sh)"
          % (sys.executable, e), file=sys.stderr)
    sys.exit(2)

DTYPES = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "u8": np.uint8}


def fnv1a64(data):
    """FNV-1a 64-bit over bytes (pure Python: about 10 s per 100 MB, hence opt-in via --checksum)."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_container(path, magic=b"LDMDEBUG", verify_checksum=False):
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 24:
        raise ValueError("%s: file too small (%d bytes)" % (path, len(buf)))
    if buf[:8] != magic:
        raise ValueError("%s: bad magic %r (expected %r)" % (path, buf[:8], magic))
    version, hlen = struct.unpack_from("<II", buf, 8)
    if version != 1:
        raise ValueError("%s: unsupported version %d" % (path, version))
    if 16 + hlen + 8 > len(buf):
        raise ValueError("%s: truncated header" % path)
    header = json.loads(buf[16:16 + hlen].decode("utf-8"))
    if verify_checksum:
        stored = struct.unpack_from("<Q", buf, len(buf) - 8)[0]
        if fnv1a64(buf[:-8]) != stored:
            raise ValueError("%s: checksum mismatch (file corrupt)" % path)
    payload = 16 + hlen
    tensors = {}
    for t in header["tensors"]:
        start = payload + t["offset"]
        end = start + t["nbytes"]
        if end > len(buf) - 8:
            raise ValueError("%s: truncated tensor %s" % (path, t["name"]))
        a = np.frombuffer(buf[start:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        tensors[t["name"]] = a
    return header, tensors


# ---------------------------------------------------------------------------------------------
# The model, written from spec §1 (no code shared with the C++ reference).

def rmsnorm(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def rope(x, T, theta):
    """x: [B, H, T, hd]; rotate-half convention: pairs (i, i + hd/2), angle t * theta^(-2i/hd)."""
    hd = x.shape[-1]
    half = hd // 2
    inv = theta ** (-torch.arange(0, half, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # [T, half]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


def l2n(x):
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


class LdmMemory:
    """Linear Depth Memory (spec §2.5), written from the spec: autograd through the plain
    recurrence (state after every write kept by autograd), per token and memory head.
    S [B, T, Hm, dv, dk], P [B, T, Hm, dk, dk]. input(j) for j = 1..D returns x_j; input(D+1) is
    the readout y; output(j, o) applies the residual update and write j."""

    def __init__(self, cfg, P, e):
        self.P_, self.cfg = P, cfg
        B, T, d = e.shape
        self.Hm, self.dk = cfg["ldm_heads"], cfg["ldm_dk"]
        self.dv = d // self.Hm
        self.rule, self.res = cfg["ldm_rule"], cfg["ldm_residual"]
        self.forget = cfg["ldm_forget"] and self.rule != "delta"
        self.D = 2 * cfg["n_layer"]
        self.S = torch.zeros(B, T, self.Hm, self.dv, self.dk, dtype=e.dtype)
        eye = torch.eye(self.dk, dtype=e.dtype) / cfg["ldm_delta"]
        self.Pm = eye.expand(B, T, self.Hm, self.dk, self.dk).clone()
        self.src = e
        self.write(0, e)

    def lam(self, i):
        if not self.forget:
            return 1.0
        lm = self.cfg["ldm_lambda_min"]
        return (lm + (1 - lm) * torch.sigmoid(self.P_["scheme.ldm.theta"][i]))[:, None, None]  # [Hm,1,1]

    def write(self, i, o):
        B, T, d = o.shape
        k = l2n((o @ self.P_["scheme.ldm.wk.%d" % i].T).view(B, T, self.Hm, self.dk))
        v = o.view(B, T, self.Hm, self.dv)
        Sk = (self.S @ k[..., None])[..., 0]  # [B,T,Hm,dv]
        if self.rule == "rls":
            lam = self.lam(i)
            u = (self.Pm @ k[..., None])[..., 0]  # [B,T,Hm,dk]
            gamma = (k * u).sum(-1, keepdim=True) + (lam[..., 0] if torch.is_tensor(lam) else lam)
            g = u / gamma
            self.S = self.S + (v - Sk)[..., :, None] * g[..., None, :]
            self.Pm = (self.Pm - u[..., :, None] * u[..., None, :] / gamma[..., None]) / lam
        elif self.rule == "delta":
            z = o @ self.P_["scheme.ldm.wbeta.%d" % i].T + self.P_["scheme.ldm.bbeta.%d" % i]
            beta = 0.95 * torch.sigmoid(z)  # [B,T,Hm]
            self.S = self.S + beta[..., None, None] * (v - Sk)[..., :, None] * k[..., None, :]
        else:  # outer
            self.S = self.lam(i) * self.S + v[..., :, None] * k[..., None, :]

    def input(self, j):
        name = str(j) if j <= self.D else "f"
        B, T, d = self.src.shape
        q = l2n((self.src @ self.P_["scheme.ldm.wq." + name].T).view(B, T, self.Hm, self.dk))
        r = (self.S @ q[..., None])[..., 0].reshape(B, T, d)
        return self.src + self.P_["scheme.ldm.a." + name] * r if self.res else r

    def output(self, j, o):
        self.src = self.src + o if self.res else o
        self.write(j, o)


class HyperStreams:
    """HC (spec §2.2) and mHC (spec §2.3), written from the spec with autograd for the backward.
    H [B, T, n, d]: n streams, H_0 = n copies of e. input(j) returns x_j (j = D+1: the readout,
    the mean of the streams); output(j, o) updates the streams with the mixing of sublayer j."""

    def __init__(self, cfg, P, e, manifold):
        self.P_, self.cfg, self.manifold = P, cfg, manifold
        self.n, self.D, self.eps = cfg["hc_streams"], 2 * cfg["n_layer"], cfg["norm_eps"]
        self.H = e[:, :, None, :].expand(e.shape[0], e.shape[1], self.n, e.shape[2])

    def input(self, j):
        H, n = self.H, self.n
        if j > self.D:
            return H.mean(dim=2)
        if not self.manifold:
            p = "scheme.hc.%d." % j
            Hb = H * torch.rsqrt(H.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # rms0 per stream
            s_a, s_b = self.P_[p + "s_a"], self.P_[p + "s_b"]
            a_m = s_a * torch.tanh(Hb @ self.P_[p + "w_m"].T)[..., 0] + self.P_[p + "a_m0"]  # [B,T,n]
            self.a_r = s_a * torch.tanh(Hb @ self.P_[p + "w_r"].T) + self.P_[p + "a_r0"]  # [B,T,i,k]
            self.b = s_b * torch.tanh(Hb @ self.P_[p + "w_b"].T)[..., 0] + self.P_[p + "b0"]  # [B,T,n]
            return (a_m[..., None] * H).sum(dim=2)
        p = "scheme.mhc.%d." % j
        B, T = H.shape[0], H.shape[1]
        z = H.reshape(B, T, -1)
        zh = z * torch.rsqrt(z.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        pre = torch.sigmoid(self.P_[p + "a_pre"] * (zh @ self.P_[p + "phi_pre"].T) + self.P_[p + "b_pre"])
        self.post = 2 * torch.sigmoid(self.P_[p + "a_post"] * (zh @ self.P_[p + "phi_post"].T) + self.P_[p + "b_post"])
        Rt = self.P_[p + "a_res"] * (zh @ self.P_[p + "phi_res"].T).view(B, T, n, n) + self.P_[p + "b_res"]
        M = torch.exp(Rt - Rt.amax(dim=(-2, -1), keepdim=True))
        for _ in range(self.cfg["sinkhorn_iters"]):  # columns, then rows (the last step)
            M = M / M.sum(dim=-2, keepdim=True)
            M = M / M.sum(dim=-1, keepdim=True)
        self.res = M  # [B,T,k,i]: row k = output stream
        return (pre[..., None] * H).sum(dim=2)

    def output(self, j, o):
        if not self.manifold:
            self.H = torch.einsum("btik,btid->btkd", self.a_r, self.H) + self.b[..., None] * o[:, :, None, :]
        else:
            self.H = torch.einsum("btki,btid->btkd", self.res, self.H) + self.post[..., None] * o[:, :, None, :]


class AttnResidual:
    """AttnRes Full and Block (spec §2.4), from the spec's equations, autograd backward.
    Full: sources v_0 = e, v_j = o_j. Block: N = min(attnres_blocks, D) blocks of S = D // N
    sublayers (the last takes the remainder); sources b_0..b_{n-1} plus the partial sum p when the
    sublayer is not the first of its block; b_n = p at the block end. input(D+1) is the readout."""

    def __init__(self, cfg, P, e, block):
        self.P_, self.eps, self.D, self.block = P, cfg["norm_eps"], 2 * cfg["n_layer"], block
        self.N = min(cfg["attnres_blocks"], self.D) if block else self.D
        self.S = self.D // self.N
        self.src, self.p = [e], None

    def agg(self, j, srcs):
        name = str(j) if j <= self.D else "f"
        w, g = self.P_["scheme.attnres.%s.w" % name], self.P_["scheme.attnres.%s.g" % name]
        U = torch.stack(srcs, dim=2)  # [B,T,K,d]
        alpha = torch.softmax((rmsnorm(U, g, self.eps) * w).sum(dim=-1), dim=-1)
        return (alpha[..., None] * U).sum(dim=2)

    def input(self, j):
        if j > self.D or not self.block:
            return self.agg(j, list(self.src))
        return self.agg(j, list(self.src) + ([self.p] if self.p is not None else []))

    def output(self, j, o):
        if not self.block:
            self.src.append(o)
            return
        self.p = o if self.p is None else self.p + o
        n = min((j - 1) // self.S + 1, self.N)
        if (j == n * self.S) if n < self.N else (j == self.D):
            self.src.append(self.p)
            self.p = None


def forward(cfg, P, tokens, targets):
    """(loss, logits over the real V) of tokens [B, T]; targets None: (None, logits)."""
    B, T = tokens.shape
    d, nh, nkv, hd = cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"]
    V, eps, theta = cfg["vocab_size"], cfg["norm_eps"], cfg["rope_theta"]
    scheme = cfg.get("scheme", "preln")
    if scheme not in ("preln", "ldm", "hc", "mhc", "attnres-full", "attnres-block"):
        raise ValueError("torch_ref implements preln, ldm, hc, mhc, attnres-full and attnres-block; dump has %s" % scheme)
    h = P["wte"][tokens]  # [B, T, d], no scaling
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    group = nh // nkv
    mem = LdmMemory(cfg, P, h) if scheme == "ldm" else None
    if scheme in ("hc", "mhc"):
        mem = HyperStreams(cfg, P, h, scheme == "mhc")
    elif scheme in ("attnres-full", "attnres-block"):
        mem = AttnResidual(cfg, P, h, scheme == "attnres-block")
    for l in range(cfg["n_layer"]):
        p = "blocks.%d." % l
        # attention sublayer
        x = rmsnorm(mem.input(2 * l + 1) if mem else h, P[p + "attn_norm.w"], eps)
        q = x @ P[p + "attn.wq"].T
        k = x @ P[p + "attn.wk"].T
        v = x @ P[p + "attn.wv"].T
        if cfg["qkv_bias"]:
            q = q + P[p + "attn.bq"]
            k = k + P[p + "attn.bk"]
            v = v + P[p + "attn.bv"]
        q = q.view(B, T, nh, hd).transpose(1, 2)
        k = k.view(B, T, nkv, hd).transpose(1, 2)
        v = v.view(B, T, nkv, hd).transpose(1, 2)
        if cfg["qk_norm"]:
            q = rmsnorm(q, P[p + "attn.q_norm.w"], eps)
            k = rmsnorm(k, P[p + "attn.k_norm.w"], eps)
        q = rope(q, T, theta)
        k = rope(k, T, theta)
        k = k.repeat_interleave(group, dim=1)  # query head i uses kv head i // group
        v = v.repeat_interleave(group, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v  # [B, nh, T, hd]
        a = a.transpose(1, 2).reshape(B, T, nh * hd)
        if mem:
            mem.output(2 * l + 1, a @ P[p + "attn.wo"].T)
        else:
            h = h + a @ P[p + "attn.wo"].T
        # MLP sublayer (SwiGLU)
        x = rmsnorm(mem.input(2 * l + 2) if mem else h, P[p + "mlp_norm.w"], eps)
        g = torch.nn.functional.silu(x @ P[p + "mlp.w1"].T) * (x @ P[p + "mlp.w3"].T)
        if mem:
            mem.output(2 * l + 2, g @ P[p + "mlp.w2"].T)
        else:
            h = h + g @ P[p + "mlp.w2"].T
    y = rmsnorm(mem.input(2 * cfg["n_layer"] + 1) if mem else h, P["final_norm.w"], eps)
    W = P["wte"] if cfg["tied"] else P["lm_head"]
    logits = y @ W.T  # [B, T, Vp]
    lv = logits[..., :V]  # softmax and loss over the real V only
    if targets is None:  # logits only (scripts/torch_eval_ref.py)
        return None, lv
    loss = torch.nn.functional.cross_entropy(lv.reshape(B * T, V), targets.reshape(B * T).long())
    return loss, lv


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    nb = np.linalg.norm(b.ravel())
    return float(np.linalg.norm((a - b).ravel()) / max(nb, 1e-30)), float(np.max(np.abs(a - b))) if a.size else 0.0


def check_dump(path, args):
    try:
        header, ts = read_container(path, verify_checksum=args.checksum)
    except (OSError, ValueError, KeyError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    cfg = header["config"]
    tol = args.tol if args.tol is not None else (1e-4 if header["dtype"] == "fp32" else 1e-9)
    tdt = torch.float64 if args.dtype == "float64" else torch.float32

    flat = ts["params"]
    P = {}
    for s in header["param_specs"]:
        a = flat[s["offset"]:s["offset"] + s["numel"]].reshape(s["shape"])
        P[s["name"]] = torch.tensor(a.astype(np.float64), dtype=tdt, requires_grad=True)
    tokens = torch.tensor(ts["inputs"].astype(np.int64))
    targets = torch.tensor(ts["targets"].astype(np.int64))
    loss, logits = forward(cfg, P, tokens, targets)
    loss.backward()

    V, Vp = cfg["vocab_size"], cfg["padded_vocab"]
    B, T = header["B"], header["T"]
    rows = []
    rl = abs(float(loss) - header["loss"]) / abs(float(loss))
    # rows: (tensor, shape, detail, rel err, ok, error, bound) -- error <= bound is what decides ok
    rows.append(("loss", "[]", "%.10g vs %.10g" % (header["loss"], float(loss)), rl, rl <= tol, rl, tol))
    cl = ts["logits"].reshape(B, T, Vp)
    r, m = rel_err(cl[..., :V], logits.detach().numpy())
    pad_ok = bool(np.all(cl[..., V:] == 0)) if Vp > V else True
    rows.append(("logits[:, :V]", str([B, T, V]), "max|d| %.3e" % m, r, r <= tol and pad_ok, r, tol))
    gflat = ts["grads"]
    # Noise floor for tensors whose gradient is tiny next to the model's (e.g. mHC's H_res of
    # sublayer 1, exactly 0 since all streams are equal, or of the last sublayer, whose readout
    # only sees column sums ~1): such a tensor also passes when max|d| <= tol * 1e-3 * max|g|
    # over all gradients (marked "floor"); its relative error is rounding noise. (Margins over
    # OpenBLAS kernels: doc/testing.md.)
    gfloor = tol * 1e-3 * float(np.max(np.abs(np.asarray(gflat, dtype=np.float64))))
    for s in header["param_specs"]:
        g = gflat[s["offset"]:s["offset"] + s["numel"]].reshape(s["shape"])
        gt = P[s["name"]].grad
        gt = np.zeros(s["shape"]) if gt is None else gt.numpy()
        r, m = rel_err(g, gt)
        floor = r > tol and m <= gfloor
        # the criterion with the larger margin is the one that decides (error, bound)
        by_floor = gfloor > 0 and m * tol < r * gfloor
        rows.append((s["name"], str(s["shape"]), "max|d| %.3e%s" % (m, " floor" if floor else ""), r,
                     r <= tol or floor, m if by_floor else r, gfloor if by_floor else tol))
    ok = all(row[4] for row in rows)
    flags = ",".join(k for k in ("tied", "qkv_bias", "qk_norm") if cfg[k]) or "untied"
    print("torch_ref: %s | %s d=%d L=%d nh=%d nkv=%d hd=%d %s theta=%g | dump %s | torch %s %s | B=%d T=%d | "
          "tolerance %.1e (relative L2 per tensor)"
          % (path, cfg["preset"], cfg["d_model"], cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"], cfg["head_dim"],
             flags, cfg["rope_theta"], header["dtype"], torch.__version__, args.dtype, B, T, tol))
    print("%-26s %-14s %-34s %-11s %s" % ("tensor", "shape", "detail", "rel err", "status"))
    report = os.environ.get("LDM_TOL_REPORT")  # margins collection (test/helpers.h tol_record)
    if report:
        with open(report, "a") as f:
            for row in rows:
                f.write("torch_ref.py/%s %s %s\t%.6e\t%.6e\n" % (cfg["preset"], header["dtype"], row[0], row[5], row[6]))
    for name, shape, detail, r, good, _, _ in rows:
        print("%-26s %-14s %-34s %-11.3e %s" % (name, shape, detail, r, "ok" if good else "FAIL"))
    print("torch_ref: %s (%d of %d tensors within tolerance)\n" % ("PASS" if ok else "FAIL",
                                                                   sum(1 for r_ in rows if r_[4]), len(rows)))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dumps", nargs="+", metavar="DUMP")
    ap.add_argument("--tol", type=float, default=None,
                    help="max relative error per tensor (default 1e-4 for fp32 dumps, 1e-9 for fp64)")
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                    help="precision of the PyTorch computation")
    ap.add_argument("--checksum", action="store_true",
                    help="also verify the file's FNV-1a checksum (slow in pure Python; sizes are always checked)")
    args = ap.parse_args()
    rc = 0
    for d in args.dumps:
        rc = max(rc, check_dump(d, args))
    return rc


if __name__ == "__main__":
    sys.exit(main())
