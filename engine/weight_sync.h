// Weight sync to separate rollout workers (disaggregated rollout, the path
// fully-async training needs): the trainer's processes and the rollout
// workers' processes are different ones, joined by a sync group of training
// rank 0 (sync rank 0) and every rollout rank (sync rank 1 + r). One send:
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
//      metadata. The training world's first replica (cp = dp = 0) assembles
//      each bucket on training rank 0: TP shards go to the owning stage's TP
//      rank 0, which sends the bucket to rank 0 over the pipeline group. Rank 0
//      broadcasts it over the sync group, double-buffered: the next bucket is
//      assembled while this one travels.
//   3. Each receiver copies its rollout-TP slice of every tensor out of the
//      bucket into its rollout model (fused QKV and gate/up re-split; the
//      embedding and LM head stripped of the trainer's vocabulary padding and
//      padded again as the rollout layout pads them), casting to the rollout
//      dtype.
// On GPUs: the training groups carry the buckets on their device (the GPU
// with NCCL groups, ParallelState::device); rank 0 copies each bucket to
// pinned host memory for the sync group, which is Gloo; receivers take it
// into host memory and copy their slices into the rollout model on its
// device. No CUDA IPC, no NCCL between the two process sets. Build the
// sender after moving the model to its device and dtype (the dtype is read
// then).
//
// Example:
//   // training rank t of W_t (rank 0 holds the sync group):
//   c10::intrusive_ptr<c10d::ProcessGroup> sync;           // null except on rank 0
//   if (t == 0) sync = make_sync_group(store, "actor", 0, 1 + rollout_world);
//   WeightSender sender(train_model, sync);
//   sender.send(/*version=*/step);                         // every training rank
//   // rollout rank r:
//   WeightReceiver receiver(rollout_model, training_cfg,
//                           make_sync_group(store, "actor", 1 + r, 1 + rollout_world));
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

#include "engine/parallel_state.h"
#include "engine/transformer.h"

namespace baton::engine {

struct WeightSyncOptions {
  // Bytes of full tensors per bucket (a larger tensor travels alone). Sender
  // and receivers must use the same value (the header checks it).
  int64_t bucket_bytes = 64 << 20;
};

struct WeightSyncStats {
  double seconds = 0;
  int64_t version = 0;      // the sender's version of these weights
  int64_t model_bytes = 0;  // full model, each tensor once, in the sender's dtype
  int64_t buckets = 0;
  int64_t peak_buffer_bytes = 0;  // most bucket-buffer bytes held at once on this rank
  // The largest bucket's buffer (a bucket, or one larger tensor, plus 8-byte
  // alignment per tensor): peak_buffer_bytes stays within two of these (on a
  // GPU sender, two in pinned host memory plus one on the device).
  int64_t largest_bucket_bytes = 0;
};

// A Gloo process group of `size` ranks for weight sync, over `store` under
// keys "baton/weight_sync/<name>/": every member calls it with the same name,
// and a new group on the same store (a restarted worker set, a second trainer)
// needs a new name. Collective and blocking.
c10::intrusive_ptr<c10d::ProcessGroup> make_sync_group(
    c10::intrusive_ptr<c10d::Store> store, const std::string& name, int64_t rank, int64_t size,
    std::chrono::milliseconds timeout = std::chrono::minutes(5));

class WeightSender {
 public:
  // `sync`: the sync group on training rank 0, null on every other training
  // rank. Throws EngineError when rank 0 has none, or the parameters do not
  // share one dtype.
  WeightSender(std::shared_ptr<Transformer> train, c10::intrusive_ptr<c10d::ProcessGroup> sync,
               WeightSyncOptions options = {});
  ~WeightSender();

  // Collective over the training world (every training rank calls it) and,
  // on rank 0, over the sync group. Returns once rank 0's last bucket is out.
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
  // buckets, its make_vocab_size_divisible_by the trainer's padding rows). Throws EngineError when the rollout model is not one stage.
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
