// The exception every part of the tokenizer throws: the message names what was wrong and where
// (the file and the JSON path, or the text offset).
#pragma once

#include <stdexcept>
#include <string>

namespace baton::data {

class TokenizerError : public std::runtime_error {
 public:
  explicit TokenizerError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace baton::data
