#!/usr/bin/env python3
"""The GRPO toy runs of configs/grpo_toy.yaml (and grpo_add3.yaml,
grpo_tool_toy.yaml) with HF TRL's GRPOTrainer, on CPU.

    /opt/baton-venv/bin/python bench/trl_grpo_toy.py --model toy/sft/model \
        [--train toy/data/train.jsonl] [--val toy/data/val.jsonl] [--steps 30] \
        [--val-every 5] [--threads 2] [--seed 1] [--prompts-per-step 32] [--n 8] \
        [--mini-batch-prompts 16] [--response-length 10] [--lr 1e-4] \
        [--tools calculator [--max-assistant-turns 2]] [--val-limit K]

The defaults are configs/grpo_toy.yaml's; bench/e2e_bench.py passes the values
of whichever config it runs baton with (for the tool task, configs/grpo_tool_toy.yaml:
--tools calculator --max-assistant-turns 2 --prompts-per-step 16
--mini-batch-prompts 16 --response-length 80).

Needs TRL in the venv (scripts/setup_bench.sh installs the pinned version).
Prints one JSON object on stdout (everything else goes to stderr):
  {"tool": "trl", "trl_version", "torch_version", "transformers_version",
   "steps", "seconds_per_step", "tokens_per_s", "phases", "val_accuracy",
   "seconds_to_90pct", "step_seconds", "reward_mean", "total_seconds",
   "threads", "settings"}
and with --tools also "tool_calls_per_sample" (per step), "tool_failures"
(per step) and "val_tool_call_rate" ([[step, share of val problems whose
greedy answer called the tool]]).

A "step" here is baton's (verl's) step: one generation batch of 32 prompts x
8 samples, then the PPO update over it. TRL counts optimizer steps, so one
baton step is two TRL steps (see the mapping below; one for the tool task,
whose 16 prompts are one mini-batch: there neither side computes old
log-probs, the update being on-policy); --steps and the steps in
val_accuracy are in baton's unit.

What matches configs/grpo_toy.yaml (+ ppo_trainer.yaml defaults):
  - the model directory, the tokenizer files (read with PreTrainedTokenizerFast
    from tokenizer.json: AutoTokenizer maps this directory to Qwen2Tokenizer,
    which decodes "#### 50" as "####50"), plain-string prompts, no chat template;
  - the reward: verl's GSM8K strict scorer as baton's workers/rewards/gsm8k_reward.cpp
    implements it (last 300 code points, the last "#### (-?[0-9.,]+)", commas
    and "$" removed, string-equal to the ground truth: 1.0, else 0.0), on the
    completion's tokens decoded with special tokens skipped (baton's reward
    manager decodes the response so; for the tool task the completion is the
    whole trajectory: the call, the tool turn and the answer);
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
  - no activation recompute in the update (baton's
    model.enable_gradient_checkpointing false; --gradient-checkpointing, which
    e2e_bench.py sets from the config). TRL's GRPOConfig turns
    gradient_checkpointing on by default, and the runs of this script before
    2026-11-29 had it on (on the tool task it takes TRL's update from 0.85 to
    1.24 s a step);
  - validation: greedy (temperature 0), 10 new tokens (--response-length),
    on every val prompt, before training, every --val-every steps and after
    the last one.

The tool task (--tools calculator; configs/grpo_tool_toy.yaml: 3-digit
multiplication in chat form, examples/toy_task.cpp --tool-share): TRL's own
tool-calling GRPO (GRPOTrainer(tools=[calculator])) against baton's multi-turn
rollout (actor_rollout_ref.rollout.multi_turn, format hermes):
  - prompts are the rows' chat messages, rendered by the model's chat
    template (tokenizer_config.json) with the generation prompt, as baton
    renders them; the template ignores `tools`, so neither side shows the
    model a tool schema (it learned the call in SFT);
  - the tool: calculator(expression) below, baton's built-in calculator's
    language (workers/tools/calculator_tool.h: exact fractions, + - * / ^,
    parentheses; "56088", "-1/2"); TRL builds its schema from the docstring;
  - the call's parsing: the model writes Qwen's Hermes form
    (<tool_call>\n{"name": "calculator", "arguments": {...}}\n</tool_call>
    then <|im_end|>). TRL parses a completion with the tokenizer's
    `response_template` and sets one itself only for chat templates it knows
    (add_response_schema), which this custom template is not; this script
    sets trl.chat_template_utils.qwen3_template, the definition TRL uses for
    Qwen2.5's and Qwen3's Hermes templates (transformers >= 5.13 parsing);
  - TRL also requires the template to render an assistant message's
    tool_calls (supports_tool_calling); the toy template renders only
    `content` (baton never re-renders the model's own turns), so TRL gets the
    same template with a Qwen2.5-style tool_calls branch added for assistant
    messages (tool_chat_template); every other message renders as before,
    and a self-check at start asserts that a whole call-result-answer
    conversation renders exactly as toy_task's SFT rows write it;
  - the tool turn's tokens: both sides append the template's text after the
    assistant's <|im_end|> ("\n<|im_start|>user\n<tool_response>\n203840\n
    </tool_response><|im_end|>\n<|im_start|>assistant\n"), never re-tokenizing
    what the model generated; checked at start against TRL's
    _get_tool_suffix_ids; those tokens are masked out of the loss on both;
  - --max-assistant-turns (baton's multi_turn.max_assistant_turns, 2): TRL's
    max_tool_calling_iterations = turns - 1: a call, its result, the answer;
    a call in the last turn is not run (the trajectory ends there, as baton's);
  - --response-length (80) bounds the whole trajectory (calls, tool turns and
    answer) on both sides; TRL drops a tool result that would not fit and
    ends the trajectory there;
  - validation runs the tool too, so both sides' val accuracy means the same
    (the share of val problems answered right within the same turns and
    tokens): greedy generation; a turn whose text parses to a call (TRL's own
    parse_response) runs the calculator as TRL's loop does, appends TRL's own
    tool-turn tokens (_get_tool_suffix_ids) and generates again greedily with
    the rest of the response budget; then the strict scorer on the whole
    trajectory. This is this script's loop (batched HF generate), not TRL's.

What differs, and why:
  - processes/threads: baton runs 2 worker processes (data parallel, one CPU
    slot each); TRL runs 1 process with --threads torch threads (2 by default),
    the same two cores. TRL's multi-process CPU DDP is not what a CPU user of
    TRL runs.
  - generation: TRL uses transformers' generate (dynamic KV cache, SDPA); baton
    uses its own rollout engine. That is a difference the comparison measures.
    With tools TRL generates in rounds: the whole batch's first turns, then
    one more generate over the trajectories that called the tool; baton's
    engine resumes each trajectory on its own as its tool result arrives.
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
  - tools: a failed call's text differs (TRL shows {'error': '...'}, baton its
    own message); TRL runs every call of a turn, baton at most
    multi_turn.max_parallel_calls (1) and answers the rest with an error (the
    model writes one call per turn); TRL does not cut a tool result to
    max_tool_response_length (the calculator's are short).
  - the tool task's tokenizer.json splits characters with the regex "(?s).",
    which baton's tokenizer reads but the Rust `tokenizers` library (Oniguruma,
    Ruby syntax) refuses ("undefined group option"); load_tokenizer reads it
    with "[\s\S]", the same split (every character, newline included, its own
    piece).

Timing: a step's time is the wall time between the ends of consecutive baton
steps (TRL's on_step_end of every second optimizer step), minus the time of
the validation run inside it; the first starts at TRL's on_train_begin.
seconds_per_step is the mean without the first step (warm-up);
tokens_per_s is (prompt + response tokens, padding excluded, as verl's
perf/total_num_tokens counts them: with tools the tool turns' tokens too) /
step seconds, over the same steps;
seconds_to_90pct is the sum of step times up to the first validation with
accuracy >= 0.9 (null if none); total_seconds is the whole run, model load and
validations included. phases: gen (TRL's _generate: HF generate, and with
tools the tool loop: parsing, the calls and the post-tool generate),
score_and_old_log_prob (the rest of TRL's _generate_and_score_completions:
decode, reward, advantages, old log-probs), update_actor (the remainder of the
step: both optimizer steps), means over the same steps. reward_mean: each
step's mean training reward (baton's critic/score/mean); tool_calls_per_sample:
the calls TRL ran per trajectory in each step (TRL's tools/call_frequency,
baton's multi_turn/tool_calls/mean).
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from fractions import Fraction

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
    """The model's tokenizer.json as a PreTrainedTokenizerFast, with the special
    tokens and chat template (if any) of its tokenizer_config.json."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        spec = json.load(f)
    # toy_task's chat tokenizer splits every character with "(?s).", which the
    # Rust tokenizers library (Oniguruma, Ruby syntax) refuses; "[\s\S]" is the
    # same split.
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "Split" and (pre.get("pattern") or {}).get("Regex") == "(?s).":
        pre["pattern"]["Regex"] = r"[\s\S]"
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if cfg.get(k)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), **special)
    if cfg.get("chat_template"):
        tok.chat_template = cfg["chat_template"]
    if tok.pad_token_id is None or tok.eos_token_id is None:
        sys.exit(f"trl_grpo_toy: {model_dir}/tokenizer_config.json names no pad or eos token")
    return tok


# ---------------------------------------------------------------- the tool

_CALC_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")
_CALC_LIMIT = 2**63 - 1


def _calc_eval(expression):
    """The exact value of `expression` in baton's calculator language
    (workers/tools/calculator_tool.h): integers and decimals, + - * /, unary
    - and +, ^ (an integer exponent, right-associative, tighter than unary
    minus), parentheses; values that leave 64-bit fractions are an overflow."""
    if len(expression) > 1000:
        raise ValueError("the expression is longer than 1000 characters")
    tokens = []
    for m in _CALC_TOKEN.finditer(expression):
        if m.group(1) is not None:
            tokens.append(Fraction(m.group(1)))
        elif m.group(2) is not None:
            if m.group(2) not in "+-*/^()":
                raise ValueError(f"unexpected character {m.group(2)!r}")
            tokens.append(m.group(2))
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def check(v):
        if abs(v.numerator) > _CALC_LIMIT or v.denominator > _CALC_LIMIT:
            raise ValueError("overflow")
        return v

    def expr(depth):
        v = term(depth)
        while peek() in ("+", "-"):
            v = check(v + term(depth) if take() == "+" else v - term(depth))
        return v

    def term(depth):
        v = unary(depth)
        while peek() in ("*", "/"):
            op = take()
            w = unary(depth)
            if op == "/" and w == 0:
                raise ValueError("division by zero")
            v = check(v * w if op == "*" else v / w)
        return v

    def unary(depth):
        if depth > 100:
            raise ValueError("nested too deeply")
        if peek() in ("+", "-"):
            return check(-unary(depth + 1) if take() == "-" else unary(depth + 1))
        return power(depth)

    def power(depth):
        base = atom(depth)
        if peek() != "^":
            return base
        take()
        exp = unary(depth + 1)
        if exp.denominator != 1:
            raise ValueError("the exponent is not an integer")
        if base == 0 and exp < 0:
            raise ValueError("division by zero")
        if abs(exp) > 64 and abs(base) != 1 and base != 0:
            raise ValueError("overflow")
        return check(base ** int(exp))

    def atom(depth):
        t = peek()
        if isinstance(t, Fraction):
            return take()
        if t == "(":
            take()
            v = expr(depth + 1)
            if peek() != ")":
                raise ValueError("a ')' is missing")
            take()
            return v
        raise ValueError("an operand is missing" if t is None or t in "+-*/^)" else f"unexpected {t!r}")

    value = expr(0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return value


def calculator(expression: str) -> str:
    """Exact arithmetic on integers and fractions (+ - * / ^ and parentheses).

    Args:
        expression: The expression, e.g. 123*456

    Returns:
        The exact value: an integer ("56088") or a reduced fraction ("-1/2").
    """
    v = _calc_eval(expression)
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


TOOLS = {"calculator": calculator}

# The toy template renders a message as <|im_start|>role\ncontent<|im_end|>\n;
# this branch, before that one, renders an assistant message's tool_calls as
# Qwen2.5's template does (Hermes: a <tool_call> block of JSON per call).
_TEMPLATE_ANCHOR = "{% else %}{{ '<|im_start|>' + m.role"
_TOOL_CALLS_BRANCH = (
    "{% elif m.role == 'assistant' and m.tool_calls %}"
    "{{ '<|im_start|>assistant' }}{% if m.content %}{{ '\\n' + m.content }}{% endif %}"
    "{% for tc in m.tool_calls %}{% set f = tc.function if tc.function is defined else tc %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}"
)


def tool_chat_template(template):
    """The toy chat template with assistant tool_calls rendered (TRL's
    supports_tool_calling requires it; see the header)."""
    if template is None or template.count(_TEMPLATE_ANCHOR) != 1:
        sys.exit("trl_grpo_toy: --tools needs the chat template examples/toy_task.cpp writes "
                 "(tokenizer_config.json's chat_template); this one is not it")
    return template.replace(_TEMPLATE_ANCHOR, _TOOL_CALLS_BRANCH + _TEMPLATE_ANCHOR)


def check_tool_rendering(tok, suffix_ids):
    """Assert that TRL renders the tool task as toy_task's SFT rows and baton's
    rollout do: a call, the tool turn, the next assistant prefix; and that the
    tokens TRL appends after the model's <|im_end|> are baton's."""
    call = '{"name": "calculator", "arguments": {"expression": "637*320"}}'
    conversation = [
        {"role": "user", "content": "637*320"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                          "arguments": {"expression": "637*320"}}}]},
        {"role": "tool", "name": "calculator", "content": "203840"},
    ]
    want = ("<|im_start|>user\n637*320<|im_end|>\n<|im_start|>assistant\n"
            f"<tool_call>\n{call}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n203840\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")
    got = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    if got != want:
        sys.exit(f"trl_grpo_toy: the chat template renders a tool call as {got!r}, not as "
                 f"toy_task's SFT rows ({want!r})")
    baton_suffix = tok("\n<|im_start|>user\n<tool_response>\n203840\n</tool_response><|im_end|>\n"
                       "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    trl_suffix = suffix_ids([{"role": "tool", "name": "calculator", "content": "203840"}])
    if list(trl_suffix) != baton_suffix:
        sys.exit(f"trl_grpo_toy: TRL's tool-turn tokens {trl_suffix} are not baton's {baton_suffix}")


def run_tool_calls(tool_calls):
    """The tool messages for one turn's parsed calls, as TRL's _tool_call_loop
    makes them (a failure's content is {'error': ...})."""
    messages = []
    for call in tool_calls:
        function = call.get("function", call)
        name = function.get("name", "unknown")
        try:
            if call.get("type", "function") != "function":
                raise ValueError(f"Unsupported tool call type: {call['type']}")
            if name not in TOOLS:
                raise ValueError(f"Tool {name} not found.")
            content = str(TOOLS[name](**function["arguments"]))
        except Exception as e:
            content = str({"error": str(e)})
        messages.append({"role": "tool", "name": name, "content": content})
    return messages


# ---------------------------------------------------------------- validation

def prompt_ids_of(tok, prompt):
    if isinstance(prompt, str):
        return tok(prompt)["input_ids"]
    return tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)


def greedy_turn(model, tok, seqs, budgets):
    """One greedy assistant turn for each token list in seqs (left-padded into
    one batch): its tokens up to and including eos, at most budgets[i]."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(budgets),
                         do_sample=False, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    turns = []
    for row, budget in zip(out[:, width:].tolist(), budgets):
        row = row[:budget]
        if tok.eos_token_id in row:
            row = row[: row.index(tok.eos_token_id) + 1]
        turns.append(row)
    return turns


def greedy_accuracy(model, tok, rows, response_length, tools=None, batch=256):
    """Greedy validation: (accuracy, tool-call rate) on rows.

    Without tools: one greedy turn of at most response_length tokens per row,
    scored by the strict scorer. With tools (a dict with "max_calls",
    "suffix_ids" and "max_positions"): after each turn but the last allowed,
    a turn that parses to a call (TRL's parse_response) runs it (run_tool_calls),
    TRL's tool-turn tokens are appended (unless they would not fit the response
    budget or the model's positions: then the trajectory ends, as in TRL's
    loop), and the next turn is generated greedily with the rest of the
    budget; the score is the strict scorer on the whole trajectory decoded
    with special tokens skipped. The rate is the share of rows whose
    trajectory ran at least one call."""
    import torch

    if tools is not None:
        from trl.chat_template_utils import parse_response

    was_training = model.training
    model.eval()
    correct = 0.0
    called = 0
    with torch.no_grad():
        for s in range(0, len(rows), batch):
            chunk = rows[s : s + batch]
            prompts = [prompt_ids_of(tok, r["prompt"]) for r in chunk]
            completions = [[] for _ in chunk]
            active = list(range(len(chunk)))
            calls_done = 0
            ran_tool = [False] * len(chunk)
            while active:
                turns = greedy_turn(model, tok, [prompts[i] + completions[i] for i in active],
                                    [response_length - len(completions[i]) for i in active])
                next_active = []
                for i, turn in zip(active, turns):
                    context = prompts[i] + completions[i]
                    completions[i] = completions[i] + turn
                    if tools is None or calls_done >= tools["max_calls"] or not turn:
                        continue
                    parsed = parse_response(tok, turn, prefix=context, tools=[calculator])
                    if not parsed.get("tool_calls"):
                        continue
                    suffix = list(tools["suffix_ids"](run_tool_calls(parsed["tool_calls"])))
                    if (len(completions[i]) + len(suffix) > response_length
                            or len(prompts[i]) + len(completions[i]) + len(suffix) >= tools["max_positions"]):
                        continue  # TRL drops a result that does not fit, and ends there
                    ran_tool[i] = True
                    completions[i] = completions[i] + suffix
                    if len(completions[i]) < response_length:
                        next_active.append(i)
                active = next_active
                calls_done += 1
            texts = tok.batch_decode(completions, skip_special_tokens=True)
            correct += sum(gsm8k_strict_score(t, r["ground_truth"]) for t, r in zip(texts, chunk))
            called += sum(ran_tool)
    if was_training:
        model.train()
    return correct / len(rows), called / len(rows)


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
    p.add_argument("--tools", default=None, choices=sorted(TOOLS),
                   help="train with TRL's tool calling and this tool (baton's multi_turn.enable "
                        "with configs/tools/calculator.yaml); the prompts must be chat messages")
    p.add_argument("--max-assistant-turns", type=int, default=2,
                   help="with --tools: multi_turn.max_assistant_turns (<=0: no limit but the "
                        "response length); TRL's max_tool_calling_iterations is one less")
    p.add_argument("--gradient-checkpointing", choices=("on", "off"), default="off",
                   help="activation recompute in the update (model.enable_gradient_checkpointing; "
                        "TRL's own default is on)")
    p.add_argument("--val-limit", type=int, default=None,
                   help="validate on the first K val rows only (short trial runs)")
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
    if args.val_limit is not None:
        val_rows = val_rows[: args.val_limit]
    tok = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    max_calls = None  # TRL's max_tool_calling_iterations (None: no limit)
    if args.tools:
        from trl.chat_template_utils import qwen3_template

        if isinstance(train_rows[0]["prompt"], str):
            sys.exit("trl_grpo_toy: --tools needs chat prompts (lists of messages), as toy_task "
                     "--tool-share writes them")
        # The call's parsing: Qwen2.5's / Qwen3's Hermes response template (see the header).
        tok.chat_template = tool_chat_template(tok.chat_template)
        tok.response_template = qwen3_template
        if args.max_assistant_turns > 0:
            max_calls = args.max_assistant_turns - 1

    # Training rewards and token counts, per step (read by StepClock).
    clock = {"gen": 0.0, "score": 0.0, "tokens": 0, "reward_sum": 0.0, "rewarded": 0,
             "tool_calls": 0, "tool_failures": 0, "trajectories": 0}

    def gsm8k_reward(prompts, completions, ground_truth, completion_ids, **kwargs):
        # The whole completion (with tools: the call, the tool turn and the
        # answer), decoded as baton's reward manager decodes a response.
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        scores = [gsm8k_strict_score(t, g) for t, g in zip(texts, ground_truth)]
        clock["reward_sum"] += sum(scores)
        clock["rewarded"] += len(scores)
        return scores

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
        max_tool_calling_iterations=max_calls,
        gradient_checkpointing=args.gradient_checkpointing == "on",
    )

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter()
            try:
                out = super()._generate(prompts)
            finally:
                clock["gen"] += time.perf_counter() - t0
            if self.model.training:
                # prompt + completion tokens, padding excluded; with tools the
                # tool turns' tokens too (verl's perf/total_num_tokens).
                prompt_ids, completion_ids = out[0], out[1]
                clock["tokens"] += sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids))
                clock["trajectories"] += len(completion_ids)
            return out

        def _tool_call_loop(self, *a, **kw):
            out = super()._tool_call_loop(*a, **kw)
            if self.model.training:
                clock["tool_calls"] += out[4]  # what TRL logs as tools/call_frequency x samples
                clock["tool_failures"] += out[5]
            return out

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                clock["score"] += time.perf_counter() - t0

    val_accuracy = []
    val_tool_call_rate = []
    # per baton step: seconds, tokens, gen, score_and_old_log_prob, update_actor,
    # reward_mean, tool_calls_per_sample, tool_failures
    steps = []

    class StepClock(TrainerCallback):
        def __init__(self):
            self.t_last = None
            self.last = dict(clock)

        def on_train_begin(self, targs, state, control, **kw):
            self.t_last = time.perf_counter()
            self.last = dict(clock)

        def on_step_end(self, targs, state, control, **kw):
            if state.global_step % updates_per_step != 0:
                return
            now = time.perf_counter()
            step = state.global_step // updates_per_step
            seconds = now - self.t_last
            d = {k: clock[k] - self.last[k] for k in clock}
            self.last = dict(clock)
            row = {"seconds": seconds, "tokens": d["tokens"], "gen": d["gen"],
                   "score_and_old_log_prob": d["score"] - d["gen"],
                   "update_actor": seconds - d["score"],
                   "reward_mean": d["reward_sum"] / d["rewarded"] if d["rewarded"] else None}
            if args.tools:
                row["tool_calls_per_sample"] = (d["tool_calls"] / d["trajectories"]
                                                if d["trajectories"] else None)
                row["tool_failures"] = d["tool_failures"]
            steps.append(row)
            if args.val_every > 0 and (step % args.val_every == 0 or step == args.steps):
                validate(kw["model"], step)
            extra = (f", {row['tool_calls_per_sample']} tool calls per sample"
                     if args.tools else "")
            print(f"trl_grpo_toy: step {step}: {seconds:.2f} s, reward {row['reward_mean']}{extra}",
                  file=sys.stderr)
            self.t_last = time.perf_counter()  # validation time is not step time

    # Transformers' Trainer prints its log dicts on stdout; stdout is for the JSON.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=gsm8k_reward,
        args=config,
        train_dataset=Dataset.from_list(train_rows),
        processing_class=tok,
        callbacks=[StepClock()],
        tools=[TOOLS[args.tools]] if args.tools else None,
    )
    val_tools = None
    if args.tools:
        check_tool_rendering(tok, trainer._get_tool_suffix_ids)
        val_tools = {"max_calls": sys.maxsize if max_calls is None else max_calls,
                     "suffix_ids": trainer._get_tool_suffix_ids,
                     "max_positions": model.config.max_position_embeddings}

    def validate(m, step):
        acc, rate = greedy_accuracy(m, tok, val_rows, args.response_length, val_tools)
        val_accuracy.append([step, acc])
        line = f"trl_grpo_toy: step {step}: val accuracy {acc:.3f}"
        if args.tools:
            val_tool_call_rate.append([step, rate])
            line += f", tool called on {rate:.3f} of the val problems"
        print(line, file=sys.stderr)

    validate(model, 0)
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
        "reward_mean": [s["reward_mean"] for s in steps],
        "total_seconds": total_seconds,
        "threads": args.threads,
        "settings": {"prompts_per_step": args.prompts_per_step, "n": args.n,
                     "mini_batch_prompts": args.mini_batch_prompts,
                     "response_length": args.response_length, "lr": args.lr, "clip": CLIP, "loss_type": args.loss_type, "beta": 0.0,
                     "model": os.path.abspath(args.model), "val_rows": len(val_rows),
                     "tools": args.tools, "gradient_checkpointing": args.gradient_checkpointing,
                     "max_tool_calling_iterations": max_calls if args.tools else None},
    }
    if args.tools:
        result["tool_calls_per_sample"] = [s["tool_calls_per_sample"] for s in steps]
        result["tool_failures"] = [s["tool_failures"] for s in steps]
        result["val_tool_call_rate"] = val_tool_call_rate
    print(json.dumps(result))


if __name__ == "__main__":
    main()
