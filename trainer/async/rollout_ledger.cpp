#include "trainer/async/rollout_ledger.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "base/atomic_file.h"
#include "base/checksum_manifest.h"
#include "base/errors.h"
#include "trainer/checkpoint_files.h"

namespace baton::trainer {
namespace {

namespace fs = std::filesystem;

const char* kLedgerFile = "rollout_ledger.json";

std::string prompts_file(int64_t index) { return "prompts_" + std::to_string(index) + ".bin"; }
std::string trajectories_file(int64_t index) {
  return "trajectories_" + std::to_string(index) + ".bin";
}

}  // namespace

RolloutLedger::RolloutLedger(std::vector<LedgerEntry> restored, int64_t next_step)
    : next_step_(next_step) {
  std::sort(restored.begin(), restored.end(),
            [](const LedgerEntry& a, const LedgerEntry& b) { return a.index < b.index; });
  for (LedgerEntry& e : restored) {
    next_index_ = std::max(next_index_, e.index + 1);
    next_step_ = std::max(next_step_, e.step + 1);
    if (e.done) {
      to_requeue_.push_back(*e.done);
    } else {
      to_generate_.push_back(e.index);
    }
    const int64_t index = e.index;
    entries_.emplace(index, std::move(e));
  }
}

std::vector<TrajectoryBatch> RolloutLedger::requeue() {
  std::lock_guard lock(mu_);
  return std::exchange(to_requeue_, {});
}

LedgerEntry RolloutLedger::start(const std::function<DataProto(int64_t step)>& draw) {
  std::lock_guard lock(mu_);
  if (!to_generate_.empty()) {
    const int64_t index = to_generate_.front();
    to_generate_.pop_front();
    return entries_.at(index);
  }
  LedgerEntry e;
  e.index = next_index_;
  e.step = next_step_;
  e.prompts = draw(e.step);
  ++next_index_;
  ++next_step_;
  entries_.emplace(e.index, e);
  return e;
}

void RolloutLedger::finish(int64_t index, const TrajectoryBatch& b) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(index);
  if (it == entries_.end())
    throw Error("RolloutLedger::finish: no batch " + std::to_string(index) + " was started");
  it->second.done = b;
}

void RolloutLedger::taken(int64_t index) {
  std::lock_guard lock(mu_);
  entries_.erase(entries_.begin(), entries_.upper_bound(index));
}

LedgerSnapshot RolloutLedger::snapshot(const std::function<std::string()>& loader_state) const {
  std::lock_guard lock(mu_);
  LedgerSnapshot s;
  s.loader_state = loader_state();
  for (const auto& [index, e] : entries_) s.entries.push_back(e);
  return s;
}

std::vector<LedgerEntry> RolloutLedger::entries() const {
  std::lock_guard lock(mu_);
  std::vector<LedgerEntry> out;
  for (const auto& [index, e] : entries_) out.push_back(e);
  return out;
}

std::string describe_ledger(const std::vector<LedgerEntry>& entries) {
  int64_t generated = 0, trajectories = 0, pending = 0, prompts = 0;
  for (const LedgerEntry& e : entries) {
    if (e.done) {
      ++generated;
      trajectories += e.done->batch.size();
    } else {
      ++pending;
      prompts += e.prompts.size();
    }
  }
  auto plural = [](int64_t n, const char* word) {
    return std::to_string(n) + " " + word + (n == 1 ? "" : "es");
  };
  std::string out;
  if (generated > 0)
    out = plural(generated, "generated batch") + " (" + std::to_string(trajectories) +
          " trajectories)";
  if (pending > 0) {
    out += (out.empty() ? "" : ", ") + plural(pending, "batch") + " of " +
           std::to_string(prompts) + " prompts to generate again";
  }
  return out.empty() ? "no batch" : out;
}

int64_t ledger_samples(const std::vector<LedgerEntry>& entries, int64_t n) {
  int64_t samples = 0;
  for (const LedgerEntry& e : entries)
    samples += e.done ? e.done->batch.size() : e.prompts.size() * n;
  return samples;
}

void save_ledger(const std::vector<LedgerEntry>& entries, const fs::path& dir) {
  fs::create_directories(dir);
  remove_checksum_manifest(dir);
  nlohmann::json list = nlohmann::json::array();
  for (const LedgerEntry& e : entries) {
    nlohmann::json j = {{"index", e.index}, {"step", e.step}, {"prompts", prompts_file(e.index)}};
    e.prompts.save((dir / prompts_file(e.index)).string());
    if (e.done) {
      e.done->batch.save((dir / trajectories_file(e.index)).string());
      j["trajectories"] = trajectories_file(e.index);
      j["param_version"] = e.done->param_version;
      j["generate_seconds"] = e.done->generate_seconds;
    }
    list.push_back(j);
  }
  // The batches' files carry their own checksums; the list's are in the manifest.
  ChecksumManifest manifest;
  manifest.add(kLedgerFile, baton::write_file_atomically(
                                dir / kLedgerFile, nlohmann::json{{"entries", list}}.dump(2)));
  manifest.write(dir);
}

std::vector<LedgerEntry> load_ledger(const fs::path& dir) {
  const fs::path file = dir / kLedgerFile;
  if (!fs::exists(file)) return {};
  std::ifstream in(file);
  if (!in) throw Error("resume: cannot read " + file.string());
  const std::string text(std::istreambuf_iterator<char>(in), {});
  try {
    verify_file_bytes(file, text.data(), text.size());
  } catch (const FileError& e) {
    throw Error(std::string("resume: ") + e.what());
  }
  std::vector<LedgerEntry> entries;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    for (const nlohmann::json& item : j.at("entries")) {
      LedgerEntry e;
      e.index = json_integer(item, "index", file);
      e.step = json_integer(item, "step", file);
      // The file names follow from the index: a checkpoint names no path to read.
      e.prompts = DataProto::load((dir / prompts_file(e.index)).string());
      if (item.contains("trajectories")) {
        TrajectoryBatch b;
        b.batch = DataProto::load((dir / trajectories_file(e.index)).string());
        b.param_version = json_integer(item, "param_version", file);
        b.generate_seconds = item.at("generate_seconds").get<double>();
        b.index = e.index;
        e.done = std::move(b);
      }
      entries.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error("resume: " + file.string() + ": " + e.what());
  }
  return entries;
}

}  // namespace baton::trainer
