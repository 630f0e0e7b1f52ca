#include "engine/parallel/vocab_padding.h"

#include <algorithm>

#include "engine/errors.h"

namespace baton::engine {

int64_t padded_vocab_size(int64_t vocab_size, int64_t tp, int64_t divisible_by) {
  if (vocab_size < 1 || tp < 1 || divisible_by < 1)
    throw EngineError(detail::cat("vocabulary padding: vocab_size ", vocab_size, ", tp ", tp,
                                  " and make_vocab_size_divisible_by ", divisible_by,
                                  " must all be positive"));
  const int64_t multiple = divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

VocabShard vocab_shard(int64_t vocab_size, int64_t padded_size, int64_t tp, int64_t rank) {
  if (tp < 1 || padded_size < vocab_size || padded_size % tp != 0 || rank < 0 || rank >= tp)
    throw EngineError(detail::cat("vocab_shard: a table of ", padded_size,
                                  " rows cannot hold vocabulary ", vocab_size, " as rank ", rank,
                                  " of ", tp, " equal shards"));
  VocabShard s;
  s.rows = padded_size / tp;
  s.begin = rank * s.rows;
  s.real = std::clamp<int64_t>(vocab_size - s.begin, 0, s.rows);
  return s;
}

}  // namespace baton::engine
