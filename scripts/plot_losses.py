#!/usr/bin/python3
"""Plot training and validation loss curves of several runs from their JSONL logs into one PNG.

Usage:
  /usr/bin/python3 scripts/plot_losses.py RUN1/log.jsonl RUN2/log.jsonl ... --out losses.png
      [--labels preln,ldm,...] [--smooth 0.9] [--title TEXT] [--logy]

Log format (core/logger.h, written by the trainers' --log): one JSON object per line;
{"type":"config", "config": {"preset", "scheme", ...}, ...} first, then {"type":"step",
"step", "loss", ...} per optimizer step, {"type":"val", "step", "val_loss"} per validation
(and {"type":"eval", "step", "results": {...}} from --eval-every, ignored here). A resumed run
appends to the same log ({"type":"resume"}); a step logged twice keeps its last value.

Each run gets one colour: the training loss as a thin line (exponential moving average when
--smooth > 0, raw curve faint behind it) and the validation loss as a thicker line with dots.
The label defaults to "<scheme> (<preset>)" from the config line, else the log's directory.
Uses Debian's python3-matplotlib with the Agg backend (no display needed). Exit status 1 when a
log cannot be read or holds no loss at all.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_log(path):
    """-> (label, {step: loss}, {step: val_loss}). ValueError on unreadable lines."""
    train, val, label = {}, {}, None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError("%s:%d: not JSON (%s)" % (path, n, e))
            t = ev.get("type")
            if t == "config" and label is None:
                c = ev.get("config", {})
                if "scheme" in c:
                    label = "%s (%s)" % (c.get("scheme"), c.get("preset", "?"))
            elif t == "step" and ev.get("loss") is not None:
                train[int(ev["step"])] = float(ev["loss"])
            elif t == "val" and ev.get("val_loss") is not None:
                val[int(ev["step"])] = float(ev["val_loss"])
    if label is None:
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    return label, train, val


def ema(ys, beta):
    out, m = [], None
    for i, y in enumerate(ys):
        m = y if m is None else beta * m + (1 - beta) * y
        out.append(m / 1.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", help="JSONL logs of the runs")
    ap.add_argument("--out", required=True, help="PNG file to write")
    ap.add_argument("--labels", default="", help="comma-separated labels, one per log")
    ap.add_argument("--smooth", type=float, default=0.0, help="EMA factor for the train loss (0 = raw, e.g. 0.9)")
    ap.add_argument("--title", default="training and validation loss")
    ap.add_argument("--logy", action="store_true", help="logarithmic loss axis")
    a = ap.parse_args()
    labels = [s for s in a.labels.split(",")] if a.labels else []
    if labels and len(labels) != len(a.logs):
        print("error: --labels has %d entries for %d logs" % (len(labels), len(a.logs)), file=sys.stderr)
        return 1
    if not 0 <= a.smooth < 1:
        print("error: --smooth must be in [0, 1)", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, path in enumerate(a.logs):
        try:
            label, train, val = read_log(path)
        except (OSError, ValueError) as e:
            print("error: %s" % e, file=sys.stderr)
            return 1
        if not train and not val:
            print("error: %s: no 'step' or 'val' losses in the log" % path, file=sys.stderr)
            return 1
        if labels:
            label = labels[i]
        c = colors[i % len(colors)]
        if train:
            xs = sorted(train)
            ys = [train[x] for x in xs]
            if a.smooth > 0:
                ax.plot(xs, ys, color=c, alpha=0.25, linewidth=0.8)
                ax.plot(xs, ema(ys, a.smooth), color=c, linewidth=1.2, label="%s train" % label)
            else:
                ax.plot(xs, ys, color=c, linewidth=1.0, label="%s train" % label)
        if val:
            xs = sorted(val)
            ax.plot(xs, [val[x] for x in xs], color=c, linewidth=2.2, linestyle="--", marker="o", markersize=4,
                    label="%s val" % label)
        print("%s: %s | %d train steps (last loss %s) | %d val points (last %s)"
              % (path, label, len(train), "%.4f" % train[max(train)] if train else "-", len(val),
                 "%.4f" % val[max(val)] if val else "-"))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    if a.logy:
        ax.set_yscale("log")
    ax.set_title(a.title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = a.out + ".tmp.%d.png" % os.getpid()
    try:
        fig.savefig(tmp)
        os.replace(tmp, a.out)
    except OSError as e:
        print("error: cannot write %s: %s" % (a.out, e), file=sys.stderr)
        return 1
    print("wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
