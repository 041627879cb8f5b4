#!/usr/bin/python3
"""PyTorch reference evaluation of a model checkpoint on the eval binaries (LAMBADA, WikiText-2,
optionally HellaSwag), independent of the C++ evaluator (core/eval.cpp, build/eval_cpu).

Usage:
  /usr/bin/python3 scripts/torch_eval_ref.py --checkpoint ckpt_000030.model \
      --lambada lambada.bin --lambada-examples 200 --wikitext wikitext.bin --wikitext-docs 3 \
      [--hellaswag hellaswag.bin --hellaswag-items 50] [--max-length L] [--out ref.json]

The model is scripts/torch_ref.py's `forward` (imported, not copied), run in float64 on the
checkpoint's fp32 parameters. The eval binaries are parsed here from their documented layout
(doc/formats.md "Eval binaries"); the scoring follows lm-evaluation-harness literally:
  * requests: whole = context + continuation (empty context -> [eot]),
    inp = whole[-(L+1):][:-1], the last len(continuation) logits score the continuation;
    greedy = argmax over the real V at each continuation position;
  * WikiText: `get_rolling_token_windows(tokens, prefix=eot, max_seq_len=L, context_len=1)` and
    `make_disjoint_window`, re-implemented from the harness's description in
    ../shared/spec/evals.md; word/byte perplexity and bits per byte over the documents used.
Prints a JSON object (and writes it to --out) with the same field names as eval_cpu's
"results". Exit status 1 on bad input, 2 if PyTorch cannot be imported.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (exits 2 with a message when torch is missing)
import torch  # noqa: E402

MAGICS = {b"LDMEVLMB": "lambada", b"LDMEVWKT": "wikitext", b"LDMEVHSW": "hellaswag"}


def read_eval_binary(path):
    """Returns (kind, header dict, records bytes, list of token sequences as lists)."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 256:
        raise ValueError("%s: shorter than the 256-byte header" % path)
    kind = MAGICS.get(buf[:8])
    if kind is None:
        raise ValueError("%s: not an eval binary (magic %r)" % (path, buf[:8]))
    (version, header_bytes, token_bytes, spi, record_bytes, source_format) = struct.unpack_from("<6I", buf, 8)
    n_items, n_seqs, n_tokens = struct.unpack_from("<3Q", buf, 32)
    eot, vocab = struct.unpack_from("<2I", buf, 56)
    fingerprint, total_words, total_bytes = struct.unpack_from("<3Q", buf, 64)
    if version not in (1, 2) or header_bytes != 256 or token_bytes not in (2, 4) or n_seqs != n_items * spi:
        raise ValueError("%s: bad header" % path)
    if version == 2:  # FNV-1a 64 of the file with the checksum's own 8 bytes (152..159) as zero
        (stored,) = struct.unpack_from("<Q", buf, 152)
        h = 0xCBF29CE484222325
        for c in buf[:152] + bytes(8) + buf[160:]:
            h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        if h != stored:
            raise ValueError("%s: checksum mismatch (header %016x, contents %016x)" % (path, stored, h))
    rec_off = 256
    off_off = rec_off + n_items * record_bytes
    tok_off = off_off + (n_seqs + 1) * 8
    if tok_off + n_tokens * token_bytes != len(buf):
        raise ValueError("%s: file size %d does not match the header" % (path, len(buf)))
    offsets = np.frombuffer(buf, dtype="<u8", count=n_seqs + 1, offset=off_off)
    tokens = np.frombuffer(buf, dtype="<u2" if token_bytes == 2 else "<u4", count=n_tokens, offset=tok_off)
    seqs = [tokens[offsets[s]:offsets[s + 1]].astype(np.int64).tolist() for s in range(n_seqs)]
    hdr = dict(n_items=n_items, seqs_per_item=spi, eot=eot, vocab=vocab, total_words=total_words,
               total_bytes=total_bytes, record_bytes=record_bytes)
    return kind, hdr, buf[rec_off:off_off], seqs


def load_model(path):
    header, ts = torch_ref.read_container(path, magic=b"LDMMODEL")
    cfg = header["config"]
    flat = ts["params"]
    P = {}
    for s in header["param_specs"]:
        a = flat[s["offset"]:s["offset"] + s["numel"]].reshape(s["shape"])
        P[s["name"]] = torch.tensor(a.astype(np.float64), dtype=torch.float64)
    return cfg, P


class Scorer:
    def __init__(self, cfg, P):
        self.cfg, self.P = cfg, P
        self.L = cfg["seq_len"]

    def loglikelihoods(self, requests, eot, L, chunk=8):
        """requests: list of (context, continuation) id lists -> list of (ll, greedy).
        Padded batches of `chunk` rows (right padding with id 0: the model is causal, so the
        padded positions never influence the scored ones)."""
        rows = []
        for context, continuation in requests:
            whole = (context if context else [eot]) + continuation
            inp = whole[-(L + 1):][:-1]
            rows.append((inp, continuation))
        out = []
        for s in range(0, len(rows), chunk):
            part = rows[s:s + chunk]
            T = max(len(inp) for inp, _ in part)
            tokens = torch.zeros(len(part), T, dtype=torch.int64)
            for b, (inp, _) in enumerate(part):
                tokens[b, :len(inp)] = torch.tensor(inp, dtype=torch.int64)
            with torch.no_grad():
                _, lv = torch_ref.forward(self.cfg, self.P, tokens, None)
            for b, (inp, continuation) in enumerate(part):
                n = len(continuation)
                # log-softmax of the scored positions only (a row's other positions are not used)
                cont_lp = torch.log_softmax(lv[b, len(inp) - n:len(inp)], dim=-1)
                tgt = torch.tensor(continuation, dtype=torch.int64)
                ll = float(cont_lp.gather(1, tgt[:, None]).sum())
                greedy = bool((cont_lp.argmax(dim=-1) == tgt).all())
                out.append((ll, greedy))
        return out


def rolling_windows(token_list, prefix_token, max_seq_len, context_len=1):
    """The harness's get_rolling_token_windows."""
    if not token_list:
        return
    pred_len = max_seq_len - context_len + 1
    predicted = 0
    first_seq_len = min(max_seq_len, len(token_list))
    yield [prefix_token] + token_list[:first_seq_len - 1], token_list[:first_seq_len]
    predicted += first_seq_len
    while predicted < len(token_list):
        window_pred_len = min(len(token_list) - predicted, pred_len)
        window_end = predicted + window_pred_len
        yield (token_list[window_end - max_seq_len - 1:window_end - 1],
               token_list[window_end - window_pred_len:window_end])
        predicted += window_pred_len


def make_disjoint_window(pair):
    a, b = pair
    return a[:len(a) - (len(b) - 1)], b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--lambada")
    ap.add_argument("--lambada-examples", type=int, default=200)
    ap.add_argument("--wikitext")
    ap.add_argument("--wikitext-docs", type=int, default=3)
    ap.add_argument("--hellaswag")
    ap.add_argument("--hellaswag-items", type=int, default=50)
    ap.add_argument("--max-length", type=int, default=0, help="WikiText window (0 = the model's seq_len)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    try:
        cfg, P = load_model(a.checkpoint)
    except (OSError, ValueError, KeyError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    sc = Scorer(cfg, P)
    V = cfg["vocab_size"]
    res = {}
    try:
        if a.lambada:
            kind, h, _, seqs = read_eval_binary(a.lambada)
            if kind != "lambada" or h["vocab"] != V:
                raise ValueError("%s: not a LAMBADA binary for a %d-id vocabulary" % (a.lambada, V))
            n = min(a.lambada_examples, h["n_items"]) if a.lambada_examples > 0 else h["n_items"]
            scores = sc.loglikelihoods([(seqs[2 * i], seqs[2 * i + 1]) for i in range(n)], h["eot"], sc.L)
            lls = [ll for ll, _ in scores]
            correct = sum(1 for _, g in scores if g)
            res["lambada"] = dict(examples=n, ll=sum(lls), correct=correct, ppl=math.exp(-sum(lls) / n),
                                  acc=correct / n)
        if a.wikitext:
            kind, h, rec, seqs = read_eval_binary(a.wikitext)
            if kind != "wikitext" or h["vocab"] != V:
                raise ValueError("%s: not a WikiText binary for a %d-id vocabulary" % (a.wikitext, V))
            L = a.max_length or sc.L
            n = min(a.wikitext_docs, h["n_items"]) if a.wikitext_docs > 0 else h["n_items"]
            total_ll, words, nbytes, ntok, nwin = 0.0, 0, 0, 0, 0
            for d in range(n):
                w, b = struct.unpack_from("<2Q", rec, 16 * d)
                words += w
                nbytes += b
                toks = seqs[d]
                ntok += len(toks)
                wins = [make_disjoint_window(p) for p in rolling_windows(toks, h["eot"], L, 1)]
                total_ll += sum(ll for ll, _ in sc.loglikelihoods(wins, h["eot"], L))
                nwin += len(wins)
            res["wikitext"] = dict(docs=n, tokens=ntok, windows=nwin, words=words, bytes=nbytes, ll=total_ll,
                                   max_length=L, word_perplexity=math.exp(-total_ll / words),
                                   byte_perplexity=math.exp(-total_ll / nbytes),
                                   bits_per_byte=-total_ll / nbytes / math.log(2))
        if a.hellaswag:
            kind, h, rec, seqs = read_eval_binary(a.hellaswag)
            if kind != "hellaswag" or h["vocab"] != V:
                raise ValueError("%s: not a HellaSwag binary for a %d-id vocabulary" % (a.hellaswag, V))
            n = min(a.hellaswag_items, h["n_items"]) if a.hellaswag_items > 0 else h["n_items"]
            c = cn = 0
            for i in range(n):
                label, c0, c1, c2, c3 = struct.unpack_from("<5I", rec, 24 * i)
                chars = np.array([c0, c1, c2, c3], dtype=np.float64)
                lls = np.array([ll for ll, _ in sc.loglikelihoods([(seqs[5 * i], seqs[5 * i + 1 + k])
                                                                     for k in range(4)], h["eot"], sc.L)])
                c += int(np.argmax(lls)) == label
                cn += int(np.argmax(lls / np.maximum(chars, 1))) == label
            res["hellaswag"] = dict(items=n, correct=c, correct_norm=cn, acc=c / n, acc_norm=cn / n)
    except (OSError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        tmp = a.out + ".tmp.%d" % os.getpid()
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
