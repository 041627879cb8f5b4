#!/usr/bin/python3
"""Plot training and validation loss curves of several runs from their JSONL logs into one PNG.

Usage:
  /usr/bin/python3 scripts/plot_losses.py RUN1/log.jsonl RUN2/log.jsonl ... --out losses.png
      [--labels preln,ldm,...] [--smooth 0.9] [--title TEXT] [--logy] [--curves both|train|val]
      [--zoom]

Log format: scripts/runlog.py (the trainers' --log; a resumed run's repeated steps keep their
last value). Each label gets one colour: the training loss as a thin line (exponential moving
average when --smooth > 0, raw curve faint behind it) and the validation loss as a thicker
dashed line with dots. The label defaults to the scheme with its variant options and the model
shape from the config line ("ldm delta no-res (small d=256 L=4)", "attnres-block N=8 (= full)
(...)"), else the log's directory. Runs that share a label (e.g. the seeds of one scheme:
--labels preln,preln,ldm,ldm) share its colour and its one legend entry. Colours stay distinct
up to 20 labels (tab10, then tab20), then come from a continuous colour map. The legend sits
outside the axes, right of the curves. --zoom caps the loss axis at the highest value drawn after
the first 10% of the steps, so that the first steps' drop from ln V does not flatten the rest. Uses Debian's python3-matplotlib with the Agg backend
(no display needed). Exit status 1 when a log cannot be read or holds no loss at all.
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlog import RunLog  # noqa: E402


def ema(ys, beta):
    out, m = [], None
    for y in ys:
        m = y if m is None else beta * m + (1 - beta) * y
        out.append(m)
    return out


def palette(n):
    """n distinct colours: tab10 up to 10, tab20 up to 20, else samples of a continuous map."""
    if n <= 10:
        return list(plt.get_cmap("tab10").colors)[:max(n, 1)]
    if n <= 20:
        return list(plt.get_cmap("tab20").colors)[:n]
    cmap = plt.get_cmap("gist_rainbow")
    return [cmap(i / (n - 1)) for i in range(n)]


def main(argv=None):
    """The command line (argv without the program name; None = sys.argv[1:]); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", help="JSONL logs of the runs")
    ap.add_argument("--out", required=True, help="PNG file to write")
    ap.add_argument("--labels", default="", help="comma-separated labels, one per log (equal labels share a colour)")
    ap.add_argument("--smooth", type=float, default=0.0, help="EMA factor for the train loss (0 = raw, e.g. 0.9)")
    ap.add_argument("--title", default="training and validation loss")
    ap.add_argument("--logy", action="store_true", help="logarithmic loss axis")
    ap.add_argument("--curves", default="both", choices=["both", "train", "val"], help="which curves to draw")
    ap.add_argument("--zoom", action="store_true", help="loss axis from the values after the first 10%% of the steps")
    a = ap.parse_args(argv)
    labels = [s for s in a.labels.split(",")] if a.labels else []
    if labels and len(labels) != len(a.logs):
        print("error: --labels has %d entries for %d logs" % (len(labels), len(a.logs)), file=sys.stderr)
        return 1
    if not 0 <= a.smooth < 1:
        print("error: --smooth must be in [0, 1)", file=sys.stderr)
        return 1
    runs = []
    for i, path in enumerate(a.logs):
        try:
            r = RunLog(path)
        except (OSError, ValueError) as e:
            print("error: %s" % e, file=sys.stderr)
            return 1
        if not r.train and not r.val:
            print("error: %s: no 'step' or 'val' losses in the log" % path, file=sys.stderr)
            return 1
        runs.append((labels[i] if labels else r.label(), r))
    order = []
    for label, _ in runs:
        if label not in order:
            order.append(label)
    colour = dict(zip(order, palette(len(order))))

    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    seen = set()
    last_step = max(max(list(r.train) + list(r.val) + [0]) for _, r in runs)
    zoom_hi, lo = None, None  # the highest / lowest value drawn after the first 10% of the steps

    def drawn(xs, ys):
        nonlocal zoom_hi, lo
        late = [y for x, y in zip(xs, ys) if x >= 0.1 * last_step]
        if late:
            zoom_hi = max(late) if zoom_hi is None else max(zoom_hi, max(late))
            lo = min(late) if lo is None else min(lo, min(late))

    for label, r in runs:
        c = colour[label]
        first = label not in seen
        seen.add(label)
        if r.train and a.curves != "val":
            xs = sorted(r.train)
            ys = [r.train[x] for x in xs]
            name = "%s train" % label if first else None
            if a.smooth > 0:
                ax.plot(xs, ys, color=c, alpha=0.2, linewidth=0.7)
                ax.plot(xs, ema(ys, a.smooth), color=c, linewidth=1.1, label=name)
                drawn(xs, ema(ys, a.smooth))
            else:
                ax.plot(xs, ys, color=c, linewidth=0.9, alpha=0.8, label=name)
                drawn(xs, ys)
        if r.val and a.curves != "train":
            xs = sorted(r.val)
            ax.plot(xs, [r.val[x] for x in xs], color=c, linewidth=2.0, linestyle="--", marker="o", markersize=4,
                    label="%s val" % label if first else None)
            drawn(xs, [r.val[x] for x in xs])
        fv = r.final_val()
        print("%s: %s | %d train steps (last loss %s) | %d val points (last %s)"
              % (r.path, label, len(r.train), "%.4f" % r.train[max(r.train)] if r.train else "-", len(r.val),
                 "%.4f" % fv if fv is not None else "-"))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    if a.logy:
        ax.set_yscale("log")
    if a.zoom and zoom_hi is not None and zoom_hi > lo:
        pad = 0.05 * (zoom_hi - lo)
        ax.set_ylim(lo - pad, zoom_hi + pad)
    ax.set_title(a.title)
    ax.grid(True, alpha=0.3)
    # outside the axes, so that it never covers a curve
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    fig.tight_layout()
    tmp = a.out + ".tmp.%d.png" % os.getpid()
    try:
        fig.savefig(tmp, bbox_inches="tight")
        os.replace(tmp, a.out)
    except OSError as e:
        print("error: cannot write %s: %s" % (a.out, e), file=sys.stderr)
        return 1
    plt.close(fig)
    print("wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
