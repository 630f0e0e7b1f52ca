#!/usr/bin/env python3
"""The GRPO toy run of configs/grpo_toy.yaml with HF TRL's GRPOTrainer, on CPU.

    /opt/baton-venv/bin/python bench/trl_grpo_toy.py --model toy/sft/model \
        [--train toy/data/train.jsonl] [--val toy/data/val.jsonl] [--steps 30] \
        [--val-every 5] [--threads 2] [--seed 1] [--prompts-per-step 32] [--n 8] \
        [--mini-batch-prompts 16] [--response-length 10] [--lr 1e-4]

The defaults are configs/grpo_toy.yaml's; bench/e2e_bench.py passes the values
of whichever config it runs baton with.

Needs TRL in the venv (scripts/setup_bench.sh installs the pinned version).
Prints one JSON object on stdout (everything else goes to stderr):
  {"tool": "trl", "trl_version", "torch_version", "transformers_version",
   "steps", "seconds_per_step", "tokens_per_s", "phases", "val_accuracy",
   "seconds_to_90pct", "step_seconds", "total_seconds", "threads", "settings"}

A "step" here is baton's (verl's) step: one generation batch of 32 prompts x
8 samples, then the PPO update over it. TRL counts optimizer steps, so one
baton step is two TRL steps (see the mapping below); --steps and the steps in
val_accuracy are in baton's unit.

What matches configs/grpo_toy.yaml (+ ppo_trainer.yaml defaults):
  - the model directory, the tokenizer files (read with PreTrainedTokenizerFast
    from tokenizer.json: AutoTokenizer maps this directory to Qwen2Tokenizer,
    which decodes "#### 50" as "####50"), plain-string prompts, no chat template;
  - the reward: verl's GSM8K strict scorer as baton's workers/rewards/gsm8k_reward.cpp
    implements it (last 300 code points, the last "#### (-?[0-9.,]+)", commas
    and "$" removed, string-equal to the ground truth: 1.0, else 0.0);
  - 32 prompts x n=8 per step, sampling at temperature 1.0 (top-k/top-p off),
    at most 10 response tokens, eos ends a response (and is part of it);
  - GRPO advantages: (r - group mean) / (group std + eps), unbiased std;
  - the update: PPO clip 0.2 both sides, no KL (beta 0), no entropy bonus,
    1 PPO epoch, mini-batches of 16 prompts (128 samples) -> 2 optimizer steps
    per generation batch, the old log-probs computed once after generation
    (TRL does this because steps_per_generation > gradient_accumulation_steps),
    loss = token-mean over the mini-batch (TRL's loss_type "bnpo" with one
    micro-batch per optimizer step is exactly that; "dapo" divides by half the
    generation batch's tokens instead);
  - AdamW lr 1e-4 constant, no warm-up, weight decay 0.01 (not on norms and
    biases, in both), betas (0.9, 0.999), gradient clip 1.0;
  - validation: greedy (temperature 0), 10 new tokens, on every val prompt,
    before training, every --val-every steps and after the last one.

What differs, and why:
  - processes/threads: baton runs 2 worker processes (data parallel, one CPU
    slot each); TRL runs 1 process with --threads torch threads (2 by default),
    the same two cores. TRL's multi-process CPU DDP is not what a CPU user of
    TRL runs.
  - generation: TRL uses transformers' generate (dynamic KV cache, SDPA); baton
    uses its own rollout engine. That is a difference the comparison measures.
  - eps of the advantage: TRL 1e-4, verl/baton 1e-6 (TRL hard-codes it).
  - verl's policy loss has dual clip (clip_ratio_c 3: a negative-advantage
    token's loss is capped at 3|A|); TRL has none. It acts only where the
    ratio exceeds 3, which one update between the two mini-batches rarely
    reaches.
  - mini-batch composition: TRL shuffles the 256 samples before cutting them
    into the 2 mini-batches (groups are split across them); verl keeps the
    order (actor.shuffle false), so each mini-batch holds 16 whole groups.
  - prompt order and sampling RNG: both shuffle the training set with a seed,
    but not in the same order, and draw different samples.
  - TRL computes per-token entropies in the loss forward for logging; verl
    computes entropy once in old_log_prob. A small extra cost on TRL's side.
  - validation is this script's own loop (HF generate, batched, left-padded),
    not TRL's; its time is not counted in step times (baton's timing_s/step
    does not count its validation either).

Timing: a step's time is the wall time between the ends of consecutive baton
steps (TRL's on_step_end of every second optimizer step), minus the time of
the validation run inside it; the first starts at TRL's on_train_begin.
seconds_per_step is the mean without the first step (warm-up);
tokens_per_s is (prompt + response tokens, padding excluded, as verl's
perf/total_num_tokens counts them) / step seconds, over the same steps;
seconds_to_90pct is the sum of step times up to the first validation with
accuracy >= 0.9 (null if none); total_seconds is the whole run, model load and
validations included. phases: gen (HF generate), score_and_old_log_prob (the
rest of TRL's _generate_and_score_completions: decode, reward, advantages, old
log-probs), update_actor (the remainder of the step: both optimizer steps),
means over the same steps.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

CLIP = 0.2

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_strict_score(response: str, ground_truth: str) -> float:
    """verl's gsm8k.compute_score (method strict, format_score 0, score 1)."""
    text = response[-300:]  # verl reads only the last 300 characters
    found = _STRICT.findall(text)
    if not found:
        return 0.0
    answer = found[-1].replace(",", "").replace("$", "")
    return 1.0 if answer == ground_truth else 0.0


def read_rows(path):
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                rows.append({"prompt": r["prompt"], "ground_truth": str(r["reward_model"]["ground_truth"])})
            except (KeyError, TypeError, json.JSONDecodeError) as e:
                sys.exit(f"trl_grpo_toy: {path}:{i}: not a verl prompt row ({e!r})")
    if not rows:
        sys.exit(f"trl_grpo_toy: {path}: no rows")
    return rows


def load_tokenizer(model_dir):
    from transformers import PreTrainedTokenizerFast

    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg.get(k)}
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model_dir, "tokenizer.json"), **special)
    if tok.pad_token_id is None or tok.eos_token_id is None:
        sys.exit(f"trl_grpo_toy: {model_dir}/tokenizer_config.json names no pad or eos token")
    return tok


def greedy_accuracy(model, tok, rows, response_length, batch=256):
    """Greedy validation accuracy: the share of rows the strict scorer gives 1.0."""
    import torch

    was_training = model.training
    model.eval()
    tok.padding_side = "left"
    correct = 0.0
    with torch.no_grad():
        for s in range(0, len(rows), batch):
            chunk = rows[s : s + batch]
            enc = tok([r["prompt"] for r in chunk], return_tensors="pt", padding=True)
            out = model.generate(**enc, max_new_tokens=response_length, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            correct += sum(gsm8k_strict_score(t, r["ground_truth"]) for t, r in zip(texts, chunk))
    if was_training:
        model.train()
    return correct / len(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF model directory (the SFT base)")
    p.add_argument("--train", default="toy/data/train.jsonl")
    p.add_argument("--val", default="toy/data/val.jsonl")
    p.add_argument("--steps", type=int, default=30, help="baton steps (generation batches)")
    p.add_argument("--val-every", type=int, default=5, help="validate every this many steps (<=0: never)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prompts-per-step", type=int, default=32, help="data.train_batch_size")
    p.add_argument("--n", type=int, default=8, help="actor_rollout_ref.rollout.n")
    p.add_argument("--mini-batch-prompts", type=int, default=16, help="actor.ppo_mini_batch_size")
    p.add_argument("--response-length", type=int, default=10, help="data.max_response_length")
    p.add_argument("--lr", type=float, default=1e-4, help="actor.optim.lr")
    p.add_argument("--loss-type", default="bnpo", help="TRL loss_type (bnpo = verl's token-mean here)")
    args = p.parse_args()
    t_start = time.perf_counter()

    import torch
    torch.set_num_threads(args.threads)
    import transformers
    from transformers import AutoModelForCausalLM, TrainerCallback
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        sys.exit("trl_grpo_toy: TRL is not installed in this Python; run scripts/setup_bench.sh")
    from datasets import Dataset

    for path in (args.model, args.train, args.val):
        if not os.path.exists(path):
            sys.exit(f"trl_grpo_toy: {path} does not exist")
    train_rows = read_rows(args.train)
    val_rows = read_rows(args.val)
    tok = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id

    def gsm8k_reward(prompts, completions, ground_truth, **kwargs):
        return [gsm8k_strict_score(c, g) for c, g in zip(completions, ground_truth)]

    if args.prompts_per_step % args.mini_batch_prompts != 0:
        sys.exit(f"trl_grpo_toy: --mini-batch-prompts {args.mini_batch_prompts} does not divide "
                 f"--prompts-per-step {args.prompts_per_step}")
    samples_per_step = args.prompts_per_step * args.n
    mini_batch_samples = args.mini_batch_prompts * args.n
    updates_per_step = samples_per_step // mini_batch_samples  # 2 for the toy config
    out_dir = tempfile.mkdtemp(prefix="trl_grpo_toy.")
    config = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        seed=args.seed,
        max_steps=args.steps * updates_per_step,
        # One optimizer step per mini-batch of 16 prompts; a generation batch
        # of 32 prompts x 8 feeds two of them (verl's ppo_mini_batch_size 16).
        per_device_train_batch_size=mini_batch_samples,
        gradient_accumulation_steps=1,
        steps_per_generation=updates_per_step,
        num_iterations=1,
        num_generations=args.n,
        max_completion_length=args.response_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=CLIP,
        loss_type=args.loss_type,
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        bf16=False,
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=updates_per_step,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )

    # Per-phase clocks, filled by the trainer subclass and the callback.
    clock = {"gen": 0.0, "score": 0.0}

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                clock["gen"] += time.perf_counter() - t0

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                clock["score"] += time.perf_counter() - t0

    val_accuracy = []
    steps = []  # per baton step: seconds, tokens, gen, score_and_old_log_prob, update_actor

    class StepClock(TrainerCallback):
        def __init__(self):
            self.t_last = None
            self.tokens_last = 0
            self.phase_last = (0.0, 0.0)

        def on_train_begin(self, targs, state, control, **kw):
            self.t_last = time.perf_counter()

        def on_step_end(self, targs, state, control, **kw):
            if state.global_step % updates_per_step != 0:
                return
            now = time.perf_counter()
            step = state.global_step // updates_per_step
            seconds = now - self.t_last
            gen = clock["gen"] - self.phase_last[0]
            score = clock["score"] - self.phase_last[1]
            tokens = state.num_input_tokens_seen - self.tokens_last
            steps.append({"seconds": seconds, "tokens": tokens, "gen": gen,
                          "score_and_old_log_prob": score - gen, "update_actor": seconds - score})
            self.phase_last = (clock["gen"], clock["score"])
            self.tokens_last = state.num_input_tokens_seen
            if args.val_every > 0 and (step % args.val_every == 0 or step == args.steps):
                acc = greedy_accuracy(kw["model"], tok, val_rows, args.response_length)
                val_accuracy.append([step, acc])
                print(f"trl_grpo_toy: step {step}: val accuracy {acc:.3f}", file=sys.stderr)
            print(f"trl_grpo_toy: step {step}: {seconds:.2f} s", file=sys.stderr)
            self.t_last = time.perf_counter()  # validation time is not step time

    # Transformers' Trainer prints its log dicts on stdout; stdout is for the JSON.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    acc0 = greedy_accuracy(model, tok, val_rows, args.response_length)
    val_accuracy.append([0, acc0])
    print(f"trl_grpo_toy: before training: val accuracy {acc0:.3f}", file=sys.stderr)
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=gsm8k_reward,
        args=config,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tok,
        callbacks=[StepClock()],
    )
    trainer.train()
    sys.stdout = real_stdout
    shutil.rmtree(out_dir, ignore_errors=True)  # save_strategy "no": only TRL's empty run dir
    total_seconds = time.perf_counter() - t_start

    timed = steps[1:] if len(steps) > 1 else steps
    train_seconds = sum(s["seconds"] for s in timed)
    to_90 = None
    for step, acc in val_accuracy:
        if acc >= 0.9:
            to_90 = sum(s["seconds"] for s in steps[:step])
            break
    result = {
        "tool": "trl",
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "steps": len(steps),
        "seconds_per_step": train_seconds / len(timed) if timed else None,
        "tokens_per_s": sum(s["tokens"] for s in timed) / train_seconds if train_seconds > 0 else None,
        "phases": {k: sum(s[k] for s in timed) / len(timed)
                   for k in ("gen", "score_and_old_log_prob", "update_actor")} if timed else {},
        "val_accuracy": val_accuracy,
        "seconds_to_90pct": to_90,
        "step_seconds": [s["seconds"] for s in steps],
        "total_seconds": total_seconds,
        "threads": args.threads,
        "settings": {"prompts_per_step": args.prompts_per_step, "n": args.n,
                     "mini_batch_prompts": args.mini_batch_prompts,
                     "response_length": args.response_length, "lr": args.lr, "clip": CLIP, "loss_type": args.loss_type, "beta": 0.0,
                     "model": os.path.abspath(args.model)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
