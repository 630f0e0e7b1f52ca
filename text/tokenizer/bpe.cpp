#include "text/tokenizer/bpe.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/tokenizer_error.h"
#include "text/utf8.h"

namespace baton::data {
namespace {

constexpr std::size_t kCacheMaxPieceBytes = 256;
constexpr std::size_t kCacheCapacity = 10000;

// One merge of the pair at `pos`; the queue pops the lowest rank, then the leftmost.
struct Candidate {
  uint32_t rank;
  std::size_t pos;
  int32_t new_id;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct Symbol {
  int32_t id;
  std::ptrdiff_t prev, next;
  std::size_t len;  // bytes; 0 once merged into its left neighbour
};

}  // namespace

Bpe::Bpe(const nlohmann::json& config, const std::string& where)
    : vocab_(Vocabulary::from_json(json_field(config, "vocab", where), where + ".vocab")) {
  if (const auto it = config.find("dropout"); it != config.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      throw TokenizerError(where +
                           ".dropout: BPE dropout is not supported (tokenization would "
                           "be random); set it to null");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto it = config.find(key); it != config.end() && !it->is_null() &&
                                          !(it->is_string() && it->get<std::string>().empty())) {
      throw TokenizerError(where + "." + key +
                           ": not supported by baton's BPE (byte-level BPE "
                           "models leave it null)");
    }
  }
  if (const auto it = config.find("unk_token"); it != config.end() && !it->is_null()) {
    const std::string unk = json_string(config, "unk_token", where);
    unk_id_ = vocab_.find(unk);
    if (!unk_id_)
      throw TokenizerError(where + ".unk_token: '" + unk + "' is not in the vocabulary");
  }
  fuse_unk_ = json_bool(config, "fuse_unk", false, where);
  byte_fallback_ = json_bool(config, "byte_fallback", false, where);
  ignore_merges_ = json_bool(config, "ignore_merges", false, where);

  const auto& merges = json_array(config, "merges", where);
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    const std::string here = where + ".merges[" + std::to_string(rank) + "]";
    std::string left, right;
    if (m.is_string()) {  // the legacy form "a b"
      const std::string line = m.get<std::string>();
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        throw TokenizerError(here + ": expected \"left right\" (two tokens, one space), got '" +
                             line + "'");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      throw TokenizerError(here + ": expected \"left right\" or [\"left\", \"right\"]");
    }
    const auto a = vocab_.find(left), b = vocab_.find(right), ab = vocab_.find(left + right);
    if (!a || !b || !ab) {
      throw TokenizerError(here + ": the merge of '" + left + "' and '" + right +
                           "' uses a token that is not in the vocabulary ('" +
                           (!a   ? left
                            : !b ? right
                                 : left + right) +
                           "')");
    }
    // A pair listed twice takes its last rank, as HF's map of merges does.
    merges_.insert_or_assign(pair_key(*a, *b), Merge{static_cast<uint32_t>(rank), *ab});
  }
}

std::vector<int32_t> Bpe::merge_word(std::string_view piece) const {
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  // A pending unknown token (fuse_unk makes consecutive unknown characters one token).
  bool unk = false;
  std::size_t unk_len = 0;
  const auto add = [&](int32_t id, std::size_t len) {
    const auto n = static_cast<std::ptrdiff_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, len});
  };
  for (std::size_t i = 0; i < piece.size();) {
    const std::size_t n = utf8::sequence_length(static_cast<unsigned char>(piece[i]));
    const std::string_view ch = piece.substr(i, n);
    i += n;
    if (const auto id = vocab_.find(ch)) {
      if (unk) add(*unk_id_, unk_len), unk = false;
      add(*id, n);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (char c : ch) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(c));
        if (const auto id = vocab_.find(name))
          bytes.push_back(*id);
        else
          break;
      }
      if (bytes.size() == ch.size()) {
        if (unk) add(*unk_id_, unk_len), unk = false;
        for (int32_t id : bytes) add(id, 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk && fuse_unk_) {
        unk_len += n;
      } else {
        if (unk) add(*unk_id_, unk_len);
        unk = true;
        unk_len = n;
      }
    }
    // Without unk_token an unknown character is dropped, as HF does.
  }
  if (unk) add(*unk_id_, unk_len);
  if (!symbols.empty()) symbols.back().next = -1;

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push = [&](std::size_t pos) {
    const Symbol& s = symbols[pos];
    if (s.next < 0) return;
    const auto it = merges_.find(pair_key(s.id, symbols[static_cast<std::size_t>(s.next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (std::size_t pos = 0; pos + 1 < symbols.size(); ++pos) push(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& s = symbols[top.pos];
    if (s.len == 0 || s.next < 0) continue;
    const auto next_pos = static_cast<std::size_t>(s.next);
    const Symbol right = symbols[next_pos];
    // Skip a stale candidate: the pair at `pos` changed since it was queued.
    const auto it = merges_.find(pair_key(s.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    s.id = top.new_id;
    s.len += right.len;
    s.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0)
      symbols[static_cast<std::size_t>(right.next)].prev = static_cast<std::ptrdiff_t>(top.pos);
    if (s.prev >= 0) push(static_cast<std::size_t>(s.prev));
    push(top.pos);
  }
  std::vector<int32_t> ids;
  for (const Symbol& s : symbols) {
    if (s.len > 0) ids.push_back(s.id);
  }
  return ids;
}

void Bpe::tokenize(std::string_view piece, std::vector<int32_t>& ids) const {
  if (ignore_merges_) {
    if (const auto id = vocab_.find(piece)) {
      ids.push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() < kCacheMaxPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(piece);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> word = merge_word(piece);
  ids.insert(ids.end(), word.begin(), word.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(piece), std::move(word));
  }
}

}  // namespace baton::data
