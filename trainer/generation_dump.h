// What a step generated and how it scored, for people to read (verl's
// trainer.rollout_data_dir, trainer.validation_data_dir and
// trainer.log_val_generations).
//
// A record per sample: the prompt's and the response's text (decoded with
// special tokens skipped; padding is never decoded: the attention mask says
// which tokens are real), the ground truth, the score, and the per-row values
// the reward reported (its float columns: acc, ...). dump_generations writes
// them as verl does: <dir>/<step>.jsonl, a line per sample {"input",
// "output", "gts", "score", "step", <extra>...}.
//
// Example (after a step's rewards):
//   auto records = generation_records(batch, scores, tokenizer);
//   dump_generations("rollouts", step, records);
//   std::cout << format_generations(records, 3);
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dispatch/data_proto.h"
#include "text/tokenizer/tokenizer.h"

namespace baton::trainer {

struct GenerationRecord {
  std::string input, output, ground_truth;
  double score = 0;
  std::map<std::string, double> extra;
};

// `rows`: a generated batch (prompts [N, P], responses [N, R],
// attention_mask [N, P + R], the ground_truth column); `scores`: N values.
// Throws baton::Error naming what is missing or of the wrong size.
std::vector<GenerationRecord> generation_records(const DataProto& rows,
                                                 const std::vector<double>& scores,
                                                 const data::Tokenizer& tokenizer);

// Writes <dir>/<step>.jsonl (creating dir; replacing a file of that step
// whole: written aside, then renamed). Throws baton::Error naming the path.
void dump_generations(const std::filesystem::path& dir, int64_t step,
                      const std::vector<GenerationRecord>& records);

// The first `count` records as console text, one block each.
std::string format_generations(const std::vector<GenerationRecord>& records, int64_t count);

}  // namespace baton::trainer
