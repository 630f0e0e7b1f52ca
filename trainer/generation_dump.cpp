#include "trainer/generation_dump.h"

#include <ATen/ATen.h>

#include <fstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "base/errors.h"

namespace baton::trainer {
namespace {

// The ids of `row` where `mask` is non-zero.
std::vector<int32_t> valid_ids(const at::Tensor& ids, const at::Tensor& mask) {
  std::vector<int32_t> out;
  const auto id = ids.accessor<int64_t, 1>();
  const auto m = mask.accessor<int64_t, 1>();
  for (int64_t j = 0; j < ids.size(0); ++j)
    if (m[j] != 0) out.push_back(static_cast<int32_t>(id[j]));
  return out;
}

std::string text_of(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kString:
      return v.as_string();
    case ValueKind::kInt:
      return std::to_string(v.as_int());
    case ValueKind::kNone:
      return "";
    default:
      return "<" + std::string(kind_name(v.kind())) + ">";
  }
}

}  // namespace

std::vector<GenerationRecord> generation_records(const DataProto& rows,
                                                 const std::vector<double>& scores,
                                                 const data::Tokenizer& tokenizer) {
  rows.require_tensors({"prompts", "responses", "attention_mask"}, "generation_records");
  const int64_t n = rows.size();
  if (static_cast<int64_t>(scores.size()) != n)
    throw Error("generation_records: " + std::to_string(scores.size()) + " scores for " +
                std::to_string(n) + " rows");
  const at::Tensor prompts = rows.tensor("prompts").to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor responses = rows.tensor("responses").to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor mask = rows.tensor("attention_mask").to(at::kCPU).to(at::kLong).contiguous();
  const int64_t p = prompts.size(1);
  const List* truths = rows.has_column("ground_truth") ? &rows.column("ground_truth") : nullptr;
  // The reward's per-row values: every float column.
  std::vector<std::string> extra;
  for (const std::string& key : rows.column_keys()) {
    const List& c = rows.column(key);
    if (!c.empty() && c.front().kind() == ValueKind::kFloat) extra.push_back(key);
  }
  std::vector<GenerationRecord> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    GenerationRecord& r = out[static_cast<size_t>(i)];
    r.input = tokenizer.decode(valid_ids(prompts[i], mask[i].narrow(0, 0, p)), true);
    r.output = tokenizer.decode(valid_ids(responses[i], mask[i].narrow(0, p, responses.size(1))),
                                true);
    if (truths) r.ground_truth = text_of((*truths)[static_cast<size_t>(i)]);
    r.score = scores[static_cast<size_t>(i)];
    for (const std::string& key : extra)
      r.extra[key] = rows.column(key)[static_cast<size_t>(i)].as_float();
  }
  return out;
}

void dump_generations(const std::filesystem::path& dir, int64_t step,
                      const std::vector<GenerationRecord>& records) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("dump_generations: cannot create " + dir.string() + ": " + ec.message());
  const std::filesystem::path path = dir / (std::to_string(step) + ".jsonl");
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const GenerationRecord& r : records) {
      nlohmann::ordered_json line = {{"input", r.input},
                                     {"output", r.output},
                                     {"gts", r.ground_truth},
                                     {"score", r.score},
                                     {"step", step}};
      for (const auto& [key, value] : r.extra) line[key] = value;
      out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
    out.flush();
    if (!out) throw Error("dump_generations: cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw Error("dump_generations: cannot rename " + tmp.string() + " to " + path.string() + ": " +
                ec.message());
}

std::string format_generations(const std::vector<GenerationRecord>& records, int64_t count) {
  std::string out;
  for (size_t i = 0; i < records.size() && static_cast<int64_t>(i) < count; ++i) {
    const GenerationRecord& r = records[i];
    out += "  [score " + nlohmann::json(r.score).dump() + ", ground truth " +
           nlohmann::json(r.ground_truth).dump() + "]\n  input:  " +
           nlohmann::json(r.input).dump() + "\n  output: " + nlohmann::json(r.output).dump() +
           "\n";
  }
  return out;
}

}  // namespace baton::trainer
