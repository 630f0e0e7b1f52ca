// RoleModel: one RL role's model inside a worker process — the engine's
// ParallelState over the worker group (the group's ParallelLayout, its own
// rendezvous tag), this rank's Transformer stage loaded from an HF directory,
// and, for a trained role, its Optimizer. The actor, ref and critic roles each
// hold one; the functions below are what they share: cutting a DataProto into
// micro-batches and reading per-response-token outputs off the last stage.
//
// The RL batch's sequences are `input_ids` [N, P + R] = prompt (left-padded,
// width P) then response (right-padded, width R). Token P + t is response
// token t; it is scored by the logits (and valued by the critic) at position
// P + t - 1.
//
// Example (inside a worker's init_model):
//   RoleModel actor(info(), options.model, "actor", &options.optim);
//   at::Tensor lp = actor.response_log_probs(batch, MicroBatching{8}, /*temperature=*/1.0);
//
// Thread safety: none; the worker's thread drives it.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/data_proto.h"
#include "engine/model/transformer.h"
#include "engine/optim/offload.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "runtime/worker.h"
#include "workers/roles/role_options.h"

namespace baton::workers {

// How a role cuts a batch into micro-batches (make_micro_batches).
struct MicroBatching {
  int64_t rows = 8;  // rows per micro-batch, padded to the batch's width
  // > 0: dynamic batch size (verl's use_dynamic_bsz with
  // *_max_token_len_per_gpu): whole sequences, in batch order, as many as fit
  // in this many real tokens, packed into one row without padding
  // (engine::MicroBatch::packed_lengths). `rows` is then not read.
  int64_t max_tokens = 0;
  // The sequence of every micro-batch padded to a multiple of this (the TP
  // size under sequence parallelism: RoleModel::sequence_multiple()). Padded
  // rows get masked columns on the left, as left-padded prompts; a packed row
  // gets one more sequence of padding tokens at its end. Columns counted from
  // a row's end (padded_width, padded_columns) are the same either way.
  int64_t sequence_multiple = 1;
  // > 0: exactly this many micro-batches (RoleModel::batching_for: the EP
  // ranks of a MoE model run the same number of forwards). Rows are cut as
  // evenly as possible, or the packed groups split further at their largest;
  // a batch of fewer rows than this is an error.
  int64_t count = 0;
};

// How many micro-batches `batching` cuts `batch` into (count ignored).
int64_t natural_micro_batches(const DataProto& batch, const MicroBatching& batching);

// Per-token log-probs and entropy of a micro-batch's response tokens.
struct ResponseScores {
  at::Tensor log_probs;       // [b, R]
  at::Tensor entropy;         // [b, R]; undefined when not asked for
  at::Tensor sum_pi_squared;  // [b, R] Σ_v π(v)²; undefined when not asked for
};

class RoleModel {
 public:
  // Collective over the worker group: every rank builds its ParallelState
  // (rendezvous keys under `tag`) and loads its shard of options.path. The
  // group's layout must have tp and pp as `options` says (baton::Error naming
  // both otherwise). `optim` null: a frozen model (no optimizer, no
  // gradients). A value model built from a causal-LM checkpoint keeps a fresh
  // value head (seeded by options.seed) and logs a notice. With
  // options.lora_adapter_path its adapters start from that PEFT adapter
  // (engine::copy_peft_adapter; EngineError when it does not fit). `share`: reuse
  // another role's ParallelState of the same layout instead (e.g. the ref
  // model beside the actor); then nothing is collective.
  RoleModel(const WorkerInfo& info, const ModelOptions& options, const std::string& tag,
            const OptimOptions* optim, std::shared_ptr<engine::ParallelState> share = nullptr);

  engine::Transformer& model() { return *model_; }
  std::shared_ptr<engine::Transformer> model_ptr() const { return model_; }
  engine::ParallelState& state() { return *state_; }
  std::shared_ptr<engine::ParallelState> state_ptr() const { return state_; }
  // REQUIRES: built with an optimizer (baton::Error otherwise).
  engine::Optimizer& optimizer();
  bool trainable() const { return optimizer_ != nullptr; }
  // What this model's forwards need the sequence to divide by: tp under
  // sequence parallelism, else 1 (MicroBatching::sequence_multiple). The
  // role's own forwards (response_log_probs, response_values) pad to it.
  int64_t sequence_multiple() const;
  // `batching` for this model's forwards over `batch`: the sequence padded
  // to sequence_multiple(), and under expert parallelism the micro-batch
  // count agreed over the EP group (the largest of its ranks': an
  // all-to-all in every sparse layer needs every EP rank's forward). Under
  // EP collective over the EP group.
  MicroBatching batching_for(const DataProto& batch, MicroBatching batching) const;
  const ModelOptions& options() const { return options_; }
  // The HF config.json of the model it was loaded from (kept for export).
  const std::string& hf_config_text() const { return hf_config_text_; }

  // Per-token outputs of the responses, [N, R] fp32, computed forward-only in
  // micro-batches cut as `batching` says. On the last stage: log-probs of the
  // response tokens under logits / temperature (and their entropy when
  // `entropy` is non-null, Σ_v π(v)² of each position's distribution when
  // `sum_pi_squared` is: this needs the logits, so a fused LM head throws
  // baton::Error). Elsewhere: undefined tensors.
  at::Tensor response_log_probs(const DataProto& batch, const MicroBatching& batching,
                                double temperature, at::Tensor* entropy = nullptr,
                                at::Tensor* sum_pi_squared = nullptr);
  // Per-token log-probs (and entropy, `with_entropy`) of a micro-batch's
  // response tokens from the last stage's output `out`: the logits shard, or
  // with ModelOptions::fused_lm_head the LM head's input, the head then
  // applied in token chunks to the response positions only (the logits
  // never exist whole). Collective over TP.
  // `with_sum_pi_squared` needs the logits: with the fused head it throws.
  ResponseScores scores(const at::Tensor& out, const engine::MicroBatch& mb, int64_t response_width,
                        double temperature, bool with_entropy = true,
                        bool with_sum_pi_squared = false);
  // The value model's values for the response tokens, [N, R] fp32 on the
  // last stage (undefined elsewhere): at the position before each token
  // (P + t - 1, the critic's V(s_t)) or, `at_tokens`, at the token itself
  // (P + t, where a reward model scores the sequence so far).
  at::Tensor response_values(const DataProto& batch, const MicroBatching& batching,
                             bool at_tokens = false);

  // Whether this rank's results are the ones a MEGATRON_COMPUTE* collect
  // keeps (tp 0, cp 0, the last stage).
  bool is_collector() const;

  // Offload (ModelOptions::offload, engine/optim/offload.h). A phase of the role
  // calls resident() first — the parameters come back, and for `training`
  // (an update, a checkpoint) the gradients and optimizer state too — and
  // idle() last: what the options name leaves the device. Without offload
  // options both do nothing. OffloadPhase below pairs them.
  void resident(bool training);
  void idle();
  // Bytes of this rank's parameters, gradients and optimizer state on its
  // device now (each storage once; offloaded ones count 0).
  int64_t resident_bytes() const;

 private:
  // This rank's parameters, their gradients (once made) and the optimizer's
  // state: what offload moves and resident_bytes counts.
  struct Tensors {
    std::vector<at::Tensor> params, grads, optimizer;
  };
  Tensors tensors() const;

  std::shared_ptr<engine::ParallelState> state_;
  std::shared_ptr<engine::Transformer> model_;
  std::unique_ptr<engine::Optimizer> optimizer_;
  ModelOptions options_;
  std::string hf_config_text_;
  std::unique_ptr<engine::TensorOffload> params_away_, grads_away_, optimizer_away_;
};

// RAII: resident(training) now, idle() at scope exit (also when the phase
// throws; an idle() that fails then only logs, leaving the role resident).
class OffloadPhase {
 public:
  OffloadPhase(RoleModel& role, bool training) : role_(role) { role_.resident(training); }
  ~OffloadPhase();
  OffloadPhase(const OffloadPhase&) = delete;
  OffloadPhase& operator=(const OffloadPhase&) = delete;

 private:
  RoleModel& role_;
};

// `batch` cut into micro-batches of `batching.rows` rows (the last may be
// shorter): input_ids, attention_mask, position_ids (from the batch, or the
// cumulative mask when it has none), and the tensors named in `extra`, each
// on `device` (the model's: a worker's batch arrives in host memory), the
// sequence padded to a multiple of batching.sequence_multiple.
// With batching.max_tokens > 0, each micro-batch instead packs the real
// tokens (attention_mask 1) of consecutive rows into one row, at most
// max_tokens of them, with their own position ids (engine::MicroBatch::
// packed_lengths, packed_index); `extra` stays per row, [b, ...]. A row with
// more tokens than max_tokens, or none: baton::Error naming the row.
std::vector<engine::MicroBatch> make_micro_batches(const DataProto& batch,
                                                   const MicroBatching& batching,
                                                   const std::vector<std::string>& extra,
                                                   at::Device device);

// The padded batch's width S of a micro-batch (packed or not).
int64_t padded_width(const engine::MicroBatch& mb);

// A per-position stage output `out` ([b, S, ...] for padded rows, [1, T, ...]
// for a packed row) at columns [from, to) of each padded row: [b, to - from,
// ...]. Padding columns of a packed micro-batch read its rows' first tokens
// (values to be masked, as the padded path's are).
at::Tensor padded_columns(const at::Tensor& out, const engine::MicroBatch& mb, int64_t from,
                          int64_t to);

// Rows of left-padded prompts `ids` [N, P] (with their attention `mask`) as
// token lists without the padding, what a GenerationEngine takes. A row with
// no tokens: baton::Error "<where>: prompt row r has no tokens".
std::vector<std::vector<int64_t>> unpadded_prompts(const at::Tensor& ids, const at::Tensor& mask,
                                                   const std::string& where);

// The response width R of an RL batch (responses' columns, else
// response_mask's); baton::Error naming the keys when neither is there.
int64_t response_width(const DataProto& batch);

// `response_mask` of an RL batch as fp32 [N, R]; when absent, the response
// part of attention_mask.
at::Tensor response_mask_of(const DataProto& batch);

// Per-token log-probs and entropy (and Σπ², `with_sum_pi_squared`) of
// response tokens from one micro-batch's logits shard ([b, P+R, V/tp], or
// packed [1, T, V/tp]): positions P-1 .. P+R-2 score tokens P .. P+R-1.
ResponseScores response_scores(const at::Tensor& logits_shard, const engine::MicroBatch& mb,
                               int64_t response_width, double temperature, const engine::Group& tp,
                               bool with_sum_pi_squared = false);

// Sums `values` element-wise over `group` in place (a no-op for size 1).
// `device`: where the group's collectives run (ParallelState::device(): a GPU
// for NCCL groups, which take no host tensors).
void all_reduce_sum(std::vector<double>& values, const engine::Group& group, at::Device device);

// Writes the role's model as an HF model directory `dir` (config.json,
// safetensors, and the source directory's other files such as the
// tokenizer's). Collective over the role's world: DP rank 0 of every TP × PP
// position writes its shard under `dir`.shards, rank 0 merges them and
// removes that directory. A LoRA model (ModelOptions::lora) writes its
// merged weights (Transformer::merged_params): a plain HF model; and its
// adapters alone as a PEFT adapter of the base model (ModelOptions::path)
// in `dir`/adapter (engine/io/peft_adapter.h).
void export_hf_model(RoleModel& role, const std::string& dir);

// ModelOptions::dtype as a LibTorch dtype: "float32"/"fp32" or
// "bfloat16"/"bf16"; baton::Error naming `where` and the accepted names
// otherwise.
at::ScalarType parameter_dtype(const std::string& name, const std::string& where);

// OptimOptions → the engine's optimizer settings (clip, schedule, AdamW).
engine::OptimizerOptions engine_optimizer_options(const OptimOptions& optim);

}  // namespace baton::workers
