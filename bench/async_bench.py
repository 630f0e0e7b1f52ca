#!/usr/bin/env python3
"""Fully-async vs synchronous GRPO on the toy task, same run: bench/e2e_bench.py
once with configs/grpo_toy.yaml (the actor on 2 worker processes, colocated
rollout) and once with configs/grpo_toy_async.yaml (1 actor + 1 RolloutWorker
process, 2 in all), alternating per seed so that a drift of the machine's
speed reaches both alike.

    /opt/baton-venv/bin/python bench/async_bench.py [--steps 30] [--val-every 5] \
        [--seeds 1,2,3] [-- key=value ...]

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
    args = p.parse_args(argv)
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="async_bench."))
    seeds = [None] if args.seeds is None else [int(s) for s in args.seeds.split(",")]
    runs = {"sync": [], "async": []}
    for seed in seeds:
        tag = "" if seed is None else f"_seed{seed}"
        runs["sync"].append(e2e("configs/grpo_toy.yaml", 2, args, overrides,
                                os.path.join(out, "sync" + tag), seed))
        runs["async"].append(e2e("configs/grpo_toy_async.yaml", 1, args, overrides,
                                 os.path.join(out, "async" + tag), seed))
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
    result["async"]["last_async_metrics"] = last_async_metrics(runs["async"][0]["metrics_file"])

    def ratio(key, higher_is_better):
        a, s = result["async"][key], result["sync"][key]
        if a is None or s is None or a == 0 or s == 0:
            return None
        return a / s if higher_is_better else s / a

    result["speedup"] = {"tokens_per_s": ratio("tokens_per_s", True),
                         "seconds_per_step": ratio("seconds_per_step", False),
                         "seconds_to_90pct": ratio("seconds_to_90pct", False)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
