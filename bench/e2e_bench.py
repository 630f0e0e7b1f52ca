#!/usr/bin/env python3
"""End-to-end GRPO benchmark: baton's grpo driver, and with --with-trl HF TRL's
GRPOTrainer on the same model, data and hyperparameters.

    /opt/baton-venv/bin/python bench/e2e_bench.py [--task toy|add3|tool] [--with-trl] \
        [--steps 30] [--baton-steps N] [--val-every 5] [--workers N] [--busy K] [--budget 150] \
        [--seeds 1,2,3] [--model DIR] [--train FILE] [--val FILE] [-- key=value ...]

Tasks (each a directory the project's own tools make; see docs/benchmarks.md):
  toy   two-digit addition, a ~100k-parameter Qwen2 (configs/grpo_toy.yaml):
            build/examples/toy_task --out toy
            build/examples/sft --config configs/sft_toy.yaml
  add3  three-digit addition, a ~1M-parameter Qwen2 (configs/grpo_add3.yaml):
            build/examples/toy_task --out add3 --max-operand 1000 --train-size 100000 \
                --val-size 512 --hidden 128 --layers 6 --heads 4 --carry-noise 0.9
            build/examples/sft --config configs/sft_add3.yaml
  tool  three-digit multiplication in chat form with a calculator tool, a
        ~1M-parameter Qwen2 that calls it in Qwen's Hermes form; multi-turn
        GRPO, 16 prompts x 8, 80 response tokens, 2 assistant turns
        (configs/grpo_tool_toy.yaml):
            build/examples/toy_task --out tool --op mul --max-operand 1000 \
                --train-size 100000 --val-size 256 --tool-share 0.3 --hidden 128 --layers 6
            build/examples/sft --config configs/sft_tool_toy.yaml

Runs `build/examples/grpo --config <the task's config>` with
trainer.default_local_dir set to a fresh directory (plus --steps, --val-every,
the model and data paths, --workers as trainer.n_gpus_per_node, and every
key=value after `--`), reads the metrics.jsonl it writes there, then
(--with-trl) runs bench/trl_grpo_toy.py (scripts/setup_bench.sh installs TRL)
on the same model and data, with the batch sizes, n, response length,
learning rate and activation recompute (model.enable_gradient_checkpointing)
read from the same config (its `base:` chain and the overrides resolved).
When the config enables multi_turn (the tool task), the TRL side is TRL's
tool-calling GRPO: --tools with the tool the config's
multi_turn.tool_config_path names (only baton's calculator has a TRL peer)
and --max-assistant-turns from multi_turn.max_assistant_turns; both sides'
validation then runs the tool (see bench/trl_grpo_toy.py's header). With
--baton-metrics FILE it reads an existing metrics.jsonl instead of running
baton. With --busy K, K single-threaded busy processes
(`while True: pass`) run beside each tool for its whole run: a shared machine.
Nothing else should run on the machine meanwhile: both sides use its cores.

Prints one JSON object:
  {"baton": {seconds_per_step, tokens_per_s, phases, validation_s,
             val_accuracy, seconds_to, seconds_to_90pct, step_seconds,
             reward_mean, total_seconds, steps, metrics_file
             [, tool_calls_per_sample: multi-turn runs]},
   "trl": {... bench/trl_grpo_toy.py's object, plus seconds_to ...},
   "comparison": {step_speedup, budget_s, target_accuracy,
                  baton_seconds_to_target, trl_seconds_to_target,
                  time_to_target_speedup},
   "machine": {cores, cpu_model, python, torch_version},
   "settings": {...}}

Definitions (the same for both tools; bench/trl_grpo_toy.py measures TRL's):
  - seconds_per_step: mean training-step wall time over steps 2..N (step 1
    carries warm-up). baton: timing_s/step, which covers batch loading,
    generation, reward, old log-probs, advantages and the update, and not
    validation, logging or checkpoints.
  - tokens_per_s: prompt + response tokens (padding excluded; verl's
    perf/total_num_tokens) summed over steps 2..N, over their summed step
    seconds. It is the whole run's rate, not verl's perf/throughput, which
    divides by the number of workers as well.
  - phases: means of timing_s/<phase> over steps 2..N (baton); TRL's split is
    gen / score_and_old_log_prob / update_actor (see its header).
  - val_accuracy: [[step, greedy accuracy on the val file]], step 0 = before
    training. baton: val-core/<data source>/reward/mean@1 (mean over the data
    sources if there are several). With multi-turn (the tool task) a
    validation trajectory is greedy turns through the tool on both sides: a
    turn that calls it gets the result as a tool turn and the next turn
    answers, within max_assistant_turns and the response length.
  - seconds_to: {threshold: training seconds to reach it}: the summed step
    seconds of steps 1..k, k the first validation step with accuracy >= the
    threshold (0 if the base is already there, null if never), for the
    thresholds 0.5, 0.6, ..., 0.9, 0.95. seconds_to_90pct is seconds_to["0.9"].
    Validation time is left out on both sides: the two validate differently
    (baton on its workers, TRL's side in a plain HF generate loop), and it is
    the training speed that is compared.
  - comparison (with --with-trl): step_speedup = TRL's seconds_per_step /
    baton's; target_accuracy = the best validation accuracy TRL reached within
    its first --budget training seconds (150 by default); the seconds each
    tool took to reach it, and time_to_target_speedup = TRL's / baton's (null
    when baton never reached it: give baton --baton-steps enough to train
    --budget / 1.5 seconds). "smoothed": the same on the mean of each three
    consecutive validations, where a single validation's noise (one problem
    of the set) cannot decide the target.
  - --seeds S1,S2,...: one run of each tool per seed (baton's data.seed and
    actor_rollout_ref.rollout.seed, TRL's --seed; each seed's baton run, then
    its TRL run). "baton" and "trl" are then the mean over the runs: step
    seconds step by step, validation accuracy at each validation step, the
    scalar timings; each run's own object is under "runs". The comparison is
    made on those mean curves: one run's curve on a slow climb is too noisy
    to time (its best validation is as much the set's noise as the policy).
  - total_seconds: wall time of the whole command (process start, model load,
    validations included).
  - reward_mean: each training step's mean reward (baton: critic/score/mean).
  - tool_calls_per_sample (multi-turn): each step's tool calls per trajectory
    (baton: multi_turn/tool_calls/mean; TRL: its tools/call_frequency). TRL's
    side also gives val_tool_call_rate: [[step, share of val problems whose
    greedy trajectory called the tool]] (baton logs no such validation metric).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TASKS = {
    "toy": {"config": "configs/grpo_toy.yaml", "model": "toy/sft/model",
            "train": "toy/data/train.jsonl", "val": "toy/data/val.jsonl"},
    "add3": {"config": "configs/grpo_add3.yaml", "model": "add3/sft/model",
             "train": "add3/data/train.jsonl", "val": "add3/data/val.jsonl"},
    "tool": {"config": "configs/grpo_tool_toy.yaml", "model": "tool/sft/model",
             "train": "tool/data/train.jsonl", "val": "tool/data/val.jsonl"},
}
# baton's tools that bench/trl_grpo_toy.py has a TRL peer (a Python function) for.
TRL_TOOLS = {"baton.tools.calculator": "calculator", "calculator": "calculator"}
THRESHOLDS = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]


def fail(message):
    sys.exit(f"e2e_bench: {message}")


def read_metrics(path):
    """{step: {metric: value}} from baton's metrics.jsonl.

    A line is one JSON object: the step's metrics at the top level with a
    "step" key, or nested under "data"/"metrics" (verl's file logger)."""
    if not os.path.exists(path):
        fail(f"{path} does not exist: baton's grpo wrote no metrics file there (is "
             f"'file' in trainer.logger, and did the run finish? see its log)")
    steps = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{i}: not JSON ({e})")
            data = row.get("data") or row.get("metrics") or row
            step = row.get("step", data.get("training/global_step"))
            if step is None:
                fail(f"{path}:{i}: no step (neither 'step' nor 'training/global_step')")
            steps.setdefault(int(step), {}).update(
                {k: v for k, v in data.items() if isinstance(v, (int, float))})
    if not steps:
        fail(f"{path}: no metrics")
    return steps


def val_of(metrics):
    keys = [k for k in metrics if k.startswith("val-core/") and k.endswith("/reward/mean@1")]
    return sum(metrics[k] for k in keys) / len(keys) if keys else None


def resolve_config(path, overrides):
    """The config baton's driver would read: the `base:` chain merged (a later
    file's keys over its base's), then the key=value overrides."""
    import yaml

    def load(p, seen):
        if p in seen:
            fail(f"{p}: a base: cycle")
        with open(os.path.join(ROOT, p)) as f:
            doc = yaml.safe_load(f) or {}
        base = doc.pop("base", None)
        if base is None:
            return doc
        merged = load(os.path.join(os.path.dirname(p), base), seen | {p})
        merge(merged, doc)
        return merged

    def merge(into, doc):
        for k, v in doc.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict):
                merge(into[k], v)
            else:
                into[k] = v

    cfg = load(path, frozenset())
    for o in overrides:
        if "=" not in o:
            fail(f"override {o!r} is not key=value")
        key, value = o.split("=", 1)
        node = cfg
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(value)
    return cfg


def get(cfg, key):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            fail(f"the config has no {key}")
        node = node[part]
    return node


def seconds_to(val_accuracy, step_seconds):
    """{threshold: summed seconds of steps 1..k}, k the first validation step
    at or above the threshold; step_seconds[i] is step i+1's."""
    out = {}
    for t in THRESHOLDS:
        out[str(t)] = None
        for step, acc in val_accuracy:
            if acc is not None and acc >= t:
                out[str(t)] = sum(step_seconds[:step])
                break
    return out


def comparison(baton, trl, budget):
    """Step speed-up, and the time each tool took to the accuracy TRL reached
    within `budget` training seconds."""
    def elapsed(r):
        return [(step, acc, sum(r["step_seconds"][:step])) for step, acc in r["val_accuracy"]]

    def smoothed(points):
        # The mean of each validation and the two before it: one validation
        # set's noise (a problem or two) no longer decides a peak.
        return [(step, sum(a for _, a, _ in points[i - 2:i + 1]) / 3, t)
                for i, (step, _, t) in enumerate(points) if i >= 2]

    def compare(b_points, t_points):
        within = [acc for step, acc, t in t_points if t <= budget]
        target = max(within) if within else None

        def time_to(points):
            if target is None:
                return None
            for step, acc, t in points:
                if acc >= target - 1e-12:
                    return t
            return None

        b, t = time_to(b_points), time_to(t_points)
        return {
            "target_accuracy": target,
            "baton_seconds_to_target": b,
            "trl_seconds_to_target": t,
            "baton_best": max((a for _, a, _ in b_points), default=None),
            "time_to_target_speedup": (t / b if b else None) if b is not None and t is not None else None,
        }

    out = {
        "step_speedup": trl["seconds_per_step"] / baton["seconds_per_step"],
        "budget_s": budget,
        "trl_trained_s": sum(trl["step_seconds"]),
        "baton_trained_s": sum(baton["step_seconds"]),
    }
    out.update(compare(elapsed(baton), elapsed(trl)))
    out["smoothed"] = compare(smoothed(elapsed(baton)), smoothed(elapsed(trl)))
    return out


def summarize_baton(steps):
    train = sorted(s for s, m in steps.items() if s > 0 and "timing_s/step" in m)
    if not train:
        fail("baton's metrics hold no step with timing_s/step")
    timed = train[1:] if len(train) > 1 else train
    seconds = sum(steps[s]["timing_s/step"] for s in timed)
    tokens = [steps[s].get("perf/total_num_tokens") for s in timed]
    phases = {}
    for s in timed:
        for k, v in steps[s].items():
            if k.startswith("timing_s/") and k not in ("timing_s/step", "timing_s/testing"):
                phases.setdefault(k[len("timing_s/"):], []).append(v)
    tests = [steps[s]["timing_s/testing"] for s in train if "timing_s/testing" in steps[s]]
    val = [[s, val_of(m)] for s, m in sorted(steps.items()) if val_of(m) is not None]
    step_seconds = [steps[t]["timing_s/step"] for t in train]
    reached = seconds_to(val, step_seconds)
    extra = {}
    if any("multi_turn/tool_calls/mean" in steps[t] for t in train):
        extra["tool_calls_per_sample"] = [steps[t].get("multi_turn/tool_calls/mean") for t in train]
    return {
        "steps": len(train),
        "seconds_per_step": seconds / len(timed),
        "tokens_per_s": sum(tokens) / seconds if None not in tokens and seconds > 0 else None,
        "phases": {k: sum(v) / len(v) for k, v in sorted(phases.items())},
        "validation_s": sum(tests) / len(tests) if tests else None,
        "val_accuracy": val,
        "seconds_to": reached,
        "seconds_to_90pct": reached["0.9"],
        "step_seconds": step_seconds,
        "reward_mean": [steps[t].get("critic/score/mean") for t in train],
        **extra,
    }


def seed_list(text):
    try:
        seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct seeds")
    return seeds


def mean_run(runs, tool):
    """The mean of one tool's runs over seeds: step seconds step by step,
    validation accuracy at each validation step every run has, and the
    scalar timings; each run's own summary stays under "runs"."""
    n = min(len(r["step_seconds"]) for r in runs)
    step_seconds = [sum(r["step_seconds"][i] for r in runs) / len(runs) for i in range(n)]
    per_run = [dict(r["val_accuracy"]) for r in runs]
    common = sorted(set.intersection(*(set(v) for v in per_run)))
    val = [[s, sum(v[s] for v in per_run) / len(per_run)] for s in common if s <= n]
    if not val:
        fail(f"{tool}'s runs share no validation step")

    def mean_of(key):
        xs = [r.get(key) for r in runs]
        return sum(xs) / len(xs) if None not in xs else None

    phases = {k: sum(r["phases"][k] for r in runs) / len(runs)
              for k in runs[0].get("phases", {}) if all(k in r.get("phases", {}) for r in runs)}
    reached = seconds_to(val, step_seconds)
    per_step = {}
    for key in ("reward_mean", "tool_calls_per_sample"):
        if all(key in r for r in runs):
            per_step[key] = [None if any(r[key][i] is None for r in runs)
                             else sum(r[key][i] for r in runs) / len(runs) for i in range(n)]
    return {
        "seeds": len(runs),
        "steps": n,
        "seconds_per_step": mean_of("seconds_per_step"),
        "tokens_per_s": mean_of("tokens_per_s"),
        "phases": phases,
        "val_accuracy": val,
        "seconds_to": reached,
        "seconds_to_90pct": reached["0.9"],
        "step_seconds": step_seconds,
        **per_step,
        "runs": runs,
    }


def run_baton(args, overrides, out, tag):
    """One baton run (or --baton-metrics read), summarised."""
    if args.baton_metrics:
        metrics_file = args.baton_metrics
        baton_seconds = None
    else:
        grpo = os.path.join(ROOT, args.grpo)
        if not os.access(grpo, os.X_OK):
            fail(f"{args.grpo} is not built (cmake --build build --target grpo)")
        baton_dir = os.path.join(out, "baton" + tag)
        cmd = [grpo, "--config", args.config,
               f"trainer.default_local_dir={baton_dir}",
               f"trainer.total_training_steps={args.baton_steps or args.steps}",
               f"trainer.test_freq={args.val_every}",
               f"actor_rollout_ref.model.path={args.model}",
               f"data.train_files=[{args.train}]",
               f"data.val_files=[{args.val}]",
               # TRL's side runs a constant learning rate (grpo_toy.yaml decays it).
               "actor_rollout_ref.actor.optim.lr_scheduler_type=constant"] + overrides
        _, baton_seconds = run(cmd, os.path.join(out, f"baton{tag}.log"), "baton grpo", args.busy)
        metrics_file = os.path.join(baton_dir, "metrics.jsonl")
    baton = summarize_baton(read_metrics(metrics_file))
    baton["total_seconds"] = baton_seconds
    baton["metrics_file"] = os.path.abspath(metrics_file)
    return baton


def run_trl(args, cfg, out, tag, seed):
    """One bench/trl_grpo_toy.py run with the config's batch sizes, n,
    response length and learning rate."""
    mini = get(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size")
    cmd = [args.trl_python, os.path.join(ROOT, "bench", "trl_grpo_toy.py"),
           "--model", args.model, "--train", args.train, "--val", args.val,
           "--steps", str(args.steps), "--val-every", str(args.val_every),
           "--threads", str(args.trl_threads),
           "--prompts-per-step", str(get(cfg, "data.train_batch_size")),
           "--n", str(get(cfg, "actor_rollout_ref.rollout.n")),
           "--mini-batch-prompts", str(mini),
           "--response-length", str(get(cfg, "data.max_response_length")),
           "--lr", str(get(cfg, "actor_rollout_ref.actor.optim.lr")),
           # TRL's GRPOConfig recomputes activations by default; baton's config says.
           "--gradient-checkpointing",
           "on" if get(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing") is True else "off"]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    cmd += trl_tool_args(cfg)
    stdout, _ = run(cmd, os.path.join(out, f"trl{tag}.log"), "TRL GRPO", args.busy)
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    if not lines:
        fail(f"bench/trl_grpo_toy.py printed no JSON (see {out}/trl{tag}.log)")
    trl = json.loads(lines[-1])
    trl["seconds_to"] = seconds_to(trl["val_accuracy"], trl["step_seconds"])
    return trl


def trl_tool_args(cfg):
    """bench/trl_grpo_toy.py's tool arguments for a config with multi_turn
    enabled (none otherwise): its tool (only the calculator has a TRL peer)
    and its max_assistant_turns."""
    import yaml

    mt = get(cfg, "actor_rollout_ref.rollout.multi_turn")
    if not mt.get("enable"):
        return []
    if mt.get("format", "hermes") != "hermes":
        fail(f"multi_turn.format {mt.get('format')!r}: TRL's side parses Hermes tool calls only")
    if mt.get("interaction_config_path"):
        fail("multi_turn.interaction_config_path: TRL's side has no interactions")
    path = mt.get("tool_config_path")
    if not path:
        fail("multi_turn.enable without a tool_config_path: nothing for TRL's side to call")
    with open(os.path.join(ROOT, path)) as f:
        tools = (yaml.safe_load(f) or {}).get("tools") or []
    names = [TRL_TOOLS.get(t.get("class_name")) for t in tools]
    if len(names) != 1 or names[0] is None:
        fail(f"{path}: TRL's side has a peer for one tool, baton's calculator "
             f"(class_name baton.tools.calculator), not {[t.get('class_name') for t in tools]}")
    turns = mt.get("max_assistant_turns")
    return ["--tools", names[0], "--max-assistant-turns", str(turns or 0)]


def run(cmd, log_path, what, busy=0):
    print(f"e2e_bench: {what}: {' '.join(cmd)} (log: {log_path})", file=sys.stderr)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        seconds = time.perf_counter() - t0
    finally:
        for sp in spinners:
            sp.kill()
            sp.wait()
    with open(log_path, "a") as log:
        log.write(proc.stdout)
    if proc.returncode != 0:
        with open(log_path) as log:
            tail = log.read()[-3000:]
        fail(f"{what} exited with status {proc.returncode}; the end of {log_path}:\n{tail}")
    return proc.stdout, seconds


def machine():
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cores": os.cpu_count(), "cpu_model": model or platform.processor(),
            "python": platform.python_version()}
    try:
        import torch
        info["torch_version"] = torch.__version__
    except ImportError:
        pass
    return info


def main():
    argv = sys.argv[1:]
    overrides = []
    if "--" in argv:
        i = argv.index("--")
        argv, overrides = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grpo", default="build/examples/grpo", help="baton's GRPO driver")
    p.add_argument("--task", default="toy", choices=sorted(TASKS),
                   help="sets --config, --model, --train and --val (each may still be given)")
    p.add_argument("--config", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--train", default=None)
    p.add_argument("--val", default=None)
    p.add_argument("--workers", type=int, default=None,
                   help="baton's worker processes (trainer.n_gpus_per_node; default: the config's)")
    p.add_argument("--busy", type=int, default=0,
                   help="single-threaded busy processes beside each tool while it runs")
    p.add_argument("--budget", type=float, default=150.0,
                   help="TRL training seconds whose best accuracy is the comparison's target")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--baton-steps", type=int, default=None,
                   help="baton's steps, if not --steps (e.g. enough to train --budget / 1.5 s)")
    p.add_argument("--val-every", type=int, default=5)
    p.add_argument("--out", default=None, help="directory for both runs' outputs and logs (default: a new temporary one)")
    p.add_argument("--baton-metrics", default=None, help="read this metrics.jsonl instead of running baton")
    p.add_argument("--with-trl", action="store_true")
    p.add_argument("--trl-python", default=sys.executable, help="the Python that has TRL")
    p.add_argument("--trl-threads", type=int, default=2)
    p.add_argument("--seeds", type=seed_list, default=None,
                   help="comma-separated seeds: one run of each tool per seed "
                        "(baton's data.seed and rollout.seed, TRL's --seed), compared "
                        "on the runs' mean curves")
    args = p.parse_args(argv)
    for key in ("config", "model", "train", "val"):
        if getattr(args, key) is None:
            setattr(args, key, TASKS[args.task][key])
    if args.workers is not None:
        overrides = [f"trainer.n_gpus_per_node={args.workers}"] + overrides

    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="e2e_bench."))
    os.makedirs(out, exist_ok=True)
    for path in (args.model, args.train, args.val):
        if not os.path.exists(os.path.join(ROOT, path)):
            fail(f"{path} does not exist (make the {args.task} task first: see this "
                 f"script's header)")
    result = {}
    cfg = resolve_config(args.config, overrides) if args.with_trl else None
    seeds = [None] if args.seeds is None else args.seeds
    if args.baton_metrics and args.seeds is not None:
        fail("--baton-metrics reads one run; it does not take --seeds")
    baton_runs, trl_runs = [], []
    for seed in seeds:
        # One seed's baton run, then its TRL run: a drift of the machine's
        # speed during the benchmark reaches both tools alike.
        tag = "" if seed is None else f"_seed{seed}"
        seeded = overrides if seed is None else overrides + [
            f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}"]
        baton_runs.append(run_baton(args, seeded, out, tag))
        if args.with_trl:
            trl_runs.append(run_trl(args, cfg, out, tag, seed))
    result["baton"] = baton_runs[0] if len(baton_runs) == 1 else mean_run(baton_runs, "baton")
    if args.with_trl:
        result["trl"] = trl_runs[0] if len(trl_runs) == 1 else mean_run(trl_runs, "trl")
        result["comparison"] = comparison(result["baton"], result["trl"], args.budget)

    result["machine"] = machine()
    result["settings"] = {"task": args.task, "config": args.config, "model": args.model,
                          "steps": args.steps, "val_every": args.val_every, "busy": args.busy,
                          "seeds": args.seeds,
                          "overrides": overrides, "out": out}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
