"""Reading the trainers' JSONL logs and naming runs: shared by scripts/plot_losses.py,
scripts/eval_checkpoints.sh (its table) and scripts/study.sh (its summary).

Log format (core/logger.h, doc/training.md "Logs"): one JSON object per line; {"type":"config",
"config": {ModelConfig}, "args": {...}} first (a resumed run appends {"type":"resume"}), then
{"type":"step", "step", "loss", "ms", "tokens_per_s", ...} per optimizer step, {"type":"val",
"step", "val_loss"}, {"type":"eval", "step", "results"}, {"type":"sample", "step", "text"}.
A step logged twice (a run resumed from an earlier checkpoint) keeps its last value. A record cut
short by a kill (with the next invocation's first record on the same line) is skipped with a
note on stderr, the records around it kept; a val_loss of null (not finite) reads as NaN.
"""
import json
import sys
import os
import statistics


def scheme_label(c):
    """The scheme with the options that tell apart runs of one scheme, from a ModelConfig dict
    (the log's config line or an eval_cpu JSON's "config"): "ldm rls", "ldm delta no-res",
    "attnres-block N=2", "attnres-block N=8 (= full)" when N >= D = 2 n_layer, "mhc n=2"."""
    s = c.get("scheme", "?")
    if s == "ldm":
        s += " " + c.get("ldm_rule", "rls")
        if c.get("ldm_residual") is False:
            s += " no-res"
        if c.get("ldm_forget") is False:
            s += " no-forget"
        for key, name, default in (("ldm_dk", "dk", 8), ("ldm_heads", "H", 4)):
            if c.get(key, default) != default:
                s += " %s=%s" % (name, c[key])
        if abs(c.get("ldm_lambda_min", 0.95) - 0.95) > 1e-12:
            s += " lmin=%g" % c["ldm_lambda_min"]
        if abs(c.get("ldm_delta", 0.1) - 0.1) > 1e-12:
            s += " delta=%g" % c["ldm_delta"]
    elif s == "attnres-block":
        n, d = c.get("attnres_blocks", 8), 2 * c.get("n_layer", 1 << 30)
        s += " N=%d" % min(n, d) + (" (= full)" if n >= d else "")
    elif s in ("hc", "mhc"):
        if c.get("hc_streams", 4) != 4:
            s += " n=%d" % c["hc_streams"]
        if s == "mhc" and c.get("sinkhorn_iters", 20) != 20:
            s += " t=%d" % c["sinkhorn_iters"]
    return s


def run_label(c):
    """scheme_label plus the model shape: "ldm rls (small d=128 L=4)"."""
    return "%s (%s d=%s L=%s)" % (scheme_label(c), c.get("preset", "?"), c.get("d_model", "?"), c.get("n_layer", "?"))


class RunLog:
    """One run's log: config (dict or None), train {step: loss}, val {step: val_loss},
    steps {step: the step record}, evals [(step, results)], samples [(step, text)], resumes."""

    def __init__(self, path):
        self.path = path
        self.config, self.args = None, {}
        self.train, self.val, self.steps = {}, {}, {}
        self.evals, self.samples = [], []
        self.resumes = 0
        self.bad_lines = 0  # records skipped because they are not JSON (a line cut short by a kill)
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    events = [json.loads(line)]
                except json.JSONDecodeError:
                    # a line cut short by a kill, with the next invocation's first record glued on:
                    # the records that do parse are kept, the rest is skipped (and counted)
                    events = []
                    self.bad_lines += 1
                    sys.stderr.write("runlog: %s:%d: skipped a record that is not JSON (cut short?)\n" % (path, n))
                    dec = json.JSONDecoder()
                    at = line.find("{", 1)
                    while at != -1:  # the first "{" from which the rest of the line is one record
                        try:
                            ev, end = dec.raw_decode(line, at)
                            if not line[end:].strip() and isinstance(ev, dict) and "type" in ev:
                                events.append(ev)
                                break
                        except json.JSONDecodeError:
                            pass
                        at = line.find("{", at + 1)
                for ev in events:
                    if isinstance(ev, dict):
                        self._add(ev)

    def _add(self, ev):
        t = ev.get("type")
        if t == "config" and self.config is None:
            self.config = ev.get("config", {})
            self.args = ev.get("args", {})
        elif t == "resume":
            self.resumes += 1
        elif t == "step" and ev.get("loss") is not None:
            self.train[int(ev["step"])] = float(ev["loss"])
            self.steps[int(ev["step"])] = ev
        elif t == "val" and "val_loss" in ev:  # null (a non-finite loss) is kept as NaN
            self.val[int(ev["step"])] = float("nan") if ev["val_loss"] is None else float(ev["val_loss"])
        elif t == "eval":
            self.evals.append((int(ev.get("step", 0)), ev.get("results", {})))
        elif t == "sample":
            self.samples.append((int(ev.get("step", 0)), ev.get("text", "")))

    def label(self):
        if self.config and "scheme" in self.config:
            return run_label(self.config)
        return os.path.basename(os.path.dirname(os.path.abspath(self.path))) or self.path

    def final_val(self):
        return self.val[max(self.val)] if self.val else None

    def median_ms(self, skip=2):
        """Median step time (ms) over the step records, without the first `skip` steps (warm-up)."""
        xs = sorted(self.steps)
        xs = xs[skip:] if len(xs) > skip else xs
        v = [float(self.steps[x]["ms"]) for x in xs if "ms" in self.steps[x]]
        return statistics.median(v) if v else None

    def median_tokens_per_s(self, skip=2):
        """Tokens per step / median_ms: the throughput of the median step."""
        ms = self.median_ms(skip)
        per_step = self.args.get("total_batch_tokens") or (self.args.get("B", 0) * self.args.get("T", 0))
        if not ms or not per_step:
            return None
        return per_step / (ms / 1e3)
