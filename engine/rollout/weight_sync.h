// Weight sync to separate rollout workers (disaggregated rollout, the path
// fully-async training needs): the trainer's processes and the rollout
// workers' processes are different ones, joined by a sync group of the
// training ranks of the first data-parallel replica (dp = cp = 0; sync rank
// stage·tp + tp rank, trainer_sync_rank) and every rollout rank (sync rank
// tp·pp + r, receiver_sync_rank). Under expert parallelism (training ep > 1)
// the first ep data-parallel replicas send (cp = 0, dp < ep; sync rank
// (dp·pp + stage)·tp + tp rank, the rollout ranks from tp·pp·ep on): dp rank
// j holds the experts of EP rank j (ParallelConfig::ep_rank_of), which only
// it sends, in buckets of expert tensors of their own; the other tensors
// come from dp 0 as without EP. The rollout model holds every expert. One
// send:
//   1. Handshake. The training ranks all-reduce whether their own shards fit
//      the model; rank 0 broadcasts a header (version, tensor count, model
//      bytes, dtype, training TP/PP and padded vocabulary, bucket count, a
//      digest of every tensor's shape and stage and every bucket's size, and
//      the trainers' verdict); each receiver checks it against its own model,
//      and an all-reduce of their verdicts, then a broadcast over the training
//      world, makes every party fail together with an EngineError instead of
//      hanging.
//   2. Buckets of about `bucket_bytes` of full tensors, in the order of
//      whole_model_tensors() (weight_conversion.h), so nobody exchanges
//      metadata. The handshake also all-gathers every receiver's rollout
//      layout, so each side knows which shards each receiver needs (those
//      overlapping its rollout slice). Each shard is one message over the
//      sync group, from the training rank of the first replica that holds
//      it, straight out of its parameter (a GPU model's through a pinned host
//      buffer per bucket), to each receiver that needs it: no gathering hop
//      among the trainers, two buckets in flight. Receivers take the stages'
//      buckets in turn, so the stages send at the same time.
//   3. A receiver takes a shard straight into its rollout parameter when the
//      shard is the whole parameter or a run of its rows (same dtype, host
//      memory); any other shard lands in a bucket buffer, from which its
//      rollout-TP slice is copied (fused QKV and gate/up re-split; the
//      embedding and LM head stripped of the trainer's vocabulary padding and
//      padded again as the rollout layout pads them), cast to the rollout
//      dtype. Bucket buffers are kept between syncs (keep_buffers).
// On GPUs: each training rank copies its shards from the GPU into pinned
// host memory for the sync group, which is Gloo; receivers take the regions
// into host memory and copy their slices into the rollout model on its
// device. No CUDA IPC, no NCCL between the two process sets. Build the
// sender after moving the model to its device and dtype (the dtype is read
// then).
//
// Example:
//   // every training rank (those of the first replica join the sync group):
//   const int64_t size = sync_group_size(training_cfg, rollout_world);
//   c10::intrusive_ptr<c10d::ProcessGroup> sync;           // null outside the first replica
//   if (int64_t s = trainer_sync_rank(*ps); s >= 0) sync = make_sync_group(store, "actor", s,
//   size); WeightSender sender(train_model, sync); sender.send(/*version=*/step); // every training
//   rank
//   // rollout rank r:
//   WeightReceiver receiver(rollout_model, training_cfg,
//                           make_sync_group(store, "actor", receiver_sync_rank(training_cfg, r),
//                           size));
//   auto stats = receiver.receive();                       // stats.version == step
//
// Thread safety: none; each side is driven by one thread.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/model/transformer.h"
#include "engine/parallel/parallel_state.h"

namespace baton::engine {

struct WeightSyncOptions {
  // Bytes of full tensors per bucket (a larger tensor travels alone). Sender
  // and receivers must use the same value (the header checks it).
  int64_t bucket_bytes = 64 << 20;
  // Keep the (at most two) bucket buffers from one send or receive to the
  // next: their pages stay mapped, which saves the page faults of fresh
  // memory on every sync (about a third of a sync's time on a CPU host).
  // false: free them after each sync.
  bool keep_buffers = true;
};

struct WeightSyncStats {
  double seconds = 0;
  int64_t version = 0;      // the sender's version of these weights
  int64_t model_bytes = 0;  // full model, each tensor once, in the sender's dtype
  int64_t buckets = 0;
  int64_t peak_buffer_bytes = 0;  // most bucket-buffer bytes held at once on this rank
  // The largest bucket's buffer (a bucket, or one larger tensor, plus 8-byte
  // alignment per tensor): peak_buffer_bytes stays within two of these (in
  // host memory; pinned beside a GPU).
  int64_t largest_bucket_bytes = 0;
  // Bytes of shards this rank put on the sync group (a sender, once per
  // receiver that needs them) or took from it (a receiver: only the shards
  // overlapping its rollout slice).
  int64_t transferred_bytes = 0;
};

// A Gloo process group of `size` ranks for weight sync, over `store` under
// keys "baton/weight_sync/<name>/": every member calls it with the same name,
// and a new group on the same store (a restarted worker set, a second trainer)
// needs a new name. Collective and blocking. `timeout` is the deadline of the
// forming and of every operation of a send or receive: a party that does not
// arrive makes the others throw EngineError naming the group
// ("weight_sync:<name>"), the operation and its sync rank (deadline_group.h).
c10::intrusive_ptr<c10d::ProcessGroup> make_sync_group(
    c10::intrusive_ptr<c10d::Store> store, const std::string& name, int64_t rank, int64_t size,
    std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);

// The sync group's ranks: a training rank's (-1 outside the first
// data-parallel replica, or under expert parallelism outside the first ep:
// the others take part in the handshake over the training world only),
// rollout rank r's, and the group's size.
int64_t trainer_sync_rank(const ParallelState& training);
int64_t receiver_sync_rank(const ParallelConfig& training, int64_t rollout_rank);
int64_t sync_group_size(const ParallelConfig& training, int64_t rollout_world);

class WeightSender {
 public:
  // `sync`: the sync group on the senders (at trainer_sync_rank >= 0), null
  // on the others. Throws EngineError when a sender has none or another
  // rank in it, or the parameters do not share one dtype.
  WeightSender(std::shared_ptr<Transformer> train, c10::intrusive_ptr<c10d::ProcessGroup> sync,
               WeightSyncOptions options = {});
  ~WeightSender();

  // Collective over the training world (every training rank calls it) and,
  // on the senders, over the sync group. Returns once this rank's last
  // region is out.
  // Throws EngineError on every training rank when a receiver rejected the
  // header (its model or options differ), naming how many did.
  WeightSyncStats send(int64_t version);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

class WeightReceiver {
 public:
  // `rollout`: this rollout rank's model (one stage, its TP slice);
  // `training`: the trainer's ParallelConfig (its stage split decides the
  // buckets, its make_vocab_size_divisible_by the trainer's padding rows,
  // its ep which ranks send which experts). Throws EngineError when the rollout model is not one
  // stage.
  WeightReceiver(std::shared_ptr<Transformer> rollout, const ParallelConfig& training,
                 c10::intrusive_ptr<c10d::ProcessGroup> sync, WeightSyncOptions options = {});
  ~WeightReceiver();

  // Collective over the sync group, once per send(). Throws EngineError
  // (after telling the sender) when the header does not match this model,
  // naming what differs.
  WeightSyncStats receive();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton::engine
