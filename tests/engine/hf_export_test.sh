#!/usr/bin/env bash
# HF transformers loads what baton exports: each fixture goes HF → baton
# sharded (TP2 × PP2, an uneven split of four layers) → HF with baton-convert, and
# scripts/hf_check.py loads the result with transformers and compares its
# logits (or values) with the fixture's reference (atol 1e-4).
# Exit 77 (skipped) only when torch/transformers cannot be imported.
set -euo pipefail
convert="$1"
fixtures="$2"
repo="$3"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# Exports every fixture, then checks them all in one Python process (torch and
# transformers imported once).
export_one() {
  local name="$1" ref="$2" kind="${3:-causal}"
  local layers
  layers="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' \
    "$fixtures/$name/config.json")"
  local split="3,1"
  [[ "$layers" == 4 ]] || split="$((layers - 1)),1"
  "$convert" --to-sharded --hf "$fixtures/$name" --out "$scratch/$name-sharded" --tp 2 --pp 2 \
    --layer-split "$split" >/dev/null
  "$convert" --to-hf --sharded "$scratch/$name-sharded" --out "$scratch/$name-hf" >/dev/null
  echo "$scratch/$name-hf $ref $kind" >>"$scratch/checks"
}

export_one tiny-llama "$fixtures/tiny-llama/reference.safetensors"
export_one tiny-qwen2 "$fixtures/tiny-qwen2/reference.safetensors"
export_one tiny-qwen2-value "$fixtures/tiny-qwen2-value/reference.safetensors" value
# A vocabulary (97) no TP size divides: the shards are padded, the export is not.
export_one tiny-llama-v97 "$fixtures/tiny-llama-v97/reference.safetensors"
# The families and RoPE types of make_family_fixtures.py: Qwen3's q/k norms
# and decoupled head_dim, the scaled RoPEs' rope_parameters, Mistral's window.
for name in tiny-qwen3 tiny-qwen3-moe tiny-llama3-rope tiny-llama-yarn tiny-llama-linear tiny-llama-dynamic \
  tiny-mistral; do
  export_one "$name" "$fixtures/$name/reference.safetensors"
done
status=0
python3 "$repo/scripts/hf_check.py" --list "$scratch/checks" || status=$?
if [[ $status -eq 77 ]]; then exit 77; fi
if [[ $status -ne 0 ]]; then echo "hf_check failed (the lines above say which)" >&2; exit 1; fi
echo "hf_export: $(grep -c . "$scratch/checks") exports load in transformers and match their references"
