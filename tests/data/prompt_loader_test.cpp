// The prompt loader: seeded shuffles, epochs, and a saved state that resumes at the same batch.
#include "data/prompt_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <unistd.h>

namespace baton::data {
namespace {

const std::string kFixtures = BATON_FIXTURES_DIR;

// Ten one-row prompts "a", "b", ..., "j" (the wordlevel fixture: one token each).
class Loader : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string((std::filesystem::temp_directory_path() /
                             ("baton_loader_" + std::to_string(::getpid()) + ".jsonl"))
                                .string());
    std::ofstream out(*path_);
    for (char c = 'a'; c <= 'j'; ++c) {
      out << R"({"data_source": "d", "prompt": ")" << c
          << R"(", "reward_model": {"ground_truth": "1"}})"
          << "\n";
    }
    out.close();
    tok_ = new Tokenizer(Tokenizer::load(kFixtures + "/wordlevel"));
    ds_ = new PromptDataset(
        PromptDataset::load({*path_}, *tok_, PromptDatasetOptions().set_max_prompt_length(2)));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*path_);
    delete ds_;
    delete tok_;
    delete path_;
  }
  static std::string* path_;
  static Tokenizer* tok_;
  static PromptDataset* ds_;
};
std::string* Loader::path_ = nullptr;
Tokenizer* Loader::tok_ = nullptr;
PromptDataset* Loader::ds_ = nullptr;

TEST_F(Loader, EveryEpochIsASeededPermutationOfAllRows) {
  PromptLoader loader(*ds_, PromptLoaderOptions().set_batch_size(5).set_seed(7));
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  std::vector<std::vector<std::size_t>> epochs(3);
  for (int e = 0; e < 3; ++e) {
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(loader.epoch(), e == 0 || b == 1 ? e : e - 1);
      const PromptBatch batch = loader.next();
      EXPECT_EQ(batch.size, 5);
      epochs[e].insert(epochs[e].end(), batch.indices.begin(), batch.indices.end());
    }
    std::vector<std::size_t> sorted = epochs[e];
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::size_t> all(10);
    std::iota(all.begin(), all.end(), std::size_t{0});
    EXPECT_EQ(sorted, all) << "epoch " << e;
  }
  EXPECT_NE(epochs[0], epochs[1]);  // reshuffled each epoch
  // The same seed gives the same order; another seed another one.
  PromptLoader same(*ds_, PromptLoaderOptions().set_batch_size(5).set_seed(7));
  EXPECT_EQ(same.batch_indices(1, 0),
            std::vector<std::size_t>(epochs[1].begin(), epochs[1].begin() + 5));
  PromptLoader other(*ds_, PromptLoaderOptions().set_batch_size(5).set_seed(8));
  EXPECT_NE(other.batch_indices(0, 0),
            std::vector<std::size_t>(epochs[0].begin(), epochs[0].begin() + 5));
}

TEST_F(Loader, WithoutShuffleRowsComeInFileOrderAndDropLastDropsTheRest) {
  PromptLoader loader(*ds_, PromptLoaderOptions().set_batch_size(4).set_shuffle(false));
  EXPECT_EQ(loader.batches_per_epoch(), 2);  // 10 rows: 4 + 4, the last 2 dropped
  EXPECT_EQ(loader.next().indices, (std::vector<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(loader.next().indices, (std::vector<std::size_t>{4, 5, 6, 7}));
  EXPECT_EQ(loader.next().indices, (std::vector<std::size_t>{0, 1, 2, 3}));
  EXPECT_EQ(loader.epoch(), 1);
  PromptLoader keep(*ds_, PromptLoaderOptions().set_batch_size(4).set_shuffle(false).set_drop_last(false));
  EXPECT_EQ(keep.batches_per_epoch(), 3);
  EXPECT_EQ(keep.batch_indices(0, 2), (std::vector<std::size_t>{8, 9}));
}

TEST_F(Loader, RestoredStateGivesTheSameNextBatch) {
  PromptLoader run(*ds_, PromptLoaderOptions().set_batch_size(3).set_seed(11));
  for (int i = 0; i < 4; ++i) run.next();  // into the second epoch (3 batches per epoch)
  const std::string saved = run.state().to_json();
  const PromptBatch want = run.next();

  PromptLoader resumed(*ds_, PromptLoaderOptions().set_batch_size(3).set_seed(11));
  resumed.restore(LoaderState::from_json(saved, "ckpt/data.json"));
  const PromptBatch got = resumed.next();
  EXPECT_EQ(got.indices, want.indices);
  EXPECT_EQ(got.input_ids, want.input_ids);
  EXPECT_EQ(resumed.epoch(), 1);
  EXPECT_EQ(resumed.next().indices, run.next().indices);
}

TEST_F(Loader, RestoreRejectsAStateOfAnotherConfiguration) {
  PromptLoader a(*ds_, PromptLoaderOptions().set_batch_size(3).set_seed(11));
  PromptLoader b(*ds_, PromptLoaderOptions().set_batch_size(2).set_seed(11));
  try {
    b.restore(a.state());
    FAIL() << "no error";
  } catch (const baton::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("data.train_batch_size was 3"), std::string::npos)
        << e.what();
  }
  try {
    LoaderState::from_json(R"({"epoch": 1})", "ckpt/data.json");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/data.json"), std::string::npos) << e.what();
  }
}

TEST_F(Loader, TooFewRowsForOneBatchIsAnError) {
  EXPECT_THROW(PromptLoader(*ds_, PromptLoaderOptions().set_batch_size(11)), baton::InvalidArgument);
  EXPECT_THROW(PromptLoader(*ds_, PromptLoaderOptions().set_batch_size(0)), baton::InvalidArgument);
}

}  // namespace
}  // namespace baton::data
