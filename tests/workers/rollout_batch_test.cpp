// The rollout's batch contract (workers/roles/rollout_batch.h) for partial
// rollouts: a resumed batch becomes one continuation per row, the result's
// responses hold only the new tokens, `finished` says which rows are done,
// and a response generated in two calls through the batches, as the
// fully-async trainer does, is the one a single call gives (on the tiny
// Qwen2 fixture; log-probs within the chain of a log-prob, a resumed prefix
// being prefilled instead of decoded).
#include "workers/roles/rollout_batch.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/errors.h"
#include "dispatch/data_proto.h"
#include "engine/io/hf_model.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/rollout/generation.h"
#include "tests/engine/model_tolerance.h"
#include "tests/tolerance.h"

namespace baton::workers {
namespace {

using test::Tolerance;

const std::string kModel = std::string(BATON_FIXTURES_DIR) + "/tiny-qwen2";

// Three left-padded prompts (0 = padding) of the fixture's vocabulary (128
// ids), sampled at temperature 1, n samples each, responses of up to 8.
DataProto prompts(int64_t n) {
  at::Tensor ids = at::tensor({0, 0, 5, 9, 3, 4, 7, 11, 0, 0, 0, 42}, at::kLong).view({3, 4});
  DataProto d;
  d.set_tensor("input_ids", ids);
  d.set_tensor("attention_mask", (ids != 0).to(at::kLong));
  d.set_tensor("request_seed", at::tensor({11, 22, 33}, at::kLong));
  d.set_meta("n", Value(n));
  d.set_meta("temperature", Value(1.0));
  d.set_meta("response_length", Value(int64_t{8}));
  return d;
}

// Two of those prompts' rows resumed after 2 response tokens, each from its own sample.
DataProto resumed() {
  DataProto d = prompts(1);
  d.set_tensor("resume_sample", at::tensor({1, 0, 3}, at::kLong));
  d.set_meta("resume_generated", Value(int64_t{2}));
  return d;
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected baton::Error";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "\"" << n << "\" not in: " << e.what();
  }
}

TEST(RolloutBatch, AResumedBatchContinuesEachRowsSample) {
  const RolloutRequest req = rollout_request(resumed(), 16, "generate_sequences");
  ASSERT_EQ(req.continuations.size(), 3u);
  const std::vector<int64_t> samples{1, 0, 3};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(req.continuations[i].sample, samples[i]);
    EXPECT_EQ(req.continuations[i].generated, 2);
  }
  EXPECT_EQ(req.params.max_new_tokens, 8);
  EXPECT_EQ(req.response_width(), 6);
  EXPECT_EQ(req.full_response_length, 8);
  EXPECT_FALSE(req.report_finished);
  const RolloutRequest fresh = rollout_request(prompts(2), 16, "generate_sequences");
  EXPECT_TRUE(fresh.continuations.empty());
  EXPECT_EQ(fresh.response_width(), 8);
  EXPECT_FALSE(fresh.params.ignore_eos);
  DataProto no_eos = prompts(2);
  no_eos.set_meta("ignore_eos", Value(true));
  EXPECT_TRUE(rollout_request(no_eos, 16, "generate_sequences").params.ignore_eos);
}

TEST(RolloutBatch, ResumingNeedsBothKeysAndOneSamplePerRow) {
  DataProto only_samples = prompts(1);
  only_samples.set_tensor("resume_sample", at::tensor({0, 0, 0}, at::kLong));
  expect_error([&] { rollout_request(only_samples, 8, "generate_sequences"); },
               {"generate_sequences", "resume_generated", "only resume_sample"});
  DataProto only_count = prompts(1);
  only_count.set_meta("resume_generated", Value(int64_t{2}));
  expect_error([&] { rollout_request(only_count, 8, "generate_sequences"); },
               {"generate_sequences", "only resume_generated"});
  DataProto two = resumed();
  two.set_meta("n", Value(int64_t{2}));
  expect_error([&] { rollout_request(two, 8, "generate_sequences"); },
               {"generate_sequences", "n must be 1, got 2"});
  DataProto wrong_size = resumed();
  wrong_size.set_tensor("resume_sample", at::zeros({3, 2}, at::kLong));
  expect_error([&] { rollout_request(wrong_size, 8, "generate_sequences"); },
               {"generate_sequences", "resume_sample", "[3]"});
  DataProto short_full = prompts(2);
  short_full.set_meta("full_response_length", Value(int64_t{6}));
  expect_error([&] { rollout_request(short_full, 8, "generate_sequences"); },
               {"generate_sequences", "full_response_length 6", "response_length 8"});
}

// A resumed request's result: the rows as given, only the new tokens (width
// response_length - G), and finished = stopped or G + new reached the
// whole response's budget.
TEST(RolloutBatch, AResumedResultHoldsTheNewTokensAndWhichRowsAreDone) {
  DataProto batch = resumed();
  batch.set_meta("report_finished", Value(true));
  batch.set_meta("full_response_length", Value(int64_t{10}));
  const RolloutRequest req = rollout_request(batch, 16, "generate_sequences");
  auto seq = [](int64_t request, int64_t sample, std::vector<int64_t> response,
                const std::string& reason) {
    engine::GeneratedSequence s;
    s.request = request;
    s.sample = sample;
    s.response = response;
    s.log_probs.assign(response.size(), -0.5f);
    s.finish_reason = reason;
    return s;
  };
  // Stopped after 2 new tokens; at this call's budget (2 + 6 = 8 < 10); at
  // this call's budget again.
  const DataProto out =
      rollout_result(req, {seq(0, 1, {7, 8}, "stop"), seq(1, 0, {1, 2, 3, 4, 5, 6}, "length"),
                           seq(2, 3, {9, 9, 9, 9, 9, 9}, "length")});
  EXPECT_TRUE(at::equal(out.tensor("prompts"), batch.tensor("input_ids")));
  EXPECT_EQ(out.tensor("responses").sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_TRUE(at::equal(out.tensor("responses")[0], at::tensor({7, 8, 0, 0, 0, 0}, at::kLong)));
  EXPECT_TRUE(at::equal(out.tensor("response_mask").sum(1), at::tensor({2, 6, 6}, at::kLong)));
  EXPECT_EQ(out.tensor("rollout_log_probs").sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(out.tensor("input_ids").size(1), 4 + 6);
  EXPECT_TRUE(at::equal(out.tensor("finished"), at::tensor({1, 0, 0}, at::kLong)));

  // Where this call's budget is the whole response's, every row is done.
  batch.set_meta("full_response_length", Value(int64_t{8}));
  const DataProto last =
      rollout_result(rollout_request(batch, 16, "generate_sequences"),
                     {seq(0, 1, {7, 8}, "stop"), seq(1, 0, {1, 2, 3, 4, 5, 6}, "length"),
                      seq(2, 3, {9, 9, 9, 9, 9, 9}, "length")});
  EXPECT_TRUE(at::equal(last.tensor("finished"), at::tensor({1, 1, 1}, at::kLong)));
  // Not asked: no `finished`.
  batch.set_meta("report_finished", Value(false));
  EXPECT_FALSE(
      rollout_result(rollout_request(batch, 16, "generate_sequences"),
                     {seq(0, 1, {7}, "stop"), seq(1, 0, {1}, "stop"), seq(2, 3, {9}, "stop")})
          .has_tensor("finished"));
}

// Multi-turn: the tokens a turn appended (a tool's output, the template's
// glue) are in the response and attended to, but out of response_mask, the
// mask every loss, KL, entropy and advantage takes.
TEST(RolloutBatch, AppendedTokensAreAttendedButOutOfTheResponseMask) {
  const RolloutRequest req = rollout_request(prompts(1), 16, "generate_sequences");
  engine::GeneratedSequence turns;
  turns.request = 0;
  turns.response = {7, 8, 30, 31, 32, 9, 10};
  turns.generated_mask = {1, 1, 0, 0, 0, 1, 1};
  turns.log_probs = {-0.5f, -0.5f, 0, 0, 0, -0.5f, -0.5f};
  turns.finish_reason = "stop";
  engine::GeneratedSequence plain;
  plain.request = 1;
  plain.response = {4, 5};
  plain.log_probs = {-1.f, -1.f};
  plain.finish_reason = "stop";
  const DataProto out = rollout_result(req, {turns, plain});
  const int64_t R = out.tensor("responses").size(1);
  EXPECT_TRUE(at::equal(out.tensor("response_mask")[0].narrow(0, 0, 8),
                        at::tensor({1, 1, 0, 0, 0, 1, 1, 0}, at::kLong)));
  EXPECT_TRUE(at::equal(out.tensor("response_mask")[1].narrow(0, 0, 3),
                        at::tensor({1, 1, 0}, at::kLong)));
  const at::Tensor attention = out.tensor("attention_mask");
  EXPECT_EQ(attention.size(1), 4 + R);
  EXPECT_EQ(attention[0].narrow(0, 4, R).sum().item<int64_t>(), 7) << "every response token";
  EXPECT_EQ(attention[1].narrow(0, 4, R).sum().item<int64_t>(), 2);
  // Positions run on through the appended tokens.
  EXPECT_EQ(out.tensor("position_ids")[0][4 + 6].item<int64_t>(), 2 + 6);
}

// A response of up to 8 tokens in two calls through the batches, as the
// fully-async trainer makes them: the first call's budget is 3 of the 8;
// its unfinished rows, their input_ids and attention_mask as returned, are
// resumed with their request seeds and samples. The joined responses are
// the single call's; a stop token from a free run ends a row early.
TEST(RolloutBatch, AResponseInTwoCallsIsTheOneOfASingleCall) {
  engine::HfModel hf = engine::load_hf_model(kModel);
  auto model = std::make_shared<engine::Transformer>(hf.config, engine::ParallelState::single());
  model->load_state_dict(engine::hf_to_shard(hf.weights, hf.config, model->shard_spec()));
  engine::GenerationEngine engine(model, engine::GenerationOptions().set_cache_bytes(1 << 20));
  auto generate = [&](const DataProto& batch) {
    const RolloutRequest req = rollout_request(batch, 8, "generate_sequences");
    return rollout_result(req,
                          engine.generate(req.prompts, req.params, req.seeds, req.continuations));
  };
  const int64_t n = 2;
  DataProto base = prompts(n);
  const int64_t stop = generate(base).tensor("responses")[0][1].item<int64_t>();
  base.set_meta("stop_token_ids", Value(List{Value(stop)}));
  const DataProto whole = generate(base);

  DataProto first = base;
  first.set_meta("response_length", Value(int64_t{3}));
  first.set_meta("full_response_length", Value(int64_t{8}));
  first.set_meta("report_finished", Value(true));
  const DataProto head = generate(first);
  const at::Tensor done = head.tensor("finished");
  ASSERT_EQ(done.size(0), 3 * n);
  const at::Tensor rows = (done == 0).nonzero().view({-1});
  ASSERT_GT(rows.size(0), 0) << "some rows were meant to go on";
  ASSERT_LT(rows.size(0), 3 * n) << "a row was meant to stop in the first call";

  DataProto resume = head.select({"input_ids", "attention_mask"}).select_rows(rows);
  resume.set_tensor("request_seed",
                    base.tensor("request_seed").repeat_interleave(n).index_select(0, rows));
  resume.set_tensor("resume_sample", rows.remainder(n));
  resume.set_meta("n", Value(int64_t{1}));
  resume.set_meta("temperature", Value(1.0));
  resume.set_meta("stop_token_ids", Value(List{Value(stop)}));
  resume.set_meta("resume_generated", Value(int64_t{3}));
  resume.set_meta("response_length", Value(int64_t{8}));
  resume.set_meta("report_finished", Value(true));
  const DataProto tail = generate(resume);
  EXPECT_TRUE(at::equal(tail.tensor("prompts"), resume.tensor("input_ids")));
  EXPECT_EQ(tail.tensor("responses").size(1), 5);
  EXPECT_TRUE(tail.tensor("finished").eq(1).all().item<bool>());

  // The joined rows: a finished head padded to 8, an unfinished one with its tail.
  at::Tensor responses = at::cat({head.tensor("responses"), at::zeros({3 * n, 5}, at::kLong)}, 1);
  at::Tensor log_probs =
      at::cat({head.tensor("rollout_log_probs"), at::zeros({3 * n, 5}, at::kFloat)}, 1);
  at::Tensor mask = at::cat({head.tensor("response_mask"), at::zeros({3 * n, 5}, at::kLong)}, 1);
  for (int64_t k = 0; k < rows.size(0); ++k) {
    const int64_t r = rows[k].item<int64_t>();
    responses[r].narrow(0, 3, 5).copy_(tail.tensor("responses")[k]);
    log_probs[r].narrow(0, 3, 5).copy_(tail.tensor("rollout_log_probs")[k]);
    mask[r].narrow(0, 3, 5).copy_(tail.tensor("response_mask")[k]);
  }
  EXPECT_TRUE(at::equal(responses, whole.tensor("responses")));
  EXPECT_TRUE(at::equal(mask, whole.tensor("response_mask")));
  std::vector<std::vector<int64_t>> seqs;
  const at::Tensor ids = whole.tensor("input_ids"), attention = whole.tensor("attention_mask");
  for (int64_t r = 0; r < ids.size(0); ++r) {
    std::vector<int64_t> s;
    for (int64_t c = 0; c < ids.size(1); ++c)
      if (attention[r][c].item<int64_t>() != 0) s.push_back(ids[r][c].item<int64_t>());
    seqs.push_back(s);
  }
  test::expect_close(log_probs, whole.tensor("rollout_log_probs"),
                     Tolerance::fp32(engine::test::log_prob_terms(hf.config, ids.size(1)),
                                     engine::test::max_abs_logit(*model, seqs)),
                     "two calls vs one", mask);
}

}  // namespace
}  // namespace baton::workers
