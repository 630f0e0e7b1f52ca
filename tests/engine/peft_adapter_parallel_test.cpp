// A PEFT adapter (engine/io/peft_adapter.h) over TP2 × PP2 on the tiny Qwen3
// (four layers split 3 + 1): each rank loads its slice of the adapter (a
// column layer's B rows, a row layer's A columns, the other factor whole;
// lora.h), and the ranks' adapters gathered the way export_hf gathers a
// model (each writes its sharded rank file, one rank reads them all) are the
// same adapter again, bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/peft_adapter.h"
#include "engine/io/sharded_model.h"
#include "engine/model/transformer.h"
#include "tests/engine/multiprocess.h"

namespace baton::engine {
namespace {

using test::run_world;

const std::string kFixtures = BATON_FIXTURES_DIR;

TEST(ParallelPeftAdapter, Tp2Pp2RanksLoadTheirSlicesAndGatherBackTheSameAdapter) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const ModelConfig cfg = ModelConfig::load(kFixtures + "/tiny-qwen3");
    TransformerOptions o;
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.lora.targets = {"all-linear"};
    // The whole adapter: random factors of the single-process model's shapes.
    auto dense = std::make_shared<Transformer>(cfg, ParallelState::single(), o);
    TensorMap whole;
    uint64_t seed = 3;
    for (const auto& [name, t] : dense->lora_params())
      whole.emplace(name, test::seeded_randn(t.sizes(), seed++));
    PeftAdapter adapter;
    adapter.lora = o.lora;
    adapter.weights = lora_shards_to_peft({{whole}}, cfg, o.lora, {cfg.num_layers});

    const std::vector<int64_t> split = {3, 1};
    ParallelConfig pc;
    pc.tp = 2;
    pc.pp = 2;
    pc.layer_split = split;
    auto ps = ParallelState::create(store, rank, pc);
    auto model = std::make_shared<Transformer>(cfg, ps, o);
    copy_peft_adapter(adapter, cfg, o.lora, model->shard_spec(), model->lora_params());
    const int64_t k = ps->coords().tp, p = ps->coords().pp;
    TensorMap mine;
    for (const auto& [name, t] : model->lora_params()) {
      const at::Tensor& full = whole.at(name);
      const bool row = name.find(".o_proj.") != std::string::npos ||
                       name.find(".down_proj.") != std::string::npos;
      at::Tensor want = full;
      if (row && name.ends_with(".A"))
        want = full.narrow(1, k * full.size(1) / 2, full.size(1) / 2);
      if (!row && name.ends_with(".B"))
        want = full.narrow(0, k * full.size(0) / 2, full.size(0) / 2);
      EXPECT_TRUE(at::equal(t, want)) << "rank " << rank << " " << name;
      mine.emplace(name, t.detach());
    }
    EXPECT_EQ(mine.size(), static_cast<size_t>(14 * split[p]));

    // Rank 0 picks the directory and tells the others through the store.
    if (rank == 0) {
      const std::string d =
          (std::filesystem::temp_directory_path() / ("baton_peft_tp_" + std::to_string(::getpid())))
              .string();
      baton::remove_tree(d);
      std::filesystem::create_directories(d);
      store->set("peft_dir", std::vector<uint8_t>(d.begin(), d.end()));
    }
    const auto bytes = store->get("peft_dir");
    const std::filesystem::path dir(std::string(bytes.begin(), bytes.end()));
    write_sharded_rank(dir, k, p, mine);
    ps->world().pg->barrier()->wait();
    if (rank != 0) return;
    std::vector<std::vector<TensorMap>> shards(2);
    for (int64_t stage = 0; stage < 2; ++stage)
      for (int64_t t = 0; t < 2; ++t)
        shards[stage].push_back(read_safetensors(dir / sharded_rank_file(t, stage)));
    const TensorMap back = lora_shards_to_peft(shards, cfg, o.lora, split);
    EXPECT_EQ(back.size(), adapter.weights.size());
    for (const auto& [name, t] : adapter.weights) {
      ASSERT_TRUE(back.count(name)) << name;
      EXPECT_TRUE(at::equal(back.at(name), t)) << name;
    }
    // A shard without one of its tensors is named with its rank.
    shards[1][1].erase("decoder.layers.3.lora.v_proj.B");
    try {
      lora_shards_to_peft(shards, cfg, o.lora, split);
      ADD_FAILURE() << "a shard lacking a tensor was accepted";
    } catch (const EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("shard (tp rank 1, pp stage 1)"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("missing tensors: decoder.layers.3.lora.v_proj.B"),
                std::string::npos)
          << e.what();
    }
    baton::remove_tree(dir);
  });
}

}  // namespace
}  // namespace baton::engine
