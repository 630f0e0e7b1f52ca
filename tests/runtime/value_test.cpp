#include "runtime/value.h"

#include <ATen/Context.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/TensorOperators.h>
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/errors.h"
#include "runtime/internal/shm_pool.h"
#include "runtime/internal/value_codec.h"
#include "runtime/shared_tensor.h"

namespace baton {
namespace {

TEST(Value, HoldsEveryKind) {
  EXPECT_EQ(Value().kind(), ValueKind::kNone);
  EXPECT_EQ(Value(true).as_bool(), true);
  EXPECT_EQ(Value(7).as_int(), 7);
  EXPECT_EQ(Value(int64_t{1} << 40).as_int(), int64_t{1} << 40);
  // Stored, not computed: bit-exact.
  EXPECT_EQ(Value(2.5).as_float(), 2.5);
  EXPECT_EQ(Value(3).as_float(), 3.0);  // ints widen (exactly, below 2^53)
  EXPECT_EQ(Value("x").as_string(), "x");
  EXPECT_EQ(Value(List{1, "a"}).as_list().size(), 2u);
  Value d(Dict{{"lr", 0.1}, {"name", "actor"}});
  EXPECT_EQ(d.at("lr").as_float(), 0.1);
  EXPECT_EQ(d.find("missing"), nullptr);
  EXPECT_EQ(Value(at::ones({2, 3})).as_tensor().numel(), 6);
}

TEST(Value, WrongKindThrowsTypeErrorNamingBothKinds) {
  try {
    Value("text").as_int();
    FAIL() << "no exception";
  } catch (const TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("expected a value of kind int, got string"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Value(Dict{}).at("k"), TypeError);
}

TEST(Value, TypedConversionsRoundTrip) {
  std::vector<std::vector<int64_t>> nested{{1, 2}, {3}};
  EXPECT_EQ(ValueTraits<decltype(nested)>::to_value(nested).as<decltype(nested)>(), nested);
  std::map<std::string, double> m{{"a", 1.5}, {"b", -2}};
  EXPECT_EQ(ValueTraits<decltype(m)>::to_value(m).as<decltype(m)>(), m);
}

TEST(TypeSpec, DescribesTheFirstMismatch) {
  TypeSpec t = ValueTraits<std::vector<double>>::spec();
  EXPECT_EQ(t.name(), "list<float>");
  EXPECT_FALSE(t.mismatch(Value(List{1.0, 2})).has_value());  // int conforms to float
  auto m = t.mismatch(Value(List{1.0, "two"}));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(*m, "element 1: expected float, got string");
  EXPECT_EQ(*TypeSpec::of(ValueKind::kTensor).mismatch(Value(3)), "expected tensor, got int");
  EXPECT_FALSE(TypeSpec::any().mismatch(Value(List{})).has_value());
}

// Encodes `v` as a sender would and decodes it as a receiver would, in one process.
struct RoundTrip {
  ShmPool pool;
  ShmRegionCache regions;
  std::vector<SegmentId> released;
  size_t last_fd_count = 0;

  Value run(const Value& v) {
    capnp::MallocMessageBuilder builder;
    auto env = builder.initRoot<wire::Envelope>();
    ValueEncoder enc(pool);
    enc.plan(v);
    auto call = env.initCall();
    enc.encode(v, call.initArgs(1)[0]);
    std::vector<int> fds = enc.finish(env);
    last_fd_count = fds.size();
    std::vector<int> dup_fds;
    for (int fd : fds) dup_fds.push_back(dup(fd));  // the channel would pass a copy
    if (auto seg = enc.segment()) {
      pool.hold(*seg, 7);
      pool.release(*seg, kSelfPeer);
    }
    ValueDecoder dec(dup_fds, env.getSharedBytes(), regions, [this](SegmentId id) {
      released.push_back(id);
      pool.release(id, 7);
    });
    return dec.decode(env.asReader().getCall().getArgs()[0]);
  }
};

TEST(ValueCodec, RoundTripsNestedValuesAndTensorsOfEveryDtype) {
  RoundTrip rt;
  List tensors;
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt, at::kLong,
                     at::kShort, at::kChar, at::kByte, at::kBool, at::kComplexFloat}) {
    tensors.push_back(at::arange(24, at::kDouble).reshape({2, 3, 4}).remainder(2).to(dtype));
  }
  tensors.push_back(at::ones({0, 5}));           // empty
  tensors.push_back(at::randn({}));              // 0-dim
  tensors.push_back(at::randn({300, 400}));      // 480 KB: shared memory
  tensors.push_back(at::randn({64, 1024}).t());  // non-contiguous, shared memory
  tensors.push_back(at::randn({8, 6}).t());      // non-contiguous, inline
  Value v(Dict{{"xs", tensors}, {"cfg", Dict{{"lr", 1e-5}, {"ok", true}, {"n", Value()}}}});
  Value back = rt.run(v);
  EXPECT_EQ(back, v);
  const List& got = back.at("xs").as_list();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].as_tensor().scalar_type(), tensors[i].as_tensor().scalar_type()) << i;
    EXPECT_EQ(got[i].as_tensor().sizes(), tensors[i].as_tensor().sizes()) << i;
  }
}

// A tensor header from the wire whose sizes multiply past int64 or whose
// bytes would lie past the segment (an offset that wraps around) is refused
// by name, never turned into a tensor over someone else's memory.
TEST(ValueCodec, TensorsWhoseSizesOverflowOrWhoseBytesWrapAroundAreRefused) {
  RoundTrip rt;
  auto decode = [&](int64_t dim0, int64_t dim1, uint64_t offset, uint64_t length,
                    bool shared) -> std::string {
    capnp::MallocMessageBuilder b;
    auto t = b.initRoot<wire::Value>().initTensor();
    t.setDtype(static_cast<int8_t>(at::kFloat));
    auto shape = t.initShape(2);
    shape.set(0, dim0);
    shape.set(1, dim1);
    if (shared) {
      auto sb = t.initShared();
      sb.setSegment(1);
      sb.setFdIndex(0);
      sb.setOffset(offset);
      sb.setLength(length);
    } else {
      t.initInline(16);
    }
    int fd = memfd_create("value-test", MFD_CLOEXEC);
    EXPECT_EQ(ftruncate(fd, 1 << 20), 0);
    ValueDecoder dec({fd}, 1 << 20, rt.regions, [](SegmentId) {});
    try {
      dec.decode(b.getRoot<wire::Value>().asReader());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(decode(int64_t{1} << 40, int64_t{1} << 40, 0, 0, false),
            "malformed message: a tensor of more than 2^63 elements");
  EXPECT_EQ(decode(int64_t{1} << 31, int64_t{1} << 31, 0, 0, false),
            "malformed message: a tensor of more than 2^64 bytes");
  // 16 bytes at offset 2^64 - 8: the end wraps to 8, inside the segment.
  EXPECT_EQ(decode(2, 2, ~uint64_t{0} - 7, 16, true),
            "malformed message: shared tensor bytes out of range");
  EXPECT_EQ(decode(2, 2, (1 << 20) - 8, 16, true),
            "malformed message: shared tensor bytes out of range");
  EXPECT_EQ(decode(2, 2, (1 << 20) - 16, 16, true), "");  // the last 16 bytes: fine
}

// Only plain element types are decoded: a quantized or bit-packed dtype code
// from the wire would make a tensor no operation of ours expects (a sum over
// a QuantizedCPU tensor threw in fuzz_data_proto).
TEST(ValueCodec, QuantizedAndBitPackedDtypesAreRefused) {
  RoundTrip rt;
  for (auto dtype :
       {at::kQInt8, at::kQUInt8, at::kQInt32, at::ScalarType::Bits8, at::ScalarType::Undefined}) {
    capnp::MallocMessageBuilder b;
    auto t = b.initRoot<wire::Value>().initTensor();
    t.setDtype(static_cast<int8_t>(dtype));
    t.initShape(1).set(0, 4);
    t.initInline(4);
    ValueDecoder dec({}, 0, rt.regions, [](SegmentId) {});
    try {
      dec.decode(b.getRoot<wire::Value>().asReader());
      ADD_FAILURE() << "decoded a tensor of dtype " << c10::toString(dtype);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("are not carried"), std::string::npos) << e.what();
    }
  }
}

// Device tensors travel through host memory (value_codec.h): the receiver
// gets CPU tensors with the same bytes, through the shared segment or inline.
TEST(ValueCodec, CudaTensorsArriveAsCpuTensorsWithTheSameBytes_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device to put the tensors on";
  RoundTrip rt;
  std::vector<at::Tensor> cpu{at::randn({300, 400}),       // shared memory
                              at::randn({64, 1024}).t(),   // non-contiguous, shared memory
                              at::randn({8, 6}),           // inline
                              at::arange(10, at::kLong)};  // inline, int64
  List on_gpu;
  for (const auto& t : cpu) on_gpu.push_back(t.to(at::kCUDA));
  Value back = rt.run(Value(on_gpu));
  const List& got = back.as_list();
  ASSERT_EQ(got.size(), cpu.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].as_tensor().device().is_cpu()) << i;
    EXPECT_TRUE(got[i].as_tensor().equal(cpu[i])) << i;
  }
}

TEST(ValueCodec, SharedSegmentIsReleasedWhenTheLastTensorGoesAndThenReused) {
  RoundTrip rt;
  at::Tensor big = at::randn({256, 1024});  // 1 MiB
  SegmentId first;
  {
    Value back = rt.run(Value(List{big, big * 2}));
    EXPECT_TRUE(rt.released.empty());  // still viewed by `back`
    EXPECT_EQ(rt.pool.busy_count(), 1u);
    at::Tensor keep = back.as_list()[1].as_tensor();
    back = Value();
    EXPECT_TRUE(rt.released.empty());  // one tensor still alive
    EXPECT_TRUE(keep.equal(big * 2));
  }
  ASSERT_EQ(rt.released.size(), 1u);
  first = rt.released[0];
  EXPECT_EQ(rt.pool.busy_count(), 0u);
  Value again = rt.run(Value(big));
  EXPECT_TRUE(again.as_tensor().equal(big));
  EXPECT_EQ(rt.pool.segment_count(), 1u) << "the idle segment should have been reused";
  again = Value();
  EXPECT_EQ(rt.released.back(), first);
}

// A shared tensor (and a contiguous view of one) is passed by reference: the
// decoded tensor views the same pages (a write through either shows in the
// other), is itself shared, and nothing of it was copied into the segment,
// which only the ordinary large tensor uses.
TEST(ValueCodec, SharedTensorsTravelByReference) {
  RoundTrip rt;
  at::Tensor shared = shared_empty({512, 256});
  shared.copy_(at::arange(512 * 256, at::kFloat).view({512, 256}));
  at::Tensor ordinary = at::randn({256, 256});  // 256 KB: copied into the segment
  ASSERT_TRUE(is_shared(shared));
  EXPECT_FALSE(is_shared(ordinary));
  EXPECT_TRUE(is_shared(shared.narrow(0, 100, 200)));
  Value back = rt.run(Value(List{shared, ordinary, shared.narrow(0, 100, 200)}));
  at::Tensor got = back.as_list()[0].as_tensor(), rows = back.as_list()[2].as_tensor();
  EXPECT_TRUE(got.equal(shared));
  EXPECT_TRUE(rows.equal(shared.narrow(0, 100, 200)));
  EXPECT_TRUE(back.as_list()[1].as_tensor().equal(ordinary));
  EXPECT_TRUE(is_shared(got));
  got[3][4] = -1.0f;
  EXPECT_EQ(shared[3][4].item<float>(), -1.0f) << "the receiver's write shows in the sender's tensor";
  shared[150][0] = -2.0f;
  EXPECT_EQ(rows[50][0].item<float>(), -2.0f) << "the view decoded at its offset";
  // The received tensor goes on by reference too (its fd was kept).
  RoundTrip again;
  at::Tensor forwarded = again.run(Value(got)).as_tensor();
  forwarded[0][0] = -3.0f;
  EXPECT_EQ(shared[0][0].item<float>(), -3.0f);
}

// One fd per distinct shared memory, at most kMaxPassedMemories per message:
// the rest are copied like ordinary tensors, and small ones always are.
TEST(ValueCodec, SharedTensorsBeyondTheFdCapAndSmallOnesAreCopied) {
  std::vector<at::Tensor> ts;
  for (size_t i = 0; i < kMaxPassedMemories + 3; ++i)
    ts.push_back(to_shared(at::full({kInlineTensorBytes / 4}, static_cast<float>(i))));
  ts.push_back(to_shared(at::ones({4})));  // 16 bytes: inline
  List xs(ts.begin(), ts.end());
  RoundTrip rt;
  Value back = rt.run(Value(xs));
  ASSERT_EQ(back.as_list().size(), xs.size());
  size_t by_reference = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const at::Tensor& got = back.as_list()[i].as_tensor();
    EXPECT_TRUE(got.equal(xs[i].as_tensor())) << i;
    by_reference += is_shared(got) ? 1 : 0;
  }
  EXPECT_EQ(by_reference, kMaxPassedMemories);
  EXPECT_EQ(rt.last_fd_count, kMaxPassedMemories + 1) << "the segment, then one fd per memory";
}

TEST(ValueCodec, HeldSegmentIsNotHandedOutAgain) {
  ShmPool pool;
  auto a = pool.acquire(1 << 20);
  auto b = pool.acquire(1 << 20);
  EXPECT_NE(a.id, b.id);
  pool.release(a.id, kSelfPeer);
  auto c = pool.acquire(1 << 20);
  EXPECT_EQ(c.id, a.id);
  pool.hold(b.id, 3);
  pool.release(b.id, kSelfPeer);
  pool.release_peer(3);  // the peer died: its holds go
  EXPECT_EQ(pool.busy_count(), 1u);
}

}  // namespace
}  // namespace baton
