// Vocabulary padding for tensor parallelism, as Megatron does it
// (`make_vocab_size_divisible_by`): the embedding and LM-head tables get rows
// appended up to a multiple of divisible_by × tp, so that every TP rank holds
// the same number of rows whatever the vocabulary (GPT-2's 50257, a test
// model's 97). The padded size depends on tp: 97 pads to 128 rows at tp 1 and
// to 256 at tp 2 with the default 128.
//
// Rows at or beyond the real vocabulary are padding and never matter (see
// docs/engine.md, "Vocabulary padding"): they start as zeros, no token id
// reaches them, the LM head sets their logit columns to -inf (probability
// exactly 0, never a max or argmax, zero gradient; vocab_parallel.h's entropy
// counts them as 0), export to HF strips them, and resharding copies real rows
// only and pads again for the destination layout.
//
// Example:
//   int64_t rows = padded_vocab_size(97, /*tp=*/2, /*divisible_by=*/128);  // 256
//   VocabShard s = vocab_shard(97, rows, /*tp=*/2, /*rank=*/0);
//   // s.begin 0, s.rows 128, s.real 97: rows [97, 128) of rank 0 are padding
#pragma once

#include <cstdint>

namespace baton::engine {

// Megatron's default. 1 pads only as far as tp needs (none when tp divides
// the vocabulary).
constexpr int64_t kDefaultVocabDivisibleBy = 128;

// The smallest multiple of divisible_by × tp that is >= vocab_size. Throws
// EngineError, naming the value, when one of them is below 1.
int64_t padded_vocab_size(int64_t vocab_size, int64_t tp,
                          int64_t divisible_by = kDefaultVocabDivisibleBy);

// TP rank `rank`'s part of a table of `padded_size` rows over `tp` ranks:
// rows [begin, begin + rows), of which the first `real` are token ids (below
// vocab_size) and the others padding. `real` may be 0 (a rank of padding only).
struct VocabShard {
  int64_t begin = 0;
  int64_t rows = 0;
  int64_t real = 0;

  int64_t padding() const { return rows - real; }
};

// REQUIRES: tp divides padded_size >= vocab_size, 0 <= rank < tp (EngineError
// otherwise).
VocabShard vocab_shard(int64_t vocab_size, int64_t padded_size, int64_t tp, int64_t rank);

}  // namespace baton::engine
