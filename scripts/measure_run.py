#!/usr/bin/python3
"""Runs one command and appends what it cost to a JSONL file (used by scripts/study.sh).

Usage: /usr/bin/python3 scripts/measure_run.py --record FILE [--gpu] -- CMD ARGS...

Appends one line {"start": unix time, "wall_s", "rc", "peak_rss_kib", "gpu_peak_mib"} and exits
with the command's status (128 + signal number when a signal ended it).
  peak_rss_kib  the largest resident set of the command and of every process under it that was
                waited for (getrusage RUSAGE_CHILDREN ru_maxrss; under mpirun: the largest rank)
  gpu_peak_mib  with --gpu and nvidia-smi on the PATH: the highest memory.used of any GPU, polled
                every 2 s while the command runs (every process on those GPUs counts, and a peak
                shorter than 2 s can be missed); otherwise null
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time


def main():
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if "--" not in args:
        print("error: usage: measure_run.py --record FILE [--gpu] -- CMD ...", file=sys.stderr)
        return 2
    k = args.index("--")
    opts, cmd = args[:k], args[k + 1:]
    record, gpu = None, False
    i = 0
    while i < len(opts):
        if opts[i] == "--record" and i + 1 < len(opts):
            record = opts[i + 1]
            i += 2
        elif opts[i] == "--gpu":
            gpu = True
            i += 1
        else:
            print("error: unknown option %s" % opts[i], file=sys.stderr)
            return 2
    if not record or not cmd:
        print("error: --record FILE and a command are required", file=sys.stderr)
        return 2

    gpu_peak = [None]
    stop = threading.Event()
    smi = shutil.which("nvidia-smi") if gpu else None

    def poll():
        while not stop.is_set():
            try:
                out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                used = [float(x) for x in out.split() if x.replace(".", "", 1).isdigit()]
                if used:
                    gpu_peak[0] = max(used + ([gpu_peak[0]] if gpu_peak[0] is not None else []))
            except (OSError, subprocess.SubprocessError, ValueError):
                pass
            stop.wait(2.0)

    t0 = time.time()
    poller = threading.Thread(target=poll, daemon=True) if smi else None
    if poller:
        poller.start()
    try:
        p = subprocess.Popen(cmd)
    except OSError as e:
        print("error: cannot run %s: %s" % (cmd[0], e), file=sys.stderr)
        return 127

    def forward(sig, _frame):  # a TERM/INT to this wrapper reaches the trainer
        try:
            p.send_signal(sig)
        except OSError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    rc = p.wait()
    stop.set()
    if poller:
        poller.join(timeout=15)
    rc = 128 - rc if rc < 0 else rc
    rec = {"start": round(t0, 3), "wall_s": round(time.time() - t0, 3), "rc": rc,
           "peak_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "gpu_peak_mib": gpu_peak[0]}
    os.makedirs(os.path.dirname(os.path.abspath(record)), exist_ok=True)
    with open(record, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
