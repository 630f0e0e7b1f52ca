#!/usr/bin/env python3
"""HF PEFT's side of baton's PEFT adapter tests (tests/engine/peft_adapter_test.cpp).

    peft_check.py logits --base DIR --adapter ADAPTER --reference REF --out OUT
    peft_check.py make --base DIR --adapter ADAPTER --reference REF --out OUT
                       --rank R --alpha A --targets q_proj,v_proj,... [--seed S]

`logits` loads the HF model DIR (float32, eager attention, CPU), puts the PEFT
adapter ADAPTER on it with PeftModel.from_pretrained, and writes its logits
of REF's rows (input_ids, attention_mask, position_ids) to OUT as `logits`.
`make` first makes an adapter with peft itself (LoraConfig r, lora_alpha,
target_modules; lora_A and lora_B both drawn from normal(0, 0.1) with `seed`,
so that B is not zero) and saves it to ADAPTER with save_pretrained.

Prints one JSON line. Exit status: 0 done, 1 failure, 77 when torch,
transformers or peft cannot be imported (skip); when this interpreter cannot
import them it first re-executes itself with $BATON_PYTHON or
/opt/baton-venv/bin/python when that exists.
"""
import argparse
import json
import os
import sys

SKIP = 77


def _reexec_or_skip(err):
    cand = os.environ.get("BATON_PYTHON") or "/opt/baton-venv/bin/python"
    if (not os.environ.get("BATON_PEFT_CHECK_REEXEC") and os.path.isfile(cand) and os.access(cand, os.X_OK)
            and os.path.abspath(cand) != os.path.abspath(sys.executable)):
        os.environ["BATON_PEFT_CHECK_REEXEC"] = "1"
        os.execv(cand, [cand, os.path.abspath(__file__)] + sys.argv[1:])
    print(json.dumps({"status": "skip", "reason": f"cannot import torch/transformers/peft: {err}"}))
    sys.exit(SKIP)


try:
    import peft
    import torch
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
except Exception as e:  # ImportError, or a broken install raising something else
    _reexec_or_skip(e)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["logits", "make"])
    ap.add_argument("--base", required=True, help="HF model directory")
    ap.add_argument("--adapter", required=True, help="PEFT adapter directory (read, or written by make)")
    ap.add_argument("--reference", required=True, help="safetensors with input_ids, attention_mask, position_ids")
    ap.add_argument("--out", required=True, help="safetensors to write `logits` to")
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=8)
    ap.add_argument("--targets", default="all-linear")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    result = {"mode": args.mode, "peft": peft.__version__, "transformers": transformers.__version__,
              "torch": torch.__version__}

    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32, attn_implementation="eager")
    if args.mode == "make":
        targets = args.targets if args.targets == "all-linear" else args.targets.split(",")
        alpha = int(args.alpha) if args.alpha == int(args.alpha) else args.alpha
        config = LoraConfig(r=args.rank, lora_alpha=alpha, target_modules=targets, task_type="CAUSAL_LM")
        model = get_peft_model(base, config)
        gen = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            for name, p in sorted(model.named_parameters()):
                if ".lora_A." in name or ".lora_B." in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        model.save_pretrained(args.adapter)
    else:
        model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()

    ref = load_file(args.reference)
    ids = ref["input_ids"].long()
    mask = ref["attention_mask"].long()
    pos = ref["position_ids"].long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.float()
    save_file({"logits": logits.contiguous()}, args.out)
    result["status"] = "done"
    print(json.dumps(result))


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:
        print(json.dumps({"status": "error", "error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
