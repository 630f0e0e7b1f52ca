// Writes fuzz_wire_message's seed inputs (tests/fuzz/corpus/fuzz_wire_message/):
// real messages as the runtime encodes them, concatenated as they would
// arrive on a socket; and with a second folder, fuzz_data_proto's: batches
// saved as DataProto files. Run once: make_wire_seeds WIRE_DIR [DATA_PROTO_DIR].
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <capnp/serialize.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "dispatch/data_proto.h"
#include "runtime/internal/channel.h"
#include "runtime/internal/shm_pool.h"
#include "runtime/internal/value_codec.h"

namespace {

std::string flat(capnp::MessageBuilder& b) {
  auto words = capnp::messageToFlatArray(b);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// A call with `args`, encoded as the driver does (large tensors into a segment).
std::string call(baton::ShmPool& pool, uint64_t id, const baton::List& args) {
  baton::SmallMessageBuilder b;
  auto env = b.initRoot<baton::wire::Envelope>();
  baton::ValueEncoder enc(pool);
  enc.plan(args);
  auto c = env.initCall();
  c.setCallId(id);
  c.setMethod("compute_log_prob");
  enc.encode(args, c.initArgs(static_cast<unsigned>(args.size())));
  enc.finish(env);
  return flat(b);
}

std::string result(baton::ShmPool& pool, uint64_t id, const baton::Value& v) {
  baton::SmallMessageBuilder b;
  auto env = b.initRoot<baton::wire::Envelope>();
  baton::ValueEncoder enc(pool);
  enc.plan(v);
  auto r = env.initResult();
  r.setCallId(id);
  enc.encode(v, r.initValue());
  enc.finish(env);
  auto rel = env.initReleased(2);
  rel.set(0, 1);
  rel.set(1, 2);
  return flat(b);
}

std::string error_result(uint64_t id) {
  baton::SmallMessageBuilder b;
  auto r = b.initRoot<baton::wire::Envelope>().initResult();
  r.setCallId(id);
  auto e = r.initError();
  e.setKind(baton::wire::ErrorKind::EXCEPTION);
  e.setMessage("boom");
  return flat(b);
}

std::string init(baton::ShmPool& pool) {
  baton::SmallMessageBuilder b;
  auto env = b.initRoot<baton::wire::Envelope>();
  baton::ValueEncoder enc(pool);
  baton::List args = {baton::Value(std::string("{\"lr\": 1e-5}")), baton::Value(int64_t{3})};
  enc.plan(args);
  auto roles = env.initInit().initRoles(2);
  for (unsigned i = 0; i < 2; ++i) {
    roles[i].setRole(i == 0 ? "actor" : "critic");
    roles[i].setClassName("ActorRolloutRefWorker");
    enc.encode(args, roles[i].initInitArgs(2));
  }
  enc.finish(env);
  return flat(b);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: make_wire_seeds WIRE_DIR [DATA_PROTO_DIR]\n");
    return 2;
  }
  const std::string dir = argv[1];
  baton::ShmPool pool;
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
  };
  baton::Dict batch = {{"input_ids", at::arange(12, at::kLong).reshape({3, 4})},
                       {"temperature", 1.0},
                       {"meta", baton::Dict{{"n", int64_t{2}}, {"ok", true}, {"none", baton::Value()}}}};
  write("seed-call-inline.bin", call(pool, 1, {batch, std::string("x")}));
  // 64 KiB and more goes through the segment (fd 0 of the message).
  write("seed-call-segment.bin", call(pool, 2, {at::ones({128, 256}, at::kFloat)}));
  write("seed-result-and-error.bin",
        result(pool, 3, baton::Value(baton::List{at::ones({3}), 2.5})) + error_result(4));
  write("seed-init.bin", init(pool));
  if (argc == 3) {
    const std::string batches = argv[2];
    // A rollout batch as the async trainer's ledger saves it: token ids,
    // masks, float scores, string columns, nested meta.
    baton::DataProto rollout(
        {{"input_ids", at::arange(24, at::kLong).reshape({4, 6})},
         {"attention_mask", at::ones({4, 6}, at::kBool)},
         {"old_log_probs", at::arange(4, at::kFloat).reshape({4, 1}).div(8)},
         {"scores", at::ones({4}, at::kDouble)}},
        {{"uid",
          {baton::Value(std::string("1-0")), baton::Value(std::string("1-1")),
           baton::Value(std::string("1-0")), baton::Value(std::string("1-1"))}},
         {"ground_truth",
          {baton::Value(int64_t{4}), baton::Value(2.5), baton::Value(), baton::Value(true)}}},
        baton::Dict{{"temperature", 1.0},
                    {"stop", baton::List{baton::Value(int64_t{2}), baton::Value(int64_t{7})}},
                    {"params", baton::Dict{{"n", int64_t{2}}, {"name", std::string("grpo")}}}});
    rollout.save(batches + "/seed-rollout.baton");
    baton::DataProto half(
        {{"x", at::ones({2, 3}, at::kHalf)}, {"y", at::ones({2}, at::kBFloat16)}});
    half.save(batches + "/seed-half-precision.baton");
    baton::DataProto().save(batches + "/seed-empty.baton");
  }
  return 0;
}
