// Writes fuzz_wire_message's seed inputs (tests/fuzz/corpus/fuzz_wire_message/):
// real messages as the runtime encodes them, concatenated as they would
// arrive on a socket. Run once: make_wire_seeds DIR.
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <capnp/serialize.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "runtime/channel.h"
#include "runtime/shm_pool.h"
#include "runtime/value_codec.h"

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
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_wire_seeds DIR\n");
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
  return 0;
}
