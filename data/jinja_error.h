// The exception the Jinja interpreter throws, at load (a construct outside the supported subset,
// a syntax error) and at render (raise_exception, an undefined value used, a type error). The
// message names the template's source and line. It derives from TokenizerError because chat
// templates come with the tokenizer, so callers that catch tokenizer errors catch these too.
#pragma once

#include <string>

#include "data/tokenizer_error.h"

namespace baton::data {

class JinjaError : public TokenizerError {
 public:
  explicit JinjaError(const std::string& message) : TokenizerError(message) {}
};

}  // namespace baton::data
