#!/usr/bin/env python3
"""Checks that a model directory loads in HF transformers and reproduces a
reference.

    python3 scripts/hf_check.py --model DIR --reference REF.safetensors [--value]
    python3 scripts/hf_check.py --list FILE     (lines "DIR REF.safetensors [value]")

Loads DIR with AutoModelForCausalLM (AutoModelForTokenClassification with
--value), float32, eager attention, on the CPU; runs the reference's inputs and
compares its `logits` (`values` with --value) with the reference's, at the
positions where attention_mask is 1 (outputs at left-padded positions depend on
the attention kernel and are not compared). If the reference also holds
`logits_row0_nomask` / `values_row0_nomask`, row 0 is also run alone without a
mask and compared.

Reference keys (safetensors): input_ids [B,T] int64 (required);
attention_mask [B,T] int64 (optional, default all ones); position_ids [B,T]
int64 (optional, default verl's clip(cumsum(mask)-1, 0)); logits [B,T,V] or
values [B,T,1] float.

Prints one JSON line per check (--list: every line of FILE, in one process, so
that torch and transformers are imported once). Exit status: 0 every check
matches, 1 a mismatch or load failure, 77 when
torch/transformers cannot be imported (skip). When they cannot be imported by
this interpreter, the script first re-executes itself with $BATON_PYTHON or
/opt/baton-venv/bin/python (scripts/setup_python.sh) when that exists.
"""
import argparse
import json
import os
import sys

SKIP = 77


def _reexec_or_skip(err):
    cand = os.environ.get("BATON_PYTHON") or "/opt/baton-venv/bin/python"
    if (not os.environ.get("BATON_HF_CHECK_REEXEC") and os.path.isfile(cand) and os.access(cand, os.X_OK)
            and os.path.abspath(cand) != os.path.abspath(sys.executable)):
        os.environ["BATON_HF_CHECK_REEXEC"] = "1"
        os.execv(cand, [cand, os.path.abspath(__file__)] + sys.argv[1:])
    print(json.dumps({"status": "skip", "reason": f"cannot import torch/transformers: {err}"}))
    sys.exit(SKIP)


try:
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
except Exception as e:  # ImportError, or a broken install raising something else
    _reexec_or_skip(e)


def check(model_dir, reference, value, atol):
    """One model against its reference: (ok, the result's fields)."""
    result = {"model": model_dir, "reference": reference, "kind": "value" if value else "causal_lm",
              "transformers": transformers.__version__, "torch": torch.__version__, "atol": atol}

    def finish(ok, **kw):
        result.update(kw)
        result["status"] = "match" if ok else ("error" if "error" in result else "mismatch")
        return ok, result

    try:
        ref = load_file(reference)
    except Exception as e:
        return finish(False, error=f"cannot read reference: {e}")

    key = "values" if value else "logits"
    if "input_ids" not in ref or key not in ref:
        return finish(False, error=f"reference lacks input_ids or {key}; has {sorted(ref)}")
    input_ids = ref["input_ids"].long()
    mask = ref.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask.long()
    pos = ref.get("position_ids")
    pos = torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0) if pos is None else pos.long()

    cls = AutoModelForTokenClassification if value else AutoModelForCausalLM
    try:
        model = cls.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    except Exception as e:
        return finish(False, error=f"cannot load model: {type(e).__name__}: {e}")
    model.eval()
    result["model_class"] = type(model).__name__

    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=False).logits.float()
        want = ref[key].float()
        if tuple(out.shape) != tuple(want.shape):
            return finish(False, error=f"shape {list(out.shape)} != reference {list(want.shape)}")
        valid = mask.bool()
        diff = (out - want).abs()
        max_valid = diff[valid].max().item() if valid.any() else 0.0
        result["max_abs_diff"] = max_valid
        result["max_abs_diff_all_positions"] = diff.max().item()
        ok = max_valid <= atol  # NaN compares false: a NaN is a mismatch

        nomask_key = f"{key}_row0_nomask"
        if nomask_key in ref:
            o0 = model(input_ids=input_ids[0:1], use_cache=False).logits.float()
            w0 = ref[nomask_key].float()
            if tuple(o0.shape) != tuple(w0.shape):
                return finish(False, error=f"{nomask_key}: shape {list(o0.shape)} != reference {list(w0.shape)}")
            d0 = (o0 - w0).abs().max().item()
            result["max_abs_diff_row0_nomask"] = d0
            ok = ok and d0 <= atol
    return finish(ok)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="HF model directory (config.json + safetensors)")
    ap.add_argument("--reference", help="reference .safetensors")
    ap.add_argument("--value", action="store_true", help="value model: AutoModelForTokenClassification, compare `values`")
    ap.add_argument("--list", help='a file of checks, one per line: "DIR REF.safetensors [value]"')
    ap.add_argument("--atol", type=float, default=1e-4)
    args = ap.parse_args()
    if args.list:
        checks = []
        with open(args.list) as f:
            for line in f:
                cells = line.split()
                if cells:
                    checks.append((cells[0], cells[1], len(cells) > 2 and cells[2] == "value"))
    elif args.model and args.reference:
        checks = [(args.model, args.reference, args.value)]
    else:
        ap.error("give --model and --reference, or --list")
    all_ok = True
    for model_dir, reference, value in checks:
        ok, result = check(model_dir, reference, value, args.atol)
        print(json.dumps(result), flush=True)
        all_ok = all_ok and ok
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
