// The exception every part of the tokenizer throws: the message names what was wrong and where
// (the file and the JSON path, or the text offset).
#pragma once

#include <string>

#include "base/errors.h"

namespace baton::data {

class TokenizerError : public Error {
 public:
  explicit TokenizerError(const std::string& message) : Error(message) {}
};

}  // namespace baton::data
