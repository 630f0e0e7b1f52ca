// TensorOffload on the CPU: storages spill to a file and come back
// bit-identical, with every view of them valid again; memory another
// allocator owns stays and is counted apart.
#include "engine/optim/offload.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/errors.h"

namespace baton::engine {
namespace {

TEST(TensorOffload, StoragesLeaveAndComeBackBitIdenticalWithTheirViews) {
  // A flat buffer with two views (as the distributed optimizer's parameters),
  // and a tensor of its own.
  at::Tensor flat = at::randn({1000});
  at::Tensor a = flat.narrow(0, 0, 600).view({20, 30});
  at::Tensor b = flat.narrow(0, 600, 400);
  at::Tensor c = at::randn({7, 9}, at::kDouble);
  const at::Tensor flat_copy = flat.clone(), c_copy = c.clone();
  // Memory from another allocator (a from_blob view) is kept.
  std::vector<float> outside(16, 1.5f);
  at::Tensor blob = at::from_blob(outside.data(), {16});

  TensorOffload away({a, b, c, flat, blob, at::Tensor()});
  EXPECT_EQ(away.bytes(), 1000 * 4 + 63 * 8);  // the flat storage once, and c
  EXPECT_EQ(away.kept_bytes(), 16 * 4);
  EXPECT_EQ(away.resident_bytes(), away.bytes() + away.kept_bytes());

  away.offload();
  EXPECT_TRUE(away.offloaded());
  EXPECT_EQ(flat.storage().nbytes(), 0u);
  EXPECT_EQ(c.storage().nbytes(), 0u);
  EXPECT_EQ(blob.storage().nbytes(), 16u * 4);
  EXPECT_EQ(away.resident_bytes(), away.kept_bytes());
  away.offload();  // already away: nothing happens

  away.reload();
  EXPECT_FALSE(away.offloaded());
  EXPECT_TRUE(at::equal(flat, flat_copy));
  EXPECT_TRUE(at::equal(c, c_copy));
  EXPECT_TRUE(at::equal(a, flat_copy.narrow(0, 0, 600).view({20, 30})));
  EXPECT_TRUE(at::equal(b, flat_copy.narrow(0, 600, 400)));
  // The views still alias the buffer: a write through one shows in the other.
  b.fill_(3.0f);
  EXPECT_EQ(flat[999].item<float>(), 3.0f);

  // A second round trip after the write keeps the new values.
  away.offload();
  away.reload();
  EXPECT_EQ(flat[600].item<float>(), 3.0f);
  EXPECT_TRUE(at::equal(a, flat_copy.narrow(0, 0, 600).view({20, 30})));
}

TEST(TensorOffload, AnUnwritableSpillDirectoryIsNamedAndNothingIsFreed) {
  at::Tensor t = at::randn({64});
  const at::Tensor copy = t.clone();
  TensorOffload away({t}, "/nonexistent/baton-spill");
  try {
    away.offload();
    ADD_FAILURE() << "offload into a missing directory succeeded";
  } catch (const EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/baton-spill"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(away.offloaded());
  EXPECT_TRUE(at::equal(t, copy));
}

// On a GPU the storages go to pinned host memory: the device's allocated
// bytes drop by theirs while away and the views come back bit-identical.
TEST(TensorOffload, GpuStoragesGoToPinnedHostMemoryAndBack_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: GPU storages offload to pinned host memory";
  at::Tensor flat = at::randn({1 << 20}, at::TensorOptions().device(at::kCUDA));
  at::Tensor view = flat.narrow(0, 1000, 5000);
  const at::Tensor host_copy = flat.cpu();
  TensorOffload away({view, flat});
  EXPECT_EQ(away.bytes(), (1 << 20) * 4);
  away.offload();
  EXPECT_EQ(flat.storage().nbytes(), 0u);
  EXPECT_EQ(away.resident_bytes(), 0);
  away.reload();
  EXPECT_TRUE(at::equal(flat.cpu(), host_copy));
  EXPECT_TRUE(at::equal(view.cpu(), host_copy.narrow(0, 1000, 5000)));
  EXPECT_TRUE(flat.is_cuda());
}

}  // namespace
}  // namespace baton::engine
