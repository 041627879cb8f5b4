#!/usr/bin/python3
"""The summary of a scripts/study.sh results folder: summary.csv (one row per run), summary.md
(per (scheme, LR) over the seeds, the verdict, per run, samples), verdict.txt, losses.png (all
runs overlaid, the seeds of one (scheme, LR) in one colour) and plots/<run>.png.

Usage: /usr/bin/python3 scripts/study_summary.py --out DIR --baseline preln --steps N
           --tokens-per-step N --runs NAME...      (run directories DIR/runs/NAME, in plan order)

Per run it reads log.jsonl (scripts/runlog.py), invocations.jsonl (scripts/measure_run.py: wall
time, peak RSS, GPU memory), eval.json (build/eval_cpu) or the log's last {"type":"eval"}, and
sample.txt; done.json marks a finished run, failed.txt a failed one.

The verdict compares every scheme at its best LR (lowest mean final val loss) with the baseline at
its best LR: the difference of the means against the seed spread, the larger of the two
schemes' seed ranges (max - min of the final val loss over the seeds; the runs of one seed share
the data order and the initialisation seed). A difference larger than that spread is reported
as such, anything else as "no difference larger than the seed spread"; with one seed there is no
spread and the verdict says so. Nothing in it is fixed text about which scheme should win.
"""
import argparse
import csv
import io
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlog import RunLog, scheme_label  # noqa: E402


def read_json_lines(path):
    out = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    return out


def write_atomic(path, text):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def fmt(v, spec):
    """spec % v; "-" for None; perplexities of untrained models (>= 1e5) as 3.7e+09."""
    if v is None:
        return "-"
    return "%.2g" % v if spec == "%.1f" and abs(v) >= 1e5 else spec % v


def collect(out, name, steps):
    d = os.path.join(out, "runs", name)
    r = {"run": name, "dir": d}
    done = None
    if os.path.exists(os.path.join(d, "done.json")):
        with open(os.path.join(d, "done.json"), encoding="utf-8") as f:
            done = json.load(f)
    # name = <scheme>_lr<lr>_s<seed>
    base, _, seed = name.rpartition("_s")
    scheme, _, lr = base.rpartition("_lr")
    r.update(scheme=scheme, lr=lr, seed=int(seed) if seed.isdigit() else seed)
    log = None
    lp = os.path.join(d, "log.jsonl")
    if os.path.exists(lp):
        try:
            log = RunLog(lp)
        except (OSError, ValueError) as e:
            sys.stderr.write("study_summary: cannot read %s (%s): the run counts as without a log\n" % (lp, e))
            log = None
    r["log"] = log
    r["label"] = scheme_label(log.config) if log and log.config else scheme
    last = max(log.train) if log and log.train else 0
    if done:
        r["status"] = "done"
    elif os.path.exists(os.path.join(d, "failed.txt")):
        with open(os.path.join(d, "failed.txt"), encoding="utf-8") as f:
            r["status"] = "failed: " + f.read().strip()[:200]
    elif last:
        r["status"] = "stopped at step %d of %d" % (last, steps)
    else:
        r["status"] = "not started"
    r["steps_done"] = last
    # the final val loss: the record at the last step (a null there, i.e. not finite, is not
    # replaced by an earlier value: the run is marked and left out of the comparison)
    r["val_loss"] = log.val.get(steps) if log and done else None
    if r["val_loss"] is None and log and done:
        r["val_loss"] = log.final_val()
    if r["val_loss"] is not None and not math.isfinite(r["val_loss"]):
        r["val_loss"] = None
        r["status"] = "done (final val loss not finite)"
    r["tokens_per_s"] = log.median_tokens_per_s() if log else None
    r["ms_per_step"] = log.median_ms() if log else None
    inv = read_json_lines(os.path.join(d, "invocations.jsonl"))
    rss = [x["peak_rss_kib"] for x in inv if x.get("peak_rss_kib")]
    gpu = [x["gpu_peak_mib"] for x in inv if x.get("gpu_peak_mib") is not None]
    r["peak_rss_gib"] = max(rss) / 2**20 if rss else None
    r["gpu_peak_gib"] = max(gpu) / 1024 if gpu else None
    r["train_s"] = sum(x.get("wall_s", 0) for x in inv) if inv else None
    r["invocations"] = len(inv)
    res = {}
    ep = os.path.join(d, "eval.json")
    if os.path.exists(ep):
        try:
            with open(ep, encoding="utf-8") as f:
                res = json.load(f).get("results", {})
        except (OSError, ValueError):
            res = {}
    elif log and log.evals:
        res = log.evals[-1][1]
    get = lambda sec, key: res[sec][key] if sec in res and res[sec].get(key) is not None else None  # noqa: E731
    r["wikitext_word_ppl"] = get("wikitext", "word_perplexity")
    r["wikitext_bits_per_byte"] = get("wikitext", "bits_per_byte")
    r["lambada_ppl"] = get("lambada", "ppl")
    r["lambada_acc"] = get("lambada", "acc")
    r["hellaswag_acc_norm"] = get("hellaswag", "acc_norm")
    r["eval_sizes"] = {k: res[k].get(n) for k, n in (("wikitext", "docs"), ("lambada", "examples"), ("hellaswag", "items"))
                       if k in res}
    sp = os.path.join(d, "sample.txt")
    r["sample"] = open(sp, encoding="utf-8", errors="replace").read().strip() if os.path.exists(sp) else None
    return r


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def groups_of(rows):
    """(scheme, lr) -> the finished runs, in plan order."""
    g = {}
    for r in rows:
        g.setdefault((r["scheme"], r["lr"]), [])
        if r["status"] == "done" and r["val_loss"] is not None:
            g[(r["scheme"], r["lr"])].append(r)
    return g


def summarize_group(rs):
    v = [r["val_loss"] for r in rs]
    return {
        "n": len(rs), "seeds": [r["seed"] for r in rs], "vals": v,
        "mean": mean(v), "min": min(v) if v else None, "max": max(v) if v else None,
        "range": (max(v) - min(v)) if len(v) >= 2 else None,
        "tokens_per_s": mean(r["tokens_per_s"] for r in rs),
        "wikitext_word_ppl": mean(r["wikitext_word_ppl"] for r in rs),
        "wikitext_bits_per_byte": mean(r["wikitext_bits_per_byte"] for r in rs),
        "lambada_ppl": mean(r["lambada_ppl"] for r in rs),
        "lambada_acc": mean(r["lambada_acc"] for r in rs),
        "hellaswag_acc_norm": mean(r["hellaswag_acc_norm"] for r in rs),
        "peak_rss_gib": max([r["peak_rss_gib"] for r in rs if r["peak_rss_gib"] is not None], default=None),
        "gpu_peak_gib": max([r["gpu_peak_gib"] for r in rs if r["gpu_peak_gib"] is not None], default=None),
        "by_seed": {r["seed"]: r["val_loss"] for r in rs},
    }


def verdicts(stats, schemes, baseline):
    """One sentence per scheme other than the baseline, computed from the numbers."""
    def best(s):
        c = [(g["mean"], lr, g) for (sc, lr), g in stats.items() if sc == s and g["n"] > 0]
        return min(c, key=lambda t: t[0]) if c else None

    n_lrs = {s: sum(1 for (sc, _) in stats if sc == s) for s in schemes}
    b = best(baseline)
    out = []
    if b is None:
        return ["no finished %s run: nothing to compare with" % baseline]
    for s in schemes:
        if s == baseline:
            continue
        o = best(s)
        if o is None:
            out.append("%s: no finished run" % s)
            continue
        bm, blr, bg = b
        om, olr, og = o
        diff = om - bm
        where = "below" if diff < 0 else "above"
        lrs = ""
        if n_lrs.get(s, 1) > 1 or n_lrs.get(baseline, 1) > 1:
            lrs = " (best LRs: %s %s, %s %s)" % (s, olr, baseline, blr)
        speed = ""
        if og["tokens_per_s"] and bg["tokens_per_s"]:
            speed = "; %.2fx %s's tokens/s" % (og["tokens_per_s"] / bg["tokens_per_s"], baseline)
        common = sorted(set(og["by_seed"]) & set(bg["by_seed"]), key=str)
        paired = ""
        if common:
            wins = sum(1 for k in common if og["by_seed"][k] < bg["by_seed"][k])
            paired = "; lower in %d of %d seeds" % (wins, len(common))
        if og["n"] == bg["n"]:
            means = "%.4f vs %.4f, %s" % (om, bm, "one seed each" if og["n"] == 1 else "means of %d seeds each" % og["n"])
        else:
            means = "%.4f vs %.4f, means of %d and %d seeds" % (om, bm, og["n"], bg["n"])
        if og["range"] is None or bg["range"] is None:
            out.append("%s: val loss %.4f %s %s (%s)%s; one seed, so no seed spread to compare the difference "
                       "with%s%s" % (s, abs(diff), where, baseline, means, lrs, paired, speed))
            continue
        spread = max(og["range"], bg["range"])
        if abs(diff) > spread:
            times = "%.1fx the seed spread" % (abs(diff) / spread) if spread > 0 else "above the seed spread"
            out.append("%s: val loss %.4f %s %s (%s), %s %.4f (the larger seed range)%s%s%s"
                       % (s, abs(diff), where, baseline, means, times, spread, lrs, paired, speed))
        else:
            out.append("%s: no difference larger than the seed spread: val loss %.4f %s %s (%s), seed spread "
                       "%.4f%s%s%s" % (s, abs(diff), where, baseline, means, spread, lrs, paired, speed))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--baseline", default="preln")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--tokens-per-step", type=int, default=0)
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    rows = [collect(a.out, n, a.steps) for n in a.runs]
    schemes = []
    for r in rows:
        if r["scheme"] not in schemes:
            schemes.append(r["scheme"])
    groups = groups_of(rows)
    stats = {k: summarize_group(v) for k, v in groups.items()}
    vlines = verdicts(stats, schemes, a.baseline)

    # summary.csv: one row per run
    cols = ["run", "scheme", "label", "lr", "seed", "status", "steps_done", "val_loss", "wikitext_word_ppl",
            "wikitext_bits_per_byte", "lambada_ppl", "lambada_acc", "hellaswag_acc_norm", "tokens_per_s",
            "ms_per_step", "peak_rss_gib", "gpu_peak_gib", "train_s", "invocations"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow(["" if r[c] is None else ("%.10g" % r[c] if isinstance(r[c], float) else r[c]) for c in cols])
    write_atomic(os.path.join(a.out, "summary.csv"), buf.getvalue())

    # summary.md
    first = next((r["log"] for r in rows if r["log"] and r["log"].config), None)
    md = "# Study results: %s\n\n" % a.out
    nd = sum(1 for r in rows if r["status"] == "done")
    md += "%d of %d runs finished. " % (nd, len(rows))
    if first:
        c, ar = first.config, first.args
        md += ("Model: %s, d=%s, %s layers, V=%s; parameters: %s. %d steps x %s tokens = %s tokens per run, "
               "lr schedule %s, warmup %s steps; data %s; tokenizer %s.\n\n"
               % (c.get("preset"), c.get("d_model"), c.get("n_layer"), c.get("vocab_size"), param_counts(rows),
                  a.steps, "{:,}".format(a.tokens_per_step), "{:,}".format(a.steps * a.tokens_per_step),
                  ar.get("schedule"), ar.get("warmup_steps"), ar.get("train_data"), ar.get("tokenizer") or "gpt2"))
    md += "## Per scheme (over seeds)\n\n"
    # columns of benchmarks that no run has are left out
    cols_md = [("WikiText-2 word ppl", "wikitext_word_ppl", "%.1f"), ("bits/byte", "wikitext_bits_per_byte", "%.4f"),
               ("LAMBADA ppl", "lambada_ppl", "%.1f"), ("LAMBADA acc", "lambada_acc", "%.4f"),
               ("HellaSwag acc_norm", "hellaswag_acc_norm", "%.4f")]
    cols_md = [c for c in cols_md if any(g[c[1]] is not None for g in stats.values())]
    md += ("| scheme | LR | seeds | final val loss (mean) | seed range (min - max) | "
           + "".join("%s | " % c[0] for c in cols_md) + "tokens/s | peak memory GiB |\n")
    md += "|---|---|---:|---:|---|" + "---:|" * len(cols_md) + "---:|---:|\n"
    for (s, lr), g in stats.items():
        lab = next((r["label"] for r in rows if r["scheme"] == s), s)
        mem = g["gpu_peak_gib"] if g["gpu_peak_gib"] is not None else g["peak_rss_gib"]
        rng = "-" if g["n"] == 0 else ("%.4f (%.4f - %.4f)" % (g["range"], g["min"], g["max"]) if g["range"] is not None
                                       else "one seed")
        md += "| %s | %s | %d | %s | %s | " % (lab, lr, g["n"], fmt(g["mean"], "%.4f"), rng)
        md += "".join("%s | " % fmt(g[c[1]], c[2]) for c in cols_md)
        md += "%s | %s |\n" % (fmt(g["tokens_per_s"], "%.0f"), fmt(mem, "%.2f"))
    sizes = next((r["eval_sizes"] for r in rows if r["eval_sizes"]), {})
    names = {"wikitext": "WikiText-2 documents", "lambada": "LAMBADA examples", "hellaswag": "HellaSwag items"}
    if sizes:
        chance = [c for k, c in (("lambada", "LAMBADA (acc ~0)"), ("hellaswag", "HellaSwag (acc_norm 0.25)"))
                  if k in sizes]
        md += ("\nBenchmarks (the first ones of each set): %s. Small models trained briefly have very large "
               "benchmark perplexities (a WikiText-2 word or a LAMBADA target word spans several tokens, and "
               "their perplexity is per word)%s: compare the schemes with each other. Memory: peak resident set "
               "of the trainer process (CPU) or the highest GPU memory in use (GPU, polled).\n"
               % (", ".join("%s %s" % (names[k], v) for k, v in sizes.items()),
                  " and sit near chance on " + " and ".join(chance) if chance else ""))
    md += "\n## Verdict\n\n" + "".join("- %s\n" % v for v in vlines)
    md += "\n## Per run\n\n| run | status | final val loss | WikiText-2 word ppl | LAMBADA acc | tokens/s | ms/step | train s |\n"
    md += "|---|---|---:|---:|---:|---:|---:|---:|\n"
    for r in rows:
        md += "| %s | %s | %s | %s | %s | %s | %s | %s |\n" % (
            r["run"], r["status"], fmt(r["val_loss"], "%.4f"), fmt(r["wikitext_word_ppl"], "%.1f"),
            fmt(r["lambada_acc"], "%.4f"), fmt(r["tokens_per_s"], "%.0f"), fmt(r["ms_per_step"], "%.1f"),
            fmt(r["train_s"], "%.0f"))
    md += "\n## Loss curves\n\n![losses](losses.png)\n\nPer run: `plots/<run>.png`.\n"
    samples = [(r["label"], r["run"], r["sample"]) for r in rows if r["sample"]]
    if samples:
        md += "\n## Samples (top-p 0.9, temperature 0.8; the first seed of each scheme)\n"
        shown = set()
        for lab, run, text in samples:
            key = run.rpartition("_s")[0]
            if key in shown:
                continue
            shown.add(key)
            md += "\n%s (%s):\n\n```text\n%s\n```\n" % (lab, run, text.replace("```", "'''"))
    write_atomic(os.path.join(a.out, "summary.md"), md)
    write_atomic(os.path.join(a.out, "verdict.txt"), "".join(v + "\n" for v in vlines))

    if not a.no_plots:
        import plot_losses  # matplotlib only when plotting
        logs = [(r["run"], "%s lr %s" % (r["label"], r["lr"]) if len({x["lr"] for x in rows}) > 1 else r["label"],
                 os.path.join(r["dir"], "log.jsonl")) for r in rows if r["log"] and (r["log"].train or r["log"].val)]
        if logs:
            os.makedirs(os.path.join(a.out, "plots"), exist_ok=True)
            quiet = io.StringIO()
            stdout, sys.stdout = sys.stdout, quiet
            try:
                rc = plot_losses.main([p for _, _, p in logs] + ["--out", os.path.join(a.out, "losses.png"),
                                                                   "--labels", ",".join(l for _, l, _ in logs),
                                                                   "--smooth", "0.9", "--zoom",
                                                                   "--title", "loss: every run (seeds share a colour)"])
                for run, lab, p in logs:
                    rc |= plot_losses.main([p, "--out", os.path.join(a.out, "plots", run + ".png"), "--labels", lab,
                                            "--smooth", "0.9", "--zoom", "--title", run])
            finally:
                sys.stdout = stdout
            if rc:
                print("error: a plot failed: %s" % quiet.getvalue().strip(), file=sys.stderr)
                return 1
    print(md[md.index("## Per scheme"):md.index("## Per run")].rstrip())
    return 0


def param_counts(rows):
    """ "preln 1.68M, ldm rls 1.76M": the parameter count of each scheme's first logged run."""
    out, seen = [], set()
    for r in rows:
        if r["log"] is None or r["label"] in seen:
            continue
        with open(r["log"].path, encoding="utf-8") as f:
            for line in f:
                ev = json.loads(line)
                if ev.get("type") == "config":
                    n = int(ev.get("param_count", 0))
                    out.append("%s %s" % (r["label"], "%.2fM" % (n / 1e6) if n < 1e9 else "%.2fB" % (n / 1e9)))
                    seen.add(r["label"])
                    break
    return ", ".join(out) or "-"


if __name__ == "__main__":
    sys.exit(main())
