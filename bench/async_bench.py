#!/usr/bin/env python3
"""Fully-async vs synchronous GRPO on the toy task, same run: bench/e2e_bench.py
once with configs/grpo_toy.yaml (the actor on 2 worker processes, colocated
rollout) and once with configs/grpo_toy_async.yaml (1 actor + 1 RolloutWorker
process, 2 in all), alternating per seed so that a drift of the machine's
speed reaches both alike.

    /opt/baton-venv/bin/python bench/async_bench.py [--steps 30] [--val-every 5] \
        [--seeds 1,2,3] [--partial CHUNK] [-- key=value ...]

With --partial CHUNK it compares the async run with one generate call per
batch ("async") against the same run with async_training.partial_rollout and
CHUNK tokens per call ("partial") instead of sync against async.

The toy task must exist (bench/e2e_bench.py's header). key=value overrides go
to both runs (async_training.* ones only matter to the async run). Prints one
JSON object: {"sync": {...}, "async": {...}, "speedup": {tokens_per_s,
seconds_per_step, seconds_to_90pct}} with e2e_bench.py's summaries
(tokens_per_s: prompt + response tokens per second of training steps; the
async run's step time includes its waits for batches and its weight syncs);
the async one also the run's async/* metrics of its last step. Nothing else
should run on the machine meanwhile.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def e2e(config, workers, args, overrides, out, seed):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "e2e_bench.py"), "--task", "toy",
           "--config", config, "--workers", str(workers), "--steps", str(args.steps),
           "--val-every", str(args.val_every), "--out", out]
    if seed is not None:
        cmd += ["--seeds", str(seed)]
    cmd += ["--"] + overrides
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"async_bench: {' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)["baton"]


def last_async_metrics(metrics_file):
    last = {}
    with open(metrics_file) as f:
        for line in f:
            j = json.loads(line)
            if "async/param_version" in j:
                last = {k: v for k, v in j.items() if k.startswith("async/")}
    return last


def async_means(metrics_file):
    """Means over the steps of the weight-sync seconds, the trainer's wait for
    a batch and the samples resumed across a sync."""
    sums, n = {}, 0
    with open(metrics_file) as f:
        for line in f:
            j = json.loads(line)
            if "async/param_version" not in j:
                continue
            n += 1
            for k in ("async/sync_s", "async/trainer_idle_s", "async/partial_resumed_samples",
                      "async/staleness"):
                if k in j:
                    sums[k] = sums.get(k, 0.0) + j[k]
    return {k + "_mean": v / n for k, v in sums.items()} if n else {}


def mean(runs, key):
    xs = [r[key] for r in runs]
    return None if None in xs else sum(xs) / len(xs)


def main():
    argv = sys.argv[1:]
    overrides = []
    if "--" in argv:
        at = argv.index("--")
        argv, overrides = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--val-every", type=int, default=5)
    p.add_argument("--seeds", default=None, help="comma-separated seeds, one run of each per seed")
    p.add_argument("--out", default=None)
    p.add_argument("--partial", type=int, default=None, metavar="CHUNK",
                   help="compare async one-call vs async partial rollout with CHUNK tokens per call")
    args = p.parse_args(argv)
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="async_bench."))
    seeds = [None] if args.seeds is None else [int(s) for s in args.seeds.split(",")]
    # (config, actor workers, extra overrides) of the baseline and the contender.
    if args.partial is None:
        modes = {"sync": ("configs/grpo_toy.yaml", 2, []),
                 "async": ("configs/grpo_toy_async.yaml", 1, [])}
    else:
        partial = ["async_training.partial_rollout=true",
                   f"async_training.partial_rollout_chunk={args.partial}"]
        modes = {"async": ("configs/grpo_toy_async.yaml", 1, []),
                 "partial": ("configs/grpo_toy_async.yaml", 1, partial)}
    runs = {mode: [] for mode in modes}
    for seed in seeds:
        tag = "" if seed is None else f"_seed{seed}"
        for mode, (config, workers, extra) in modes.items():
            runs[mode].append(e2e(config, workers, args, overrides + extra,
                                  os.path.join(out, mode + tag), seed))
    result = {}
    for mode, rs in runs.items():
        result[mode] = {
            "runs": len(rs),
            "tokens_per_s": mean(rs, "tokens_per_s"),
            "seconds_per_step": mean(rs, "seconds_per_step"),
            "seconds_to_90pct": mean(rs, "seconds_to_90pct"),
            "val_accuracy": [r["val_accuracy"] for r in rs],
            "phases": rs[0]["phases"],
            "metrics_files": [r["metrics_file"] for r in rs],
        }
    for mode, rs in runs.items():
        if mode == "sync":
            continue
        result[mode]["last_async_metrics"] = last_async_metrics(rs[0]["metrics_file"])
        per_run = [async_means(r["metrics_file"]) for r in rs]
        result[mode]["step_means"] = {k: sum(m[k] for m in per_run) / len(per_run)
                                      for k in per_run[0]}
    base, contender = list(modes)

    def ratio(key, higher_is_better):
        a, s = result[contender][key], result[base][key]
        if a is None or s is None or a == 0 or s == 0:
            return None
        return a / s if higher_is_better else s / a

    result["speedup"] = {"tokens_per_s": ratio("tokens_per_s", True),
                         "seconds_per_step": ratio("seconds_per_step", False),
                         "seconds_to_90pct": ratio("seconds_to_90pct", False)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
