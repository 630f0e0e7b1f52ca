// A checkpoint saved by transformers 5 (its config.json has
// "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0} and
// "dtype", no top-level "rope_theta" / "torch_dtype") against HF 5.23's own
// forward on it (fixtures/tiny-llama-tf5, made by make_tf5_fixtures.py).
// Tolerances: HF and baton compute the same fp32 values with other kernels
// and summation orders; see fp32_tolerance below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"

namespace baton::engine {
namespace {

const std::string kDir = std::string(BATON_FIXTURES_DIR) + "/tiny-llama-tf5";

struct Run {
  ModelConfig config;
  TensorMap ref;
  at::Tensor logits;     // [B, S, V]: baton's, padding columns (if any) dropped
  at::Tensor log_probs;  // [B, S-1]
};

// baton's forward on the fixture's inputs, with `config` (read from the
// fixture, possibly altered) and the fixture's weights.
Run run(ModelConfig config) {
  TensorMap ref = read_safetensors(kDir + "/reference.safetensors");
  auto model = std::make_shared<Transformer>(config, ParallelState::single());
  auto spec = ShardSpec::for_rank(config, 0, 1, 0, {config.num_layers}, false);
  model->load_state_dict(hf_to_shard(read_hf_weights(kDir), config, spec));
  at::NoGradGuard no_grad;
  auto logits =
      model->forward(ref.at("input_ids"), ref.at("position_ids"), ref.at("attention_mask"));
  auto log_probs = next_token_log_probs(logits, ref.at("input_ids"), model->parallel().tp());
  return {config, ref, logits.narrow(-1, 0, config.vocab_size), log_probs};
}

// Two fp32 computations of one value through `terms` summed terms of
// magnitude up to `magnitude` differ by at most min(n, 6·√n)·ε times it
// (ε = 2^-23): n·ε is the worst case of n roundings (Higham, "Accuracy and
// Stability of Numerical Algorithms", §3.1); 6·√n·ε bounds them as
// independent zero-mean errors except with probability ~n·e^-18 (Higham &
// Mary, SIAM J. Sci. Comput. 41(5), 2019). Used as both the absolute (at that
// magnitude) and the relative allowance.
struct Tolerance {
  double atol, rtol;
};

Tolerance fp32_tolerance(double terms, double magnitude) {
  const double k = std::min(terms, 6 * std::sqrt(terms)) * 0x1p-23;
  return {k * magnitude, k};
}

// Terms summed on the way to one logit of a `seq`-token sequence: per layer
// the RMSNorm (hidden), q/k/v (hidden), scores (head_dim), softmax and values
// (2·seq), o_proj (heads·head_dim), RMSNorm (hidden), gate/up (hidden), down
// (intermediate); then the final norm and the LM head (2·hidden).
double logit_terms(const ModelConfig& c, int64_t seq) {
  const int64_t per_layer =
      4 * c.hidden_size + c.head_dim + 2 * seq + c.q_size() + c.intermediate_size;
  return static_cast<double>(c.num_layers * per_layer + 2 * c.hidden_size);
}

// A log-prob: its logit's terms, those of the logits in the log-sum-exp, and
// the sum over the vocabulary.
double log_prob_terms(const ModelConfig& c, int64_t seq) {
  return 2 * logit_terms(c, seq) + static_cast<double>(c.vocab_size);
}

// Elementwise |actual - expected| <= atol + rtol·|expected| where `where`
// ([B, S], broadcast over the rest) is nonzero.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, Tolerance tol,
                  const std::string& what, const at::Tensor& where) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  auto mask = where.to(at::kBool);
  while (mask.dim() < actual.dim()) mask = mask.unsqueeze(-1);
  auto diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs();
  auto excess = (diff - (expected.to(at::kDouble).abs() * tol.rtol + tol.atol))
                    .masked_fill(mask.logical_not(), -1.0);
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << ": max |diff| " << diff.masked_fill(mask.logical_not(), 0).max().item<double>()
      << " beyond atol " << tol.atol << " + rtol " << tol.rtol << " * |expected|";
}

// Largest |x| where `where` is nonzero.
double max_abs(const at::Tensor& x, const at::Tensor& where) {
  auto mask = where.to(at::kBool);
  while (mask.dim() < x.dim()) mask = mask.unsqueeze(-1);
  return x.abs().masked_fill(mask.logical_not(), 0).max().item<double>();
}

Tolerance logit_tolerance(const Run& r) {
  return fp32_tolerance(logit_terms(r.config, r.logits.size(1)),
                        max_abs(r.ref.at("logits"), r.ref.at("attention_mask")));
}

TEST(Transformers5Checkpoint, ThetaFromRopeParametersGivesHfLogitsAndLogProbs) {
  auto r = run(ModelConfig::load(kDir));
  ASSERT_EQ(r.config.rope_theta, 500000.0);
  // 2 layers, 16 tokens: 1056 terms behind a logit, k = 6·√1056·ε = 2.3e-5;
  // logits reach 6.8, so ~1.6e-4 absolute (~3e-4 on the log-probs).
  const auto& mask = r.ref.at("attention_mask");
  expect_close(r.logits, r.ref.at("logits"), logit_tolerance(r), "logits", mask);

  expect_close(
      r.log_probs, r.ref.at("log_probs"),
      fp32_tolerance(log_prob_terms(r.config, r.logits.size(1)), max_abs(r.ref.at("logits"), mask)),
      "log_probs", r.ref.at("response_mask"));
}

// What a reader that ignored rope_parameters computed: the default theta
// 10000. It matches HF run with theta 10000 (so theta is all that differs) and
// misses HF's theta-500000 logits by far more than the tolerance the test
// above allows, which therefore catches such a reader.
TEST(Transformers5Checkpoint, FallingBackToThetaTenThousandMissesHfByFarMoreThanTheTolerance) {
  auto config = ModelConfig::load(kDir);
  config.rope_theta = 10000.0;
  auto r = run(config);
  const auto& mask = r.ref.at("attention_mask");
  const Tolerance tol = logit_tolerance(r);
  expect_close(r.logits, r.ref.at("logits_theta10000"), tol, "theta 10000 logits", mask);

  const double miss = max_abs(r.logits - r.ref.at("logits"), mask);
  const double allowed = tol.atol + tol.rtol * max_abs(r.ref.at("logits"), mask);
  EXPECT_GT(miss, 1000 * allowed) << "theta 10000 vs HF's theta 500000: max |diff| " << miss
                                  << ", the tolerance allows at most " << allowed;
}

}  // namespace
}  // namespace baton::engine
