#include "engine/rollout/scheduler.h"

#include <algorithm>
#include <map>

#include "engine/errors.h"

namespace baton::engine {

Scheduler::Scheduler(SchedulerOptions options, SequenceBlocks& blocks)
    : options_(options), blocks_(blocks) {
  ENGINE_CHECK(options_.max_batch >= 1, "Scheduler: max_batch must be >= 1, got ",
               options_.max_batch);
}

SequenceId Scheduler::add(int64_t request, int64_t tokens, int64_t max_positions) {
  ENGINE_CHECK(tokens >= 1, "Scheduler::add: a sequence needs a token, got ", tokens);
  if (max_positions < tokens)
    throw EngineError(detail::cat("Scheduler::add: max_positions ", max_positions,
                                  " is below the sequence's ", tokens, " tokens"));
  const SequenceId id{static_cast<int64_t>(entries_.size())};
  entries_.push_back({request, tokens, max_positions});
  waiting_.push_back(id);
  return id;
}

int64_t Scheduler::blocks_for(int64_t tokens) const {
  return (tokens + blocks_.block_size() - 1) / blocks_.block_size();
}

Scheduler::Prefill Scheduler::admit() {
  ENGINE_CHECK(stepping_.empty(), "Scheduler::admit: the last step was not completed");
  Prefill batch;
  std::map<int64_t, size_t> leader_of;  // request -> the row of its fresh sample
  int64_t longest = 0, copies = 0;      // copies: followers' partly filled blocks to come
  while (!waiting_.empty() && static_cast<int64_t>(running_.size() + batch.rows.size() +
                                                   batch.followers.size()) < options_.max_batch) {
    const SequenceId s = waiting_.front();
    Entry& e = entries_[s.value];
    auto leader = leader_of.find(e.request);
    if (options_.share_prompt_prefill && !e.admitted_before && leader != leader_of.end()) {
      const int64_t copy = e.tokens % blocks_.block_size() != 0;
      if (blocks_.free_blocks() - copies < copy) break;
      copies += copy;
      e.admitted_before = true;
      batch.followers.push_back({s, leader->second});
      waiting_.pop_front();
      continue;
    }
    const int64_t padded =
        std::max(longest, e.tokens) * static_cast<int64_t>(batch.rows.size() + 1);
    if (!batch.rows.empty() && padded > options_.max_prefill_tokens) break;
    // A resumed sequence holds part of what it needs: reserve() says whether
    // the rest is free.
    auto fits = [&] {
      if (!e.holds_cache && blocks_.free_blocks() - copies < blocks_for(e.tokens)) return false;
      return blocks_.reserve(s, e.tokens);
    };
    if (!fits()) {
      // Nothing runs to give blocks back: the paused sequences' kept caches
      // go (they recompute), then those of the other waiting sequences, then
      // this one's own if it is resumed.
      if (!batch.rows.empty() || !running_.empty()) break;
      if (!(release_paused() && fits()) && !(release_waiting(s) && fits())) {
        if (!e.holds_cache) break;
        blocks_.release(s);
        ++preemptions_;
        e.holds_cache = false;
        if (!fits()) break;
      }
    }
    e.holds_cache = false;
    longest = std::max(longest, e.tokens);
    if (!e.admitted_before) leader_of.emplace(e.request, batch.rows.size());
    e.admitted_before = true;
    batch.rows.push_back(s);
    waiting_.pop_front();
  }
  // With nothing running every block is free: the first waiting sequence
  // can never fit (GenerationEngine::generate checks each against the whole
  // cache first).
  if (batch.rows.empty() && running_.empty() && !waiting_.empty()) {
    const SequenceId s = waiting_.front();
    throw EngineError(detail::cat(
        "Scheduler: no sequence fits in the free KV cache: sequence ", s.value, " needs ",
        blocks_for(entries_[s.value].tokens), " blocks for its ", entries_[s.value].tokens,
        " tokens, nothing runs and ", blocks_.free_blocks(), " are free"));
  }
  stepping_ = batch.rows;
  for (const Follower& f : batch.followers) stepping_.push_back(f.seq);
  prefilling_ = true;
  step_tokens_ = 1;
  return batch;
}

std::vector<SequenceId> Scheduler::decode(int64_t steps) {
  ENGINE_CHECK(stepping_.empty(), "Scheduler::decode: the last step was not completed");
  if (steps < 1)
    throw EngineError(detail::cat("Scheduler::decode: steps must be >= 1, got ", steps));
  for (size_t i = 0; i < running_.size(); ++i) {
    const SequenceId s = running_[i];
    const Entry& e = entries_[s.value];
    // The sequence feeds its last token and then steps - 1 sampled ones:
    // `tokens + steps - 1` positions, no more than it can ever hold.
    while (!blocks_.reserve(s, std::min(e.tokens + steps - 1, e.max_positions))) {
      const SequenceId victim = running_.back();
      blocks_.release(victim);
      waiting_.push_front(victim);
      running_.pop_back();
      ++preemptions_;
      if (victim == s) break;
    }
  }
  stepping_ = running_;
  prefilling_ = false;
  step_tokens_ = steps;
  return running_;
}

void Scheduler::complete(const std::vector<SequenceId>& finished,
                         const std::vector<SequenceId>& paused) {
  ENGINE_CHECK(!stepping_.empty(), "Scheduler::complete: no step in flight");
  auto in = [](const std::vector<SequenceId>& ids, SequenceId s) {
    return std::find(ids.begin(), ids.end(), s) != ids.end();
  };
  auto is_finished = [&](SequenceId s) { return in(finished, s); };
  auto leaves = [&](SequenceId s) { return in(finished, s) || in(paused, s); };
  for (SequenceId s : finished)
    ENGINE_CHECK(in(stepping_, s), "Scheduler::complete: sequence ", s.value,
                 " was not in the step");
  for (SequenceId s : paused) {
    ENGINE_CHECK(in(stepping_, s), "Scheduler::complete: paused sequence ", s.value,
                 " was not in the step");
    ENGINE_CHECK(!is_finished(s), "Scheduler::complete: sequence ", s.value,
                 " both finished and paused");
  }
  for (SequenceId s : stepping_) entries_[s.value].tokens += step_tokens_;
  if (prefilling_)
    for (SequenceId s : stepping_)
      if (!leaves(s)) running_.push_back(s);
  for (SequenceId s : stepping_)
    if (is_finished(s)) blocks_.release(s);
  if (!prefilling_) std::erase_if(running_, leaves);
  paused_.insert(paused_.end(), paused.begin(), paused.end());
  stepping_.clear();
}

void Scheduler::resume(SequenceId seq, int64_t added) {
  const auto it = std::find(paused_.begin(), paused_.end(), seq);
  if (it == paused_.end())
    throw EngineError(
        detail::cat("Scheduler::resume: sequence ", seq.value, " is not paused"));
  ENGINE_CHECK(added >= 1, "Scheduler::resume: sequence ", seq.value,
               " needs at least one appended token, got ", added);
  paused_.erase(it);
  Entry& e = entries_[seq.value];
  e.tokens += added;
  e.max_positions = std::max(e.max_positions, e.tokens);
  e.holds_cache = !e.cache_released;
  e.cache_released = false;
  waiting_.push_front(seq);
}

void Scheduler::finish_paused(SequenceId seq) {
  const auto it = std::find(paused_.begin(), paused_.end(), seq);
  if (it == paused_.end())
    throw EngineError(
        detail::cat("Scheduler::finish_paused: sequence ", seq.value, " is not paused"));
  paused_.erase(it);
  blocks_.release(seq);
}

bool Scheduler::release_waiting(SequenceId except) {
  bool any = false;
  for (SequenceId s : waiting_) {
    Entry& e = entries_[s.value];
    if (s == except || !e.holds_cache) continue;
    blocks_.release(s);
    e.holds_cache = false;
    ++preemptions_;
    any = true;
  }
  return any;
}

bool Scheduler::release_paused() {
  bool any = false;
  for (SequenceId s : paused_) {
    Entry& e = entries_[s.value];
    if (e.cache_released) continue;
    blocks_.release(s);
    e.cache_released = true;
    ++preemptions_;
    any = true;
  }
  return any;
}

}  // namespace baton::engine
