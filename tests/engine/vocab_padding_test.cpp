// Vocabulary padding for tensor parallelism (vocab_padding.h) on a vocabulary
// that no TP size divides: the tiny-llama-v97 fixture (97 tokens; 8 heads over
// 4 KV heads, so that tp 4 splits it). TP 2 and TP 4 layouts padded with
// Megatron's default (make_vocab_size_divisible_by 128: every real row on TP
// rank 0, the other ranks padding only) and with 1 and 8 (real rows on every
// rank, the last one partly padding) must compute the unpadded model:
// log-probs, entropy and a training step equal TP 1 within the rounding of
// the compared quantity (model_tolerance.h), generation picks the same tokens,
// and conversion, resharding and weight sync between layouts that pad
// differently are bit-exact.
#include "engine/parallel/vocab_padding.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/checksum_manifest.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/sharded_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/optim/optimizer.h"
#include "engine/parallel/vocab_parallel.h"
#include "engine/rollout/generation.h"
#include "engine/rollout/hybrid_engine.h"
#include "engine/rollout/reshard.h"
#include "engine/rollout/weight_sync.h"
#include "tests/engine/expect_error.h"
#include "tests/engine/model_tolerance.h"
#include "tests/engine/multiprocess.h"
#include "tests/engine/temp_dir.h"

namespace baton::engine {
namespace {

namespace fs = std::filesystem;
using test::expect_close;
using test::expect_near;
using test::max_abs;
using test::run_world;
using test::Tolerance;
using testing::expect_error;

const fs::path kFixture = fs::path(BATON_FIXTURES_DIR) / "tiny-llama-v97";
constexpr int64_t kVocab = 97;

struct Fixture {
  ModelConfig cfg;
  TensorMap hf;
  TensorMap ref;  // HF's outputs (fixtures/README.md)
};

Fixture fixture() {
  Fixture f{ModelConfig::load(kFixture), read_hf_weights(kFixture),
            read_safetensors(kFixture / "reference.safetensors")};
  EXPECT_EQ(f.cfg.vocab_size, kVocab);
  return f;
}

ParallelConfig layout(int64_t tp, int64_t divisible_by, int64_t pp = 1) {
  ParallelConfig pc;
  pc.tp = tp;
  pc.pp = pp;
  pc.make_vocab_size_divisible_by = divisible_by;
  return pc;
}

std::shared_ptr<Transformer> load(const Fixture& f, std::shared_ptr<ParallelState> ps) {
  auto model = std::make_shared<Transformer>(f.cfg, std::move(ps));
  model->load_state_dict(hf_to_shard(f.hf, f.cfg, model->shard_spec()));
  return model;
}

c10::intrusive_ptr<c10d::Store> prefixed(const std::string& prefix,
                                         c10::intrusive_ptr<c10d::Store> store) {
  return c10::make_intrusive<c10d::PrefixStore>(prefix, std::move(store));
}

bool is_vocab_param(const std::string& name) {
  return name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
}

void expect_exact(const Transformer& model, const TensorMap& expected, const std::string& what) {
  auto got = model.state_dict();
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(expected.count(name)) << what << ": unexpected " << name;
    EXPECT_TRUE(at::equal(t, expected.at(name))) << what << ": " << name << " differs";
  }
}

// The fixture's two rows (row 1 left-padded) and two seeded random ones.
struct Batch {
  at::Tensor ids, pos, mask, loss_mask;  // loss_mask [B, S-1]: next-token positions
};

Batch batch(const Fixture& f) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(97);
  Batch b;
  b.ids = at::cat({f.ref.at("input_ids"), at::randint(3, kVocab, {2, 10}, gen, at::kLong)});
  b.mask = at::cat({f.ref.at("attention_mask"), at::ones({2, 10}, at::kLong)});
  b.pos = (b.mask.cumsum(1) - 1).clamp_min(0);
  auto m = b.mask.to(at::kFloat);
  b.loss_mask = m.narrow(1, 0, 9) * m.narrow(1, 1, 9);
  return b;
}

// Largest |logit| over the real vocabulary of a TP 1 `model` on `sequences`
// (the magnitude behind their log-probs; the padded columns are no logits).
double max_real_logit(Transformer& model, const std::vector<std::vector<int64_t>>& sequences) {
  at::NoGradGuard no_grad;
  double m = 1;
  for (const auto& s : sequences) {
    const auto n = static_cast<int64_t>(s.size());
    auto logits = model.forward(at::tensor(s, at::kLong).view({1, n}),
                                at::arange(n, at::kLong).view({1, n}), at::ones({1, n}, at::kLong));
    m = std::max(m, logits.narrow(2, 0, kVocab).abs().max().item<double>());
  }
  return m;
}

// ---------------------------------------------------------------- the rule

TEST(VocabPadding, PadsToAMultipleOfDivisorTimesTp) {
  EXPECT_EQ(padded_vocab_size(97, 1), 128);
  EXPECT_EQ(padded_vocab_size(97, 2), 256);
  EXPECT_EQ(padded_vocab_size(97, 4), 512);
  EXPECT_EQ(padded_vocab_size(97, 2, 1), 98);
  EXPECT_EQ(padded_vocab_size(97, 4, 8), 128);
  EXPECT_EQ(padded_vocab_size(128, 1), 128);  // already a multiple: no padding
  EXPECT_EQ(padded_vocab_size(50257, 1), 50304);  // GPT-2 in Megatron
  EXPECT_EQ(padded_vocab_size(50257, 8), 51200);
  expect_error([] { padded_vocab_size(97, 2, 0); }, {"make_vocab_size_divisible_by 0"});
  expect_error([] { padded_vocab_size(0, 2, 1); }, {"vocab_size 0"});
}

TEST(VocabPadding, ShardsSplitThePaddedTableEvenly) {
  auto s = vocab_shard(97, 256, 2, 0);
  EXPECT_EQ(s.begin, 0);
  EXPECT_EQ(s.rows, 128);
  EXPECT_EQ(s.real, 97);
  s = vocab_shard(97, 256, 2, 1);  // padding only
  EXPECT_EQ(s.begin, 128);
  EXPECT_EQ(s.real, 0);
  EXPECT_EQ(s.padding(), 128);
  s = vocab_shard(97, 100, 4, 3);  // divisor 1: the last rank is partly padding
  EXPECT_EQ(s.begin, 75);
  EXPECT_EQ(s.rows, 25);
  EXPECT_EQ(s.real, 22);
  expect_error([] { vocab_shard(97, 96, 2, 0); }, {"96 rows"});
}

TEST(VocabPadding, TheParallelConfigCarriesTheDivisor) {
  ParallelConfig pc;
  EXPECT_EQ(pc.make_vocab_size_divisible_by, 128);
  pc.tp = 2;
  EXPECT_EQ(pc.padded_vocab_size(97), 256);
  EXPECT_EQ(pc.to_string(), "tp=2 cp=1 dp=1 pp=1");
  pc.make_vocab_size_divisible_by = 8;
  EXPECT_EQ(pc.to_string(), "tp=2 cp=1 dp=1 pp=1 make_vocab_size_divisible_by=8");
  pc.make_vocab_size_divisible_by = 0;
  expect_error([&] { pc.validate(); }, {"make_vocab_size_divisible_by must be at least 1"});
  expect_error([] { ParallelState::single(layout(2, 128)); }, {"needs 2 ranks"});
  EXPECT_EQ(ParallelState::single(layout(1, 1))->config().make_vocab_size_divisible_by, 1);
}

// ---------------------------------------------------------------- conversion

TEST(VocabPadding, HfToShardedToHfIsBitExact) {
  const Fixture f = fixture();
  struct Case {
    int64_t tp, pp, divisible_by;
  };
  for (Case c : {Case{2, 2, 128}, Case{4, 1, 128}, Case{2, 2, 1}, Case{4, 2, 8}, Case{1, 1, 128}}) {
    const std::string what =
        detail::cat("tp", c.tp, " pp", c.pp, " make_vocab_size_divisible_by ", c.divisible_by);
    ShardedLayout l{.tp = c.tp, .pp = c.pp, .make_vocab_size_divisible_by = c.divisible_by};
    auto shards = shard_all(f.hf, f.cfg, l);
    const int64_t padded = padded_vocab_size(kVocab, c.tp, c.divisible_by);
    for (int64_t k = 0; k < c.tp; ++k) {
      const VocabShard v = vocab_shard(kVocab, padded, c.tp, k);
      for (const auto& [name, stage] :
           {std::pair<std::string, size_t>{"embedding.word_embeddings.weight", 0},
            {"output_layer.weight", shards.size() - 1}}) {
        const at::Tensor& t = shards[stage][k].at(name);
        ASSERT_EQ(t.size(0), padded / c.tp) << what << " " << name;
        const at::Tensor& source = f.hf.at(name == "output_layer.weight" ? "lm_head.weight"
                                                                         : "model.embed_tokens.weight");
        if (v.real > 0) {
          EXPECT_TRUE(at::equal(t.narrow(0, 0, v.real), source.narrow(0, v.begin, v.real)))
              << what << " " << name << " rank " << k;
        }
        EXPECT_EQ(t.narrow(0, v.real, v.padding()).count_nonzero().item<int64_t>(), 0)
            << what << ": padding rows are zeros";
      }
    }
    auto back = shards_to_hf(shards, f.cfg, even_layer_split(f.cfg.num_layers, c.pp), false,
                             c.divisible_by);
    ASSERT_EQ(back.size(), f.hf.size()) << what;
    for (const auto& [name, t] : f.hf) {
      ASSERT_TRUE(back.count(name)) << what << ": " << name;
      EXPECT_TRUE(at::equal(back.at(name), t)) << what << ": " << name;
    }
  }
}

TEST(VocabPadding, ExportNamesThePaddingItExpected) {
  const Fixture f = fixture();
  auto shards = shard_all(f.hf, f.cfg, ShardedLayout{.tp = 2, .pp = 1});  // 256 rows
  expect_error([&] { shards_to_hf(shards, f.cfg, {f.cfg.num_layers}, false, 1); },
               {"embedding.word_embeddings.weight expected [49, 64] got [128, 64]",
                "vocab_size 97 padded to 98 rows by make_vocab_size_divisible_by 1 x tp 2"});
}

TEST(VocabPadding, ShardedLayoutRecordsThePadding) {
  const Fixture f = fixture();
  testing::TempDir dir;
  ShardedLayout l{.tp = 2, .pp = 2};
  save_sharded(dir.path(), f.cfg, l, shard_all(f.hf, f.cfg, l));
  std::ifstream in(dir.path() / "layout.json");
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("make_vocab_size_divisible_by"), 128);
  EXPECT_EQ(j.at("padded_vocab_size"), 256);
  EXPECT_EQ(load_sharded_layout(dir.path()).make_vocab_size_divisible_by, 128);

  remove_checksum_manifest(dir.path());  // layout.json is edited by hand below
  auto rewrite = [&](const nlohmann::json& layout_json) {
    std::ofstream out(dir.path() / "layout.json");
    out << layout_json.dump();
  };
  auto wrong = j;
  wrong["padded_vocab_size"] = 128;
  rewrite(wrong);
  expect_error([&] { load_sharded_layout(dir.path()); },
               {"\"padded_vocab_size\" 128", "make_vocab_size_divisible_by 128 x tp 2 (256)"});
  // A layout.json from before padding: its vocabulary divided tp, unpadded.
  auto old = j;
  old.erase("make_vocab_size_divisible_by");
  old.erase("padded_vocab_size");
  rewrite(old);
  EXPECT_EQ(load_sharded_layout(dir.path()).make_vocab_size_divisible_by, 1);
}

TEST(VocabPadding, ACheckpointLoadsOnlyIntoTheSamePadding) {
  const Fixture f = fixture();
  testing::TempDir root;
  auto saved = load(f, ParallelState::single());  // 128 rows
  Optimizer opt(saved, OptimizerOptions());
  save_checkpoint(root.path(), 1, *saved, opt);

  // Divisor 64 pads 97 to 128 rows as well: the same shards.
  auto same = load(f, ParallelState::single(layout(1, 64)));
  Optimizer same_opt(same, OptimizerOptions());
  load_checkpoint(root.path(), *same, same_opt);
  expect_exact(*same, saved->state_dict(), "divisor 64");

  auto other = load(f, ParallelState::single(layout(1, 1)));  // 97 rows
  Optimizer other_opt(other, OptimizerOptions());
  expect_error([&] { load_checkpoint(root.path(), *other, other_opt); },
               {"padded_vocab_size = 128 (make_vocab_size_divisible_by 128)",
                "the model has 97 (make_vocab_size_divisible_by 1)"});
  // Loading the shards by hand says what the model expects.
  expect_error([&] { other->load_state_dict(saved->state_dict()); },
               {"output_layer.weight (checkpoint [128, 64], model [97, 64]",
                "pads vocab_size 97 to 97 rows"});
}

// ---------------------------------------------------------------- one process

// TP 1 pads 97 to 128 rows: the logits of the real columns, the log-probs and
// the entropy are HF's, the padded columns hold -inf.
TEST(VocabPadding, Tp1MatchesHfAndPaddedColumnsHoldMinusInfinity) {
  const Fixture f = fixture();
  auto model = load(f, ParallelState::single());
  ASSERT_EQ(model->padded_vocab_size(), 128);
  const at::Tensor ids = f.ref.at("input_ids"), mask = f.ref.at("attention_mask");
  at::NoGradGuard no_grad;
  auto logits = model->forward(ids, f.ref.at("position_ids"), mask);
  ASSERT_EQ(logits.size(2), 128);
  EXPECT_TRUE(logits.narrow(2, kVocab, 128 - kVocab).isneginf().all().item<bool>());
  const int64_t seq = ids.size(1);
  const double m = max_abs(f.ref.at("logits"), mask);
  expect_close(logits.narrow(2, 0, kVocab), f.ref.at("logits"),
               Tolerance::fp32(test::logit_terms(f.cfg, seq), m), "logits", mask);
  auto [lp, ent] = vocab_parallel_log_probs_entropy(logits.narrow(1, 0, seq - 1),
                                                    ids.narrow(1, 1, seq - 1), model->parallel().tp());
  const Tolerance t = Tolerance::fp32(test::log_prob_terms(f.cfg, seq), m);
  const at::Tensor valid = f.ref.at("response_mask");
  expect_close(lp, f.ref.at("log_probs"), t, "log-probs", valid);
  expect_close(ent, f.ref.at("entropy"), t, "entropy", valid);
  // Padding rows that are not zero change nothing: the columns are masked.
  auto noisy = load(f, ParallelState::single());
  noisy->named_params().back().second.narrow(0, kVocab, 128 - kVocab).fill_(100);
  auto noisy_logits = noisy->forward(ids, f.ref.at("position_ids"), mask);
  EXPECT_TRUE(at::equal(noisy_logits, logits));
}

// A loss with a large entropy weight still gives finite gradients: zero ones
// for the padded logit columns (vocab_parallel's backward alone, and through
// the model) and for the padding rows of the embedding and the LM head.
TEST(VocabPadding, PaddingRowsGetZeroGradients) {
  const Fixture f = fixture();
  auto model = load(f, ParallelState::single());
  const at::Tensor ids = f.ref.at("input_ids");
  auto logits = model->forward(ids, f.ref.at("position_ids"), f.ref.at("attention_mask"));
  auto loss_of = [&](const at::Tensor& x) {
    auto [lp, ent] = vocab_parallel_log_probs_entropy(x.narrow(1, 0, 9), ids.narrow(1, 1, 9),
                                                      model->parallel().tp());
    return 1e6 * ent.sum() - lp.sum();
  };
  auto leaf = logits.detach().requires_grad_(true);
  loss_of(leaf).backward();
  EXPECT_TRUE(leaf.grad().isfinite().all().item<bool>());
  EXPECT_EQ(leaf.grad().narrow(2, kVocab, 128 - kVocab).count_nonzero().item<int64_t>(), 0);
  loss_of(logits).backward();
  for (const auto& [name, p] : model->named_params()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(p.grad().isfinite().all().item<bool>()) << name;
    if (is_vocab_param(name)) {
      EXPECT_EQ(p.grad().narrow(0, kVocab, 128 - kVocab).count_nonzero().item<int64_t>(), 0)
          << name;
    }
  }
}

// ---------------------------------------------------------------- TP layouts

struct Layout {
  int64_t tp = 2;
  int64_t divisible_by = 128;
};

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  return detail::cat("tp", info.param.tp, "_div", info.param.divisible_by);
}

class VocabPaddingLayouts : public ::testing::TestWithParam<Layout> {};

// Per element, the bound on how far one AdamW step (no clipping, first step:
// update lr·g/(|g| + eps)) moves apart for two gradients within `grad_tol`
// of `g`: the update's slope eps/(|x| + eps)² is at most 1/(|x| + eps), so
// lr·δ/(max(|g| − δ, 0) + eps), at most 2·lr; plus a few roundings of the
// weight itself.
at::Tensor adam_step_tolerance(const at::Tensor& g, const at::Tensor& w, Tolerance grad_tol,
                               const OptimizerOptions& o) {
  auto gd = g.to(at::kDouble).abs();
  auto delta = gd * grad_tol.rtol + grad_tol.atol;
  auto slope_bound = 1.0 / ((gd - delta).clamp_min(0) + o.eps);
  return (delta * slope_bound).clamp_max(2) * o.lr + w.to(at::kDouble).abs() * 4 * test::kFp32Eps;
}

TEST_P(VocabPaddingLayouts, LogProbsEntropyAndATrainingStepMatchTp1) {
  const Layout l = GetParam();
  run_world(l.tp, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const Fixture f = fixture();
    auto ps = ParallelState::create(store, rank, layout(l.tp, l.divisible_by));
    auto model = load(f, ps);
    auto dense = load(f, ParallelState::single());
    ASSERT_EQ(model->padded_vocab_size(), padded_vocab_size(kVocab, l.tp, l.divisible_by));
    const VocabShard v = model->vocab_shard();
    const Batch b = batch(f);
    const int64_t seq = b.ids.size(1);
    const double tokens = b.loss_mask.sum().item<double>();

    auto logits = model->forward(b.ids, b.pos, b.mask);
    auto dense_logits = dense->forward(b.ids, b.pos, b.mask);
    const at::Tensor real = dense_logits.detach().narrow(2, 0, kVocab);
    const double m = max_abs(real, b.mask);
    ASSERT_EQ(logits.size(2), v.rows);
    if (v.real > 0)
      expect_close(logits.detach().narrow(2, 0, v.real), real.narrow(2, v.begin, v.real),
                   Tolerance::fp32(test::logit_terms(f.cfg, seq), m), "logits", b.mask);
    EXPECT_TRUE(logits.narrow(2, v.real, v.padding()).isneginf().all().item<bool>());

    auto targets = b.ids.narrow(1, 1, seq - 1);
    auto [lp, ent] = vocab_parallel_log_probs_entropy(logits.narrow(1, 0, seq - 1), targets, ps->tp());
    auto [dlp, dent] = vocab_parallel_log_probs_entropy(dense_logits.narrow(1, 0, seq - 1), targets,
                                                        dense->parallel().tp());
    // TP 1 itself against the unpadded distribution, computed directly.
    auto direct = at::log_softmax(real.narrow(1, 0, seq - 1), -1);
    const Tolerance t = Tolerance::fp32(test::log_prob_terms(f.cfg, seq), m);
    expect_close(dlp.detach(), direct.gather(-1, targets.unsqueeze(-1)).squeeze(-1), t,
                 "tp1 log-probs against log_softmax over the 97 tokens", b.loss_mask);
    expect_close(dent.detach(), -(direct.exp() * direct).sum(-1), t,
                 "tp1 entropy against the 97 tokens'", b.loss_mask);
    expect_close(lp.detach(), dlp.detach(), t, "log-probs", b.loss_mask);
    expect_close(ent.detach(), dent.detach(), t, "entropy", b.loss_mask);

    // One training step: token-mean loss with an entropy bonus.
    auto loss_of = [&](const at::Tensor& lp_, const at::Tensor& ent_) {
      return -((lp_ + 0.01 * ent_) * b.loss_mask).sum() / tokens;
    };
    auto loss = loss_of(lp, ent), dense_loss = loss_of(dlp, dent);
    expect_near(loss.item<double>(), dense_loss.item<double>(),
                Tolerance::fp32(test::log_prob_terms(f.cfg, seq) + tokens, m), "loss");
    OptimizerOptions oo;
    oo.lr = 1e-3;
    oo.clip_grad = 0;  // keeps each element's update a function of its own gradient
    Optimizer opt(model, oo), dense_opt(dense, oo);
    opt.zero_grad();
    dense_opt.zero_grad();
    loss.backward();
    dense_loss.backward();
    opt.step();
    dense_opt.step();

    // This rank's part of TP 1's gradients and updated weights.
    TensorMap dense_grads;
    for (const auto& [name, p] : dense->named_params()) dense_grads[name] = p.grad();
    auto as_mine = [&](const TensorMap& dense_tensors) {
      return hf_to_shard(shards_to_hf({{dense_tensors}}, f.cfg, {f.cfg.num_layers}, false), f.cfg,
                         model->shard_spec());
    };
    const TensorMap grads = as_mine(dense_grads), weights = as_mine(dense->state_dict());
    const TensorMap before = hf_to_shard(f.hf, f.cfg, model->shard_spec());
    const double grad_terms = test::gradient_terms(f.cfg, seq, static_cast<int64_t>(tokens));
    for (const auto& [name, p] : model->named_params()) {
      const std::string what = detail::cat("rank ", rank, " ", name);
      const Tolerance gt = Tolerance::fp32(grad_terms, max_abs(grads.at(name)));
      expect_close(p.grad(), grads.at(name), gt, what + " gradient");
      auto tol = adam_step_tolerance(grads.at(name), before.at(name), gt, oo);
      auto diff = (p.detach().to(at::kDouble) - weights.at(name).to(at::kDouble)).abs();
      EXPECT_TRUE(diff.le(tol).all().item<bool>())
          << what << " after the step: max |diff| " << diff.max().item<double>()
          << ", worst |diff| / allowed " << (diff / tol).max().item<double>();
      if (is_vocab_param(name) && v.padding() > 0) {
        EXPECT_EQ(p.detach().narrow(0, v.real, v.padding()).count_nonzero().item<int64_t>(), 0)
            << what << ": padding rows stay zero";
      }
    }
  });
}

// Greedy decoding picks the same tokens as TP 1, and sampling with the same
// seed draws the same ones; nothing beyond the 97 tokens is ever produced.
TEST_P(VocabPaddingLayouts, GenerationMatchesTp1) {
  const Layout l = GetParam();
  run_world(l.tp, [l](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const Fixture f = fixture();
    auto model = load(f, ParallelState::create(store, rank, layout(l.tp, l.divisible_by)));
    auto dense = load(f, ParallelState::single());
    std::vector<std::vector<int64_t>> prompts = {{5, 17, 33}, {96, 4, 60, 12, 81}, {40}};
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = 8;
    greedy.ignore_eos = true;
    SamplingParams sampled = greedy;
    sampled.temperature = 1.0;
    sampled.n = 2;
    sampled.seed = 1234;
    for (const auto& [what, params] :
         {std::pair<std::string, SamplingParams>{"greedy", greedy}, {"sampled", sampled}}) {
      auto got = GenerationEngine(model).generate(prompts, params);
      auto want = GenerationEngine(dense).generate(prompts, params);
      ASSERT_EQ(got.size(), want.size()) << what;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].response, want[i].response) << what << " sequence " << i;
        for (int64_t t : got[i].response) EXPECT_LT(t, kVocab) << what;
        // Log-probs of a context up to prompt + response tokens long.
        auto tokens = got[i].prompt;
        tokens.insert(tokens.end(), got[i].response.begin(), got[i].response.end());
        expect_close(got[i].log_probs, want[i].log_probs,
                     Tolerance::fp32(test::log_prob_terms(f.cfg, static_cast<int64_t>(tokens.size())),
                                     max_real_logit(*dense, {tokens})),
                     what + " log-probs of sequence " + std::to_string(i));
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, VocabPaddingLayouts,
                         ::testing::Values(Layout{2, 128}, Layout{4, 128}, Layout{2, 1},
                                           Layout{4, 8}),
                         layout_name);

// ---------------------------------------------------------------- resharding

// TP 2 (256 rows) into TP 1 (128 rows) and into TP 2 padded by 1 (98 rows:
// the split moves, so the training ranks gather), and TP 2 × PP 2 into TP 1:
// every rollout model equals hf_to_shard for its own layout, bit for bit.
TEST(VocabPaddingReshard, IntoLayoutsThatPadDifferentlyEqualsDirectConversion) {
  run_world(4, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const Fixture f = fixture();
    for (int64_t pp : {1, 2}) {
      const ParallelConfig training = [&] {
        ParallelConfig pc = layout(2, 128, pp);
        pc.dp = 4 / (2 * pp);
        return pc;
      }();
      auto train_ps =
          ParallelState::create(prefixed(detail::cat("train", pp), store), rank, training);
      train_ps->set_num_layers(f.cfg.num_layers);
      auto train = load(f, train_ps);
      for (int64_t r_tp : {1, 2}) {
        auto tp_r = make_rollout_state(store, rank, training, r_tp);
        tp_r->set_num_layers(f.cfg.num_layers);
        Transformer rollout(f.cfg, tp_r);
        reshard_weights(*train, rollout, ReshardOptions{.bucket_bytes = 16 << 10});
        expect_exact(rollout, hf_to_shard(f.hf, f.cfg, rollout.shard_spec()),
                     detail::cat("pp", pp, " -> tp", r_tp));
      }
      ParallelConfig by_one = layout(2, 1);
      by_one.dp = 2;
      auto ps = ParallelState::create(prefixed(detail::cat("by_one", pp), store), rank, by_one);
      ps->set_num_layers(f.cfg.num_layers);
      Transformer rollout(f.cfg, ps);
      ASSERT_EQ(rollout.padded_vocab_size(), 98);
      reshard_weights(*train, rollout);
      expect_exact(rollout, hf_to_shard(f.hf, f.cfg, rollout.shard_spec()),
                   detail::cat("pp", pp, " -> tp2 padded by 1"));
    }
  });
}

// The HybridEngine's rollout (TP 1 from a TP 2 trainer) holds the directly
// converted weights and generates what one process generates.
TEST(VocabPaddingReshard, HybridEngineTp2TrainerGeneratesInTp1) {
  run_world(2, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const Fixture f = fixture();
    auto train_ps = ParallelState::create(prefixed("train", store), rank, layout(2, 128));
    train_ps->set_num_layers(f.cfg.num_layers);
    HybridEngine engine(load(f, train_ps), store, HybridEngineOptions().set_rollout_tp(1));
    engine.enter_rollout();
    expect_exact(engine.rollout_model(),
                 hf_to_shard(f.hf, f.cfg, engine.rollout_model().shard_spec()), "rollout weights");
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = 6;
    greedy.ignore_eos = true;
    std::vector<std::vector<int64_t>> prompts = {{7, 8, 9}, {90, 3}};
    auto got = engine.generate(prompts, greedy);
    auto want = GenerationEngine(load(f, ParallelState::single())).generate(prompts, greedy);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].response, want[i].response) << i;
    engine.exit_rollout();
  });
}

// ---------------------------------------------------------------- weight sync

// A TP 2 trainer (256 rows) syncs to a separate TP 1 rollout worker (128
// rows): the worker's weights equal hf_to_shard for TP 1. A worker told the
// wrong training padding rejects the header, and both sides fail.
TEST(VocabPaddingWeightSync, Tp2TrainerToTp1WorkerEqualsDirectConversion) {
  run_world(3, [](int64_t rank, c10::intrusive_ptr<c10d::Store> store) {
    const Fixture f = fixture();
    const ParallelConfig training = layout(2, 128);
    WeightSyncOptions options;
    options.bucket_bytes = 16 << 10;
    if (rank < 2) {
      auto ps = ParallelState::create(prefixed("train", store), rank, training);
      auto train = load(f, ps);
      for (const char* name : {"sync", "bad"}) {
        WeightSender sender(
            train,
            make_sync_group(store, name, trainer_sync_rank(*ps), sync_group_size(training, 1)),
            options);
        if (std::string(name) == "sync")
          EXPECT_EQ(sender.send(1).version, 1);
        else
          expect_error([&] { sender.send(2); }, {"1 rollout rank(s) rejected"});
      }
      return;
    }
    auto rollout = load(f, ParallelState::single());
    for (auto& [name, p] : rollout->named_params()) {
      at::NoGradGuard no_grad;
      p.fill_(-1);  // every element must be overwritten, padding rows with zeros
    }
    const int64_t me = receiver_sync_rank(training, 0), size = sync_group_size(training, 1);
    WeightReceiver receiver(rollout, training, make_sync_group(store, "sync", me, size), options);
    EXPECT_EQ(receiver.receive().version, 1);
    expect_exact(*rollout, hf_to_shard(f.hf, f.cfg, rollout->shard_spec()), "synced weights");

    ParallelConfig told = training;
    told.make_vocab_size_divisible_by = 1;  // 98 rows, not the trainer's 256
    WeightReceiver wrong(rollout, told, make_sync_group(store, "bad", me, size), options);
    expect_error([&] { wrong.receive(); }, {"training padded vocab_size", "256 vs 98"});
  });
}

}  // namespace
}  // namespace baton::engine
