// TP / PP / DP / sequence-parallel runs of the model over real Gloo process
// groups against the single-process model in the same process: logits,
// gradients (after the optimizer's reduction) and twenty training steps.
// Tolerances: a layout sums the same terms in other orders (TP partial sums,
// DP all-reduce), so each comparison allows the rounding of the chain behind
// the value (model_tolerance.h) at the scale of what is compared.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/atomic_file.h"
#include "engine/errors.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/parallel/shm_group.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/multiprocess.h"
#include "tests/file_faults.h"

namespace baton::engine {
namespace {

using test::expect_close;
using test::expect_near;
using test::max_abs;
using test::run_world;
using test::Tolerance;

const std::string kFixtures = BATON_FIXTURES_DIR;

struct Layout {
  std::string fixture;
  int64_t tp = 1, pp = 1, dp = 1;
  bool sequence_parallel = false;
  std::vector<int64_t> split;  // empty: even
  bool recompute = false;
  int64_t ep = 1;  // expert parallel ranks, carved from dp

  explicit Layout(std::string f, int64_t tp_ = 1, int64_t pp_ = 1, int64_t dp_ = 1)
      : fixture(std::move(f)), tp(tp_), pp(pp_), dp(dp_) {}
  Layout with_ep(int64_t n) const {
    Layout l = *this;
    l.ep = n;
    return l;
  }
  Layout with_sequence_parallel() const {
    Layout l = *this;
    l.sequence_parallel = true;
    return l;
  }
  Layout with_split(std::vector<int64_t> s) const {
    Layout l = *this;
    l.split = std::move(s);
    return l;
  }
  Layout with_recompute() const {
    Layout l = *this;
    l.recompute = true;
    return l;
  }
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.fixture << " tp" << l.tp << " pp" << l.pp << " dp" << l.dp
      << (l.sequence_parallel ? " sp" : "") << (l.recompute ? " recompute" : "")
      << (l.ep > 1 ? " ep" + std::to_string(l.ep) : "");
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  const Layout& l = info.param;
  std::string n = l.fixture.substr(5) + "_tp" + std::to_string(l.tp) + "_pp" +
                  std::to_string(l.pp) + "_dp" + std::to_string(l.dp);
  for (char& c : n)
    if (c == '-') c = '_';  // gtest names: letters, digits and underscores
  if (l.sequence_parallel) n += "_sp";
  if (l.recompute) n += "_recompute";
  if (l.ep > 1) n += "_ep" + std::to_string(l.ep);
  for (auto s : l.split) n += "_" + std::to_string(s);
  return n;
}

// Four rows of the fixture's length (10 or 16 tokens): its two (row 1
// left-padded) and two seeded random rows (one left-padded by 2).
struct Batch {
  at::Tensor ids, pos, mask, loss_mask;
};

Batch make_batch(const TensorMap& ref, int64_t vocab) {
  const int64_t seq = ref.at("input_ids").size(1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto extra = at::randint(1, vocab, {2, seq}, gen, at::kLong);
  auto extra_mask = at::ones({2, seq}, at::kLong);
  extra_mask.narrow(0, 1, 1).narrow(1, 0, 2).zero_();
  Batch b;
  b.ids = at::cat({ref.at("input_ids"), extra});
  b.mask = at::cat({ref.at("attention_mask"), extra_mask});
  b.pos = (b.mask.cumsum(1) - 1).clamp_min(0);
  auto m = b.mask.to(at::kFloat);
  b.loss_mask = m.narrow(1, 0, seq - 1) * m.narrow(1, 1, seq - 1);
  return b;
}

std::vector<MicroBatch> micro_batches(const Batch& b, int64_t begin, int64_t end) {
  std::vector<MicroBatch> out;
  for (int64_t r = begin; r < end; ++r) {
    MicroBatch mb;
    mb.input_ids = b.ids.narrow(0, r, 1);
    mb.position_ids = b.pos.narrow(0, r, 1);
    mb.attention_mask = b.mask.narrow(0, r, 1);
    mb.extra["loss_mask"] = b.loss_mask.narrow(0, r, 1);
    out.push_back(mb);
  }
  return out;
}

std::shared_ptr<Transformer> build(const ModelConfig& cfg, const TensorMap& hf,
                                   std::shared_ptr<ParallelState> ps, const Layout& l) {
  auto model = std::make_shared<Transformer>(cfg, ps,
                                             TransformerOptions()
                                                 .set_sequence_parallel(l.sequence_parallel)
                                                 .set_recompute_activations(l.recompute));
  model->load_state_dict(hf_to_shard(hf, cfg, model->shard_spec()));
  return model;
}

class ParallelModel : public ::testing::TestWithParam<Layout> {};

TEST_P(ParallelModel, MatchesTheSingleProcessModel) {
  Layout l = GetParam();
  run_world(l.tp * l.pp * l.dp, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto dir = kFixtures + "/" + l.fixture;
    auto cfg = ModelConfig::load(dir);
    auto hf = read_hf_weights(dir);
    auto batch = make_batch(read_safetensors(dir + "/reference.safetensors"), cfg.vocab_size);
    ParallelConfig pc;
    pc.tp = l.tp;
    pc.pp = l.pp;
    pc.dp = l.dp;
    pc.layer_split = l.split;
    pc.ep = l.ep;
    auto ps = ParallelState::create(store, rank, pc);
    auto model = build(cfg, hf, ps, l);
    auto dense = build(cfg, hf, ParallelState::single(), Layout(l.fixture));
    const Group& tp = ps->tp();
    int64_t rows = batch.ids.size(0) / l.dp;
    int64_t row0 = ps->coords().dp * rows;
    auto mbs = micro_batches(batch, row0, row0 + rows);
    auto dense_mbs = micro_batches(batch, 0, batch.ids.size(0));
    double tokens = batch.loss_mask.sum().item<double>();

    // 1. Logits: this rank's vocabulary shard of its rows.
    auto outs = forward_only(*model, mbs, [](const at::Tensor& o, const MicroBatch&) { return o; });
    if (ps->is_last_stage()) {
      ASSERT_EQ(outs.size(), mbs.size());
      auto full = dense->forward(batch.ids, batch.pos, batch.mask).detach();
      const Tolerance tol =
          Tolerance::fp32(test::logit_terms(cfg, batch.ids.size(1)), max_abs(full, batch.mask));
      // This rank's real vocabulary columns; its padding columns hold -inf
      // (at tp 2 the 128 tokens pad to 256: rank 1 holds padding only).
      const VocabShard v = model->vocab_shard();
      for (size_t i = 0; i < outs.size(); ++i) {
        auto expected =
            full.narrow(0, row0 + i, 1).narrow(2, std::min(v.begin, full.size(2)), v.real);
        expect_close(outs[i].narrow(2, 0, v.real), expected, tol,
                     "rank " + std::to_string(rank) + " micro-batch " + std::to_string(i),
                     mbs[i].attention_mask);
        EXPECT_TRUE(outs[i].narrow(2, v.real, v.padding()).isneginf().all().item<bool>());
      }
    } else {
      EXPECT_TRUE(outs.empty());
    }

    // 2. Gradients of the token-mean loss over the whole batch.
    auto loss_fn = [&](const Group& g) {
      return [&, g](const at::Tensor& logits, const MicroBatch& mb) {
        auto lp = next_token_log_probs(logits, mb.input_ids, g);
        return -(lp * mb.extra.at("loss_mask")).sum() / tokens;
      };
    };
    OptimizerOptions oo;
    oo.lr = 1e-3;
    Optimizer opt(model, oo);
    Optimizer dense_opt(dense, oo);
    forward_backward(*model, mbs, loss_fn(tp));
    forward_backward(*dense, dense_mbs, loss_fn(dense->parallel().tp()));
    opt.reduce_gradients();
    TensorMap dense_grads;
    for (const auto& [name, p] : dense->named_params()) dense_grads[name] = p.grad();
    auto hf_grads = shards_to_hf({{dense_grads}}, cfg, {cfg.num_layers}, false);
    auto expected = hf_to_shard(hf_grads, cfg, model->shard_spec());
    // Forward, backward, the sum over the batch's positions and over dp.
    const int64_t seq = batch.ids.size(1);
    const double grad_terms =
        test::gradient_terms(cfg, seq, static_cast<int64_t>(tokens)) + static_cast<double>(l.dp);
    for (const auto& [name, p] : model->named_params()) {
      ASSERT_TRUE(expected.count(name)) << name;
      expect_close(p.grad(), expected.at(name),
                   Tolerance::fp32(grad_terms, max_abs(expected.at(name))),
                   "rank " + std::to_string(rank) + " " + name);
    }
    // The norm's square sums every parameter's squared gradient: a relative
    // error of the gradients' plus that of a sum of as many terms.
    double params = 0;
    for (const auto& [name, p] : dense->named_params()) params += static_cast<double>(p.numel());
    expect_near(opt.global_grad_norm(), dense_opt.global_grad_norm(),
                Tolerance::fp32(grad_terms + params, dense_opt.global_grad_norm()),
                "global grad norm");

    // 3. Twenty training steps give the same losses. The loss after k steps
    // carries its own rounding (a mean of log-probs) and the parameters'
    // drift: gradients off by a relative r (grad_terms) move each AdamW
    // update by up to 2·r·lr (its first moment over the root of its second,
    // each off by r), so after k steps each parameter is off by up to
    // 2·k·r·lr, in directions as independent as the rounding errors behind
    // them. The loss moves by about that times ‖∇loss‖₂; 6 times that is the
    // bound, as in Tolerance::fp32. The loss's own rounding is at the scale
    // of the current logits, which grow as training goes on.
    const double r = Tolerance::fp32(grad_terms, 1).rtol;
    opt.zero_grad();
    dense_opt.zero_grad();
    for (int step = 0; step < 20; ++step) {
      opt.zero_grad();
      auto losses = forward_backward(*model, mbs, loss_fn(tp));
      opt.step();
      dense_opt.zero_grad();
      auto dense_losses = forward_backward(*dense, dense_mbs, loss_fn(dense->parallel().tp()));
      double grad_sq = 0;
      for (const auto& [name, p] : dense->named_params())
        grad_sq += p.grad().square().sum().item<double>();
      double logit_scale;
      {
        at::NoGradGuard no_grad;
        logit_scale = max_abs(dense->forward(batch.ids, batch.pos, batch.mask), batch.mask);
      }
      const Tolerance loss_tol =
          Tolerance::fp32(test::log_prob_terms(cfg, seq) + tokens, logit_scale);
      dense_opt.step();
      auto local = at::zeros({1});
      for (auto& x : losses) local += x;
      if (ps->dp().size > 1) {
        std::vector<at::Tensor> ts{local};
        ps->dp().pg->allreduce(ts)->wait();
      }
      double want = 0;
      for (auto& x : dense_losses) want += x.item<double>();
      if (ps->is_last_stage())
        expect_near(
            local.item<double>(), want,
            Tolerance{loss_tol.atol + 6 * 2 * step * r * oo.lr * std::sqrt(grad_sq), loss_tol.rtol},
            "step " + std::to_string(step));
    }
  });
}

// Save at step 2 of a pp2 x dp2 run with tied embeddings, resume in fresh
// models and optimizers: steps 3 and 4 give exactly the uninterrupted losses.
TEST(ParallelCheckpoint, ResumeIsExactOnAPp2Dp2Layout) {
  Layout l("tiny-qwen2", 1, 2, 2);
  run_world(4, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto dir = kFixtures + "/" + l.fixture;
    auto cfg = ModelConfig::load(dir);
    auto hf = read_hf_weights(dir);
    auto batch = make_batch(read_safetensors(dir + "/reference.safetensors"), cfg.vocab_size);
    double tokens = batch.loss_mask.sum().item<double>();
    ParallelConfig pc;
    pc.pp = 2;
    pc.dp = 2;
    auto ps = ParallelState::create(store, rank, pc);
    int64_t row0 = ps->coords().dp * 2;
    auto mbs = micro_batches(batch, row0, row0 + 2);
    const Group& tp = ps->tp();
    auto loss = [&](const at::Tensor& logits, const MicroBatch& mb) {
      return -(next_token_log_probs(logits, mb.input_ids, tp) * mb.extra.at("loss_mask")).sum() /
             tokens;
    };
    auto train = [&](Transformer& m, Optimizer& o) {
      o.zero_grad();
      auto losses = forward_backward(m, mbs, loss);
      o.step();
      double sum = 0;
      for (auto& x : losses) sum += x.item<double>();
      return sum;
    };
    OptimizerOptions oo;
    oo.lr = 1e-3;
    // Rank 0 picks the directory and tells the others through the store.
    if (rank == 0) {
      auto d =
          std::filesystem::temp_directory_path() / ("baton_ckpt_" + std::to_string(::getpid()));
      std::string s = d.string();
      store->set("ckpt_dir", std::vector<uint8_t>(s.begin(), s.end()));
    }
    auto bytes = store->get("ckpt_dir");
    std::string root(bytes.begin(), bytes.end());
    std::vector<double> straight;
    {
      auto m = build(cfg, hf, ps, l);
      Optimizer o(m, oo);
      for (int i = 0; i < 4; ++i) straight.push_back(train(*m, o));
    }
    {
      auto m = build(cfg, hf, ps, l);
      Optimizer o(m, oo);
      for (int i = 0; i < 2; ++i) EXPECT_EQ(train(*m, o), straight[i]);
      save_checkpoint(root, 2, *m, o);
    }
    auto m = build(cfg, hf, ps, l);
    for (auto& [name, p] : m->named_params()) {
      at::NoGradGuard g;
      p.zero_();  // nothing of the fresh model survives but what is loaded
    }
    Optimizer o(m, oo);
    load_checkpoint(root, *m, o);
    for (int i = 2; i < 4; ++i) EXPECT_EQ(train(*m, o), straight[i]) << "step " << i;
    ps->world().pg->barrier()->wait();
    if (rank == 0) baton::remove_tree(root);
  });
}

// A save that fails on one rank only (a file-size limit on rank 1; a full
// disk fails the same way) fails on both, rank 1 naming its file and rank 0
// the other rank, none waiting for the other; rank 0 removes the partial
// directory and `latest` still names the previous checkpoint, which loads.
TEST(ParallelCheckpoint, ASaveThatFailsOnOneRankFailsOnEveryRankAndKeepsThePrevious) {
  Layout l("tiny-qwen2", 2);
  run_world(2, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto dir = kFixtures + "/" + l.fixture;
    auto cfg = ModelConfig::load(dir);
    auto hf = read_hf_weights(dir);
    ParallelConfig pc;
    pc.tp = 2;
    auto ps = ParallelState::create(store, rank, pc);
    if (rank == 0) {
      auto d = std::filesystem::temp_directory_path() /
               ("baton_ckpt_full_" + std::to_string(::getpid()));
      std::string s = d.string();
      store->set("ckpt_dir", std::vector<uint8_t>(s.begin(), s.end()));
    }
    auto bytes = store->get("ckpt_dir");
    const std::string root(bytes.begin(), bytes.end());
    auto m = build(cfg, hf, ps, l);
    Optimizer o(m, OptimizerOptions());
    save_checkpoint(root, 1, *m, o);
    {
      std::optional<baton::testing::FileSizeLimit> full;
      if (rank == 1) full.emplace(4096);
      try {
        save_checkpoint(root, 2, *m, o);
        ADD_FAILURE() << "rank " << rank << ": the save succeeded";
      } catch (const EngineError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(root + "/latest still names step 1"), std::string::npos) << what;
        if (rank == 1) {
          EXPECT_NE(what.find("step_00000002.partial/model-tp1-pp0.safetensors: write failed"),
                    std::string::npos)
              << what;
        } else {
          EXPECT_NE(what.find("1 other rank(s) failed"), std::string::npos) << what;
        }
      }
    }
    if (rank == 0) {
      EXPECT_FALSE(std::filesystem::exists(root + "/step_00000002.partial"));
      EXPECT_FALSE(std::filesystem::exists(root + "/step_00000002"));
      EXPECT_EQ(latest_checkpoint(root), 1);
    }
    load_checkpoint(root, *m, o);
    ps->world().pg->barrier()->wait();
    if (rank == 0) baton::remove_tree(root);
  });
}

// The critic's model over TP2 x PP2: the value head lives only on the last
// stage, and the values equal the single-process value model's (which
// matches HF's token classification, see transformer_test).
// LoRA adapters split over TP2 as their layers are (lora.h): with the same
// full adapters, the TP2 model's logits, each rank's adapter gradients (its
// slice of the single-process ones) and its merged weights (its shard of the
// single-process merge) match. The adapters get random values first, so that
// A's gradients are not zero (a fresh B is).
TEST(ParallelLora, AdaptersSplitOverTp2MatchTheSingleProcessModel) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const std::string dir = kFixtures + "/tiny-qwen3";
    const ModelConfig cfg = ModelConfig::load(dir);
    const TensorMap hf = read_hf_weights(dir);
    const TensorMap ref = read_safetensors(dir + "/reference.safetensors");
    TransformerOptions o;
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.lora.targets = {"all-linear"};
    ParallelConfig pc;
    pc.tp = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto model = std::make_shared<Transformer>(cfg, ps, o);
    auto dense = std::make_shared<Transformer>(cfg, ParallelState::single(), o);
    const auto split = even_layer_split(cfg.num_layers, 1);
    model->load_state_dict(hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, rank, 2, 0, split)));
    dense->load_state_dict(hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, split)));
    // Full adapters, and this rank's slice of each: a column layer's B rows,
    // a row layer's A columns; the other factor whole.
    auto slice = [&](const std::string& name, const at::Tensor& full) {
      const bool row = name.find(".o_proj.") != std::string::npos ||
                       name.find(".down_proj.") != std::string::npos;
      if (row && name.ends_with(".A"))
        return full.narrow(1, rank * full.size(1) / 2, full.size(1) / 2);
      if (!row && name.ends_with(".B"))
        return full.narrow(0, rank * full.size(0) / 2, full.size(0) / 2);
      return full;
    };
    std::map<std::string, at::Tensor> dense_state = dense->state_dict(),
                                      state = model->state_dict();
    uint64_t seed = 5;
    for (const auto& [name, t] : dense->lora_params()) {
      const at::Tensor full = test::seeded_randn(t.sizes(), seed++) * 0.1;
      dense_state[name] = full;
      state[name] = slice(name, full).contiguous();
    }
    dense->load_state_dict(dense_state);
    model->load_state_dict(state);

    auto loss = [&](Transformer& m) {
      const at::Tensor logits =
          m.forward(ref.at("input_ids"), ref.at("position_ids"), ref.at("attention_mask"));
      const at::Tensor lp = next_token_log_probs(logits, ref.at("input_ids"), m.parallel().tp());
      const at::Tensor mask = ref.at("response_mask").to(at::kFloat);
      return std::make_pair(logits, -(lp * mask).sum() / mask.sum());
    };
    auto [logits, l] = loss(*model);
    auto [dense_logits, dl] = loss(*dense);
    const int64_t seq = ref.at("input_ids").size(1);
    const at::Tensor& mask = ref.at("attention_mask");
    const VocabShard v = model->vocab_shard();
    expect_close(logits.narrow(2, 0, v.real).detach(),
                 dense_logits.narrow(2, std::min(v.begin, dense_logits.size(2)), v.real).detach(),
                 Tolerance::fp32(test::logit_terms(cfg, seq), max_abs(dense_logits, mask)),
                 "logits", mask);
    l.backward();
    dl.backward();
    const double tokens = ref.at("response_mask").sum().item<double>();
    std::map<std::string, at::Tensor> dense_grads;
    for (const auto& [name, p] : dense->lora_params()) dense_grads[name] = p.grad();
    int checked = 0;
    for (const auto& [name, p] : model->lora_params()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      const at::Tensor want = slice(name, dense_grads.at(name));
      expect_close(p.grad(), want,
                   Tolerance::fp32(test::gradient_terms(cfg, seq, static_cast<int64_t>(tokens)),
                                   max_abs(want)),
                   "rank " + std::to_string(rank) + " " + name);
      ++checked;
    }
    EXPECT_EQ(checked, 14 * cfg.num_layers);
    // Merged weights: this rank's shard of the single-process merge.
    TensorMap dense_merged;
    for (const auto& [name, t] : dense->merged_params()) dense_merged[name] = t;
    const TensorMap want = hf_to_shard(shards_to_hf({{dense_merged}}, cfg, split, false), cfg,
                                       ShardSpec::for_rank(cfg, rank, 2, 0, split));
    for (const auto& [name, t] : model->merged_params())
      expect_close(t, want.at(name), Tolerance::fp32(8, max_abs(want.at(name))), name);
  });
}

TEST(ParallelValueModel, HeadOnlyOnTheLastStageAndValuesMatch) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    auto dir = kFixtures + "/tiny-qwen2-value";
    auto cfg = ModelConfig::load(dir);
    auto hf = read_hf_weights(dir);
    auto batch = make_batch(read_safetensors(kFixtures + "/tiny-qwen2/reference.safetensors"),
                            cfg.vocab_size);
    ParallelConfig pc;
    pc.tp = 2;
    pc.pp = 2;
    auto ps = ParallelState::create(store, rank, pc);
    auto value = TransformerOptions().set_value_model(true);
    auto model = std::make_shared<Transformer>(cfg, ps, value);
    model->load_state_dict(hf_to_shard(
        hf, cfg, ShardSpec::for_rank(cfg, ps->coords().tp, 2, ps->coords().pp, {2, 2}, true)));
    bool has_head = false, has_lm_head = false;
    for (const auto& [name, p] : model->named_params()) {
      has_head |= name.rfind("value_head.", 0) == 0;
      has_lm_head |= name == "output_layer.weight";
    }
    EXPECT_EQ(has_head, ps->is_last_stage());
    EXPECT_FALSE(has_lm_head);

    auto dense = std::make_shared<Transformer>(cfg, ParallelState::single(), value);
    dense->load_state_dict(
        hf_to_shard(hf, cfg, ShardSpec::for_rank(cfg, 0, 1, 0, {cfg.num_layers}, true)));
    auto expected = dense->forward(batch.ids, batch.pos, batch.mask).detach();
    auto mbs = micro_batches(batch, 0, batch.ids.size(0));
    auto outs = forward_only(*model, mbs, [](const at::Tensor& v, const MicroBatch&) { return v; });
    if (!ps->is_last_stage()) return;
    ASSERT_EQ(outs.size(), mbs.size());
    // The value head sums as many terms as an LM head; values are O(1).
    const Tolerance tol = Tolerance::fp32(test::logit_terms(cfg, batch.ids.size(1)),
                                          std::max(1.0, max_abs(expected, batch.mask)));
    for (size_t i = 0; i < outs.size(); ++i) {
      ASSERT_EQ(outs[i].sizes(), (at::IntArrayRef{1, 10, 1}));
      expect_close(outs[i], expected.narrow(0, i, 1), tol, "row " + std::to_string(i),
                   mbs[i].attention_mask);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ParallelModel,
    ::testing::Values(Layout("tiny-llama", 2, 1, 1), Layout("tiny-qwen2", 2, 1, 1),
                      Layout("tiny-llama", 2, 1, 1).with_sequence_parallel(),
                      Layout("tiny-llama", 1, 2, 1).with_split({3, 1}),
                      Layout("tiny-qwen2", 1, 2, 1), Layout("tiny-qwen2", 2, 2, 1),
                      Layout("tiny-llama", 1, 1, 2), Layout("tiny-llama", 2, 2, 2),
                      // Four stages, four micro-batches: warm-ups of 3, 2, 1, 0
                      // forwards around the steady 1F1B phase.
                      Layout("tiny-llama", 1, 4, 1),
                      Layout("tiny-qwen2", 2, 2, 1).with_sequence_parallel().with_recompute(),
                      // Qwen3's per-head q/k norms (their gradients summed over
                      // the TP ranks' heads), Mistral, a scaled RoPE.
                      Layout("tiny-qwen3", 2, 1, 1), Layout("tiny-qwen3", 1, 2, 1),
                      Layout("tiny-qwen3", 2, 1, 1).with_sequence_parallel(),
                      Layout("tiny-llama3-rope", 2, 2, 1), Layout("tiny-mistral", 2, 1, 1),
                      // Qwen3-MoE: experts split over TP, a dense first stage.
                      Layout("tiny-qwen3-moe", 2, 1, 1), Layout("tiny-qwen3-moe", 1, 2, 1),
                      Layout("tiny-qwen3-moe", 2, 1, 1).with_sequence_parallel(),
                      // Expert parallelism: tokens to their experts' ranks and
                      // back by all-to-all, composed with TP (and SP) and PP.
                      Layout("tiny-qwen3-moe", 1, 1, 2).with_ep(2),
                      Layout("tiny-qwen3-moe", 2, 1, 2).with_ep(2).with_sequence_parallel(),
                      Layout("tiny-qwen3-moe", 1, 2, 2).with_ep(2)),
    layout_name);

// One rank of a DP layout on a fixture: the model's config and weights, the
// reference batch, this DP rank's rows as one micro-batch each, and the
// token-mean loss over the whole batch (summed over DP ranks).
struct DpRank {
  ModelConfig cfg;
  TensorMap hf;
  Batch batch;
  double tokens = 0;
  std::shared_ptr<ParallelState> ps;
  std::vector<MicroBatch> mbs;

  DpRank(const Layout& l, int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const std::string dir = kFixtures + "/" + l.fixture;
    cfg = ModelConfig::load(dir);
    hf = read_hf_weights(dir);
    batch = make_batch(read_safetensors(dir + "/reference.safetensors"), cfg.vocab_size);
    tokens = batch.loss_mask.sum().item<double>();
    ParallelConfig pc;
    pc.tp = l.tp;
    pc.pp = l.pp;
    pc.dp = l.dp;
    ps = ParallelState::create(std::move(store), rank, pc);
    const int64_t rows = batch.ids.size(0) / l.dp, row0 = ps->coords().dp * rows;
    mbs = micro_batches(batch, row0, row0 + rows);
  }
  LossFn loss() const {
    const Group* tp = &ps->tp();
    const double n = tokens;
    return [tp, n](const at::Tensor& logits, const MicroBatch& mb) {
      return -(next_token_log_probs(logits, mb.input_ids, *tp) * mb.extra.at("loss_mask")).sum() /
             n;
    };
  }
};

// The distributed optimizer (ZeRO-1) against the plain one in the same
// layout and process, three steps from the same weights on the same batch.
// Both reduce the same gradients (over two DP ranks a sum is one addition,
// the same either way) and run the same AdamW arithmetic; they differ in the
// order the global norm's double sum takes, so the clipping factor and the
// gradients after it may differ by the relative rounding r of the
// gradients' chain, and each step moves a parameter by at most 2·r·lr more.
// One exception: the key part of a fused QKV bias (Qwen2). Its gradient is
// zero in exact arithmetic (adding q·b_k to every score of a softmax row
// changes nothing), so the backward gives rounding noise there, and AdamW,
// which divides by the gradient's own scale, turns noise into steps of up to
// lr·(1-β1)/sqrt(1-β2) (3.2·lr here) whose sign depends on the summation
// order. Those elements are held to that bound, per step and per optimizer.
Tolerance plus(Tolerance a, Tolerance b) { return {a.atol + b.atol, a.rtol + b.rtol}; }

// True at the key-bias elements of a rank's fused QKV bias: per kv group,
// r query heads, then the key head, then the value head (docs/engine.md).
at::Tensor key_bias_mask(const ModelConfig& cfg, int64_t tp) {
  const int64_t groups = cfg.num_kv_heads / tp, r = cfg.num_heads / cfg.num_kv_heads;
  auto mask = at::zeros({groups, r + 2, cfg.head_dim}, at::kBool);
  mask.select(1, r).fill_(true);
  return mask.view({-1});
}

struct ZeroCase {
  Layout layout;
  bool shared_memory = true;
};

void PrintTo(const ZeroCase& c, std::ostream* os) {
  PrintTo(c.layout, os);
  *os << (c.shared_memory ? " shm" : " gloo");
}

class DistributedOptimizer : public ::testing::TestWithParam<ZeroCase> {};

TEST_P(DistributedOptimizer, MatchesThePlainOptimizerAndShardsItsState) {
  const ZeroCase zc = GetParam();
  const Layout l = zc.layout;
  run_world(l.tp * l.pp * l.dp, [l, zc](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const DpRank d(l, rank, store);
    const auto& [cfg, hf, batch, tokens, ps, mbs] =
        std::tie(d.cfg, d.hf, d.batch, d.tokens, d.ps, d.mbs);
    const LossFn loss = d.loss();
    OptimizerOptions oo;
    oo.lr = 1e-3;
    oo.clip_grad = 0.5;
    oo.weight_decay = 0.1;
    OptimizerOptions zo = oo;
    zo.distributed = true;
    zo.shared_memory = zc.shared_memory;
    auto plain = build(cfg, hf, ps, l), zero = build(cfg, hf, ps, l);
    Optimizer plain_opt(plain, oo), zero_opt(zero, zo);
    EXPECT_EQ(zero_opt.shared_memory_collectives(), zc.shared_memory);
    // Moments sharded over two ranks: half the plain state per rank; through
    // Gloo the shard's reduced gradients (another quarter) come on top. The
    // flat buffers pad to a multiple of dp elements.
    EXPECT_LE(zero_opt.state_bytes(),
              plain_opt.state_bytes() * (zc.shared_memory ? 2 : 3) / 4 + 16 * l.dp);
    const int64_t seq = batch.ids.size(1);
    const double r = Tolerance::fp32(test::gradient_terms(cfg, seq, static_cast<int64_t>(tokens)) +
                                         static_cast<double>(l.dp),
                                     1)
                         .rtol;
    for (int step = 1; step <= 3; ++step) {
      for (auto [m, o] : {std::pair{plain, &plain_opt}, std::pair{zero, &zero_opt}}) {
        o->zero_grad();
        forward_backward(*m, mbs, loss);
      }
      const StepStats a = plain_opt.step(), b = zero_opt.step();
      expect_near(b.grad_norm, a.grad_norm,
                  plus(Tolerance::fp32(2 * step, a.grad_norm), Tolerance{0, r}),
                  "grad norm, step " + std::to_string(step));
      ASSERT_GT(a.grad_norm, oo.clip_grad) << "clipping was meant to be active";
      auto zp = zero->named_params();
      auto pp = plain->named_params();
      for (size_t i = 0; i < pp.size(); ++i) {
        at::Tensor want = pp[i].second.detach().clone(), got = zp[i].second.detach().clone();
        const std::string what =
            "rank " + std::to_string(rank) + " " + pp[i].first + " step " + std::to_string(step);
        if (pp[i].first.find("linear_qkv.bias") != std::string::npos) {
          const at::Tensor keys = key_bias_mask(cfg, l.tp);
          const double adam_step = oo.lr * (1 - 0.9) / std::sqrt(1 - 0.999);
          expect_close(got.masked_select(keys), want.masked_select(keys),
                       Tolerance{2 * step * adam_step, 0}, what + " (key bias)");
          got.masked_fill_(keys, 0);
          want.masked_fill_(keys, 0);
        }
        expect_close(got, want,
                     plus(Tolerance{6 * 2 * step * r * oo.lr, test::kFp32Eps},
                          Tolerance::fp32(1, max_abs(want))),
                     what);
      }
    }
    // The full state, gathered (collective); the moments follow the same
    // drift bound scaled to their size.
    auto plain_state = plain_opt.state_dict();
    auto zero_state = zero_opt.state_dict();
    ASSERT_EQ(zero_state.size(), plain_state.size());
    for (const auto& [key, want] : plain_state) {
      ASSERT_TRUE(zero_state.count(key)) << key;
      if (key == "step") {
        EXPECT_EQ(zero_state.at(key).item<int64_t>(), 3);
        continue;
      }
      expect_close(zero_state.at(key), want,
                   plus(Tolerance::fp32(6, max_abs(want)), Tolerance{0, 6 * r}), key);
    }
    // Checkpoints are interchangeable: a distributed optimizer loads the
    // plain one's state and gives it back unchanged.
    auto fresh = build(cfg, hf, ps, l);
    Optimizer loaded(fresh, zo);
    loaded.load_state_dict(plain_state);
    for (const auto& [key, t] : loaded.state_dict())
      expect_close(t, plain_state.at(key), Tolerance::exact(), "reloaded " + key);
    // A missing entry is named on every rank.
    auto broken = plain_state;
    broken.erase("exp_avg_sq." + plain->named_params().back().first);
    try {
      loaded.load_state_dict(broken);
      ADD_FAILURE() << "a missing entry was accepted";
    } catch (const EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("missing exp_avg_sq."), std::string::npos) << e.what();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DistributedOptimizer,
    ::testing::Values(ZeroCase{Layout("tiny-qwen2", 1, 1, 2), true},
                      ZeroCase{Layout("tiny-qwen2", 1, 1, 2), false},
                      ZeroCase{Layout("tiny-qwen2", 1, 2, 2), true},
                      ZeroCase{Layout("tiny-llama", 2, 1, 2).with_sequence_parallel(), true}),
    [](const ::testing::TestParamInfo<ZeroCase>& info) {
      return layout_name(::testing::TestParamInfo<Layout>(info.param.layout, info.index)) +
             (info.param.shared_memory ? "_shm" : "_gloo");
    });

// The overlapped DP reduction against the blocking one, in the same layout
// and process: three steps of two micro-batches per rank from the same
// weights. Both sum each gradient over the two DP ranks first (one addition,
// the same whichever bucket carries it), then over TP / the tied embedding
// in the same calls, so every gradient, norm and parameter is exactly equal.
// Small buckets make several; every one starts during the last
// micro-batch's backward.
class OverlappedGradReduce : public ::testing::TestWithParam<Layout> {};

TEST_P(OverlappedGradReduce, StartsInTheBackwardAndMatchesTheBlockingReduction) {
  const Layout l = GetParam();
  run_world(l.tp * l.pp * l.dp, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const DpRank d(l, rank, store);
    const auto& [cfg, hf, batch, tokens, ps, mbs] =
        std::tie(d.cfg, d.hf, d.batch, d.tokens, d.ps, d.mbs);
    const LossFn loss = d.loss();
    ASSERT_GE(mbs.size(), 2u);
    OptimizerOptions bo;
    bo.lr = 1e-3;
    bo.clip_grad = 0.5;
    bo.weight_decay = 0.1;
    OptimizerOptions oo = bo;
    oo.overlap_grad_reduce = true;
    oo.bucket_bytes = 16 << 10;
    auto blocking = build(cfg, hf, ps, l), overlapped = build(cfg, hf, ps, l);
    Optimizer blocking_opt(blocking, bo), overlapped_opt(overlapped, oo);
    EXPECT_EQ(blocking_opt.grad_buckets(), 0);
    ASSERT_GT(overlapped_opt.grad_buckets(), 2);
    const std::string where = "rank " + std::to_string(rank);
    for (int step = 1; step <= 3; ++step) {
      for (auto [m, o] :
           {std::pair{blocking, &blocking_opt}, std::pair{overlapped, &overlapped_opt}}) {
        o->zero_grad();
        forward_backward(*m, mbs, loss);
      }
      const StepStats a = blocking_opt.step(), b = overlapped_opt.step();
      EXPECT_EQ(overlapped_opt.buckets_started_in_backward(), overlapped_opt.grad_buckets())
          << where << " step " << step;
      EXPECT_EQ(b.grad_norm, a.grad_norm) << where << " step " << step;
      ASSERT_GT(a.grad_norm, bo.clip_grad) << "clipping was meant to be active";
      auto bp = blocking->named_params(), op = overlapped->named_params();
      for (size_t i = 0; i < bp.size(); ++i)
        expect_close(op[i].second.detach(), bp[i].second.detach(), Tolerance::exact(),
                     where + " " + bp[i].first + " step " + std::to_string(step));
    }
    // Gradients made outside forward_backward: nothing started early, the
    // same reduction in step().
    for (auto [m, o] :
         {std::pair{blocking, &blocking_opt}, std::pair{overlapped, &overlapped_opt}}) {
      o->zero_grad();
      for (const auto& [name, p] : m->named_params()) (p * p).sum().backward();
    }
    const StepStats a = blocking_opt.step(), b = overlapped_opt.step();
    EXPECT_EQ(overlapped_opt.buckets_started_in_backward(), 0) << where;
    EXPECT_EQ(b.grad_norm, a.grad_norm) << where;
    // A manual backward after forward_backward adds into buckets already
    // on their way (a layer weight: every stage has one in a bucket):
    // step() waits for them and refuses, by name.
    overlapped_opt.zero_grad();
    forward_backward(*overlapped, mbs, loss);
    for (const auto& [name, p] : overlapped->named_params())
      if (name.find("linear_fc2.weight") != std::string::npos) {
        (p * p).sum().backward();
        break;
      }
    try {
      overlapped_opt.step();
      ADD_FAILURE() << where << ": a backward after forward_backward was accepted";
    } catch (const EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("a backward ran after forward_backward"),
                std::string::npos)
          << e.what();
    }
    // Two forward_backward calls for one step: the second would add to
    // gradients already being reduced; refused on every rank, by name.
    overlapped_opt.zero_grad();
    forward_backward(*overlapped, mbs, loss);
    try {
      forward_backward(*overlapped, mbs, loss);
      ADD_FAILURE() << where << ": a second forward_backward before step() was accepted";
    } catch (const EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("forward_backward ran again before step()"),
                std::string::npos)
          << e.what();
    }
    overlapped_opt.zero_grad();  // waits for the first call's all-reduces
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, OverlappedGradReduce,
                         ::testing::Values(Layout("tiny-qwen2", 1, 1, 2),
                                           Layout("tiny-qwen2", 1, 2, 2),
                                           Layout("tiny-llama", 2, 1, 2).with_sequence_parallel()),
                         layout_name);

// ShmGroup's collectives are exact (sums of two or three values, copies),
// and a peer that exits makes the one waiting for it throw, naming it.
TEST(ShmGroup, ReduceScatterAndAllGatherAndADeadPeer) {
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    ParallelConfig pc;
    pc.dp = 3;
    auto ps = ParallelState::create(store, rank, pc);
    auto shm = ShmGroup::create(ps->dp(), 3 * 5);
    ASSERT_NE(shm, nullptr);
    at::Tensor region = shm->region();
    region.copy_(at::arange(15, at::kFloat) * static_cast<float>(rank + 1));
    at::Tensor shard = at::empty({5});
    shm->reduce_scatter(shard);
    // Σ_r (r + 1) · i = 6 · i over this rank's slice.
    expect_close(shard, at::arange(rank * 5, rank * 5 + 5, at::kFloat) * 6, Tolerance::exact(),
                 "reduce_scatter");
    at::Tensor full = at::empty({15});
    shm->all_gather(shard, full);
    expect_close(full, at::arange(15, at::kFloat) * 6, Tolerance::exact(), "all_gather");
    // Back-to-back sums use alternating slots: none reads another's value.
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(shm->all_reduce_sum(static_cast<double>((rank + 1) * (i + 1))), 6.0 * (i + 1));
    try {
      at::Tensor wrong = at::empty({4});
      shm->reduce_scatter(wrong);
      ADD_FAILURE() << "a wrong-sized output was accepted";
    } catch (const EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("[5]"), std::string::npos) << e.what();
    }
    if (rank == 2) std::_Exit(0);
    try {
      shm->barrier();
      ADD_FAILURE() << "rank " << rank << ": the barrier passed without rank 2";
    } catch (const EngineError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 (pid"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("exited"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("group world/dp/dp_cp"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace baton::engine
