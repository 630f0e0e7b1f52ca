// The exception the Jinja interpreter throws, at load (a construct outside the supported subset,
// a syntax error) and at render (raise_exception, an undefined value used, a type error). The
// message names the template's source and line. A chat template (text/chat_template.h) throws
// it and TokenizerError: catch baton::Error for both.
#pragma once

#include <string>

#include "base/errors.h"

namespace baton::data {

class JinjaError : public Error {
 public:
  explicit JinjaError(const std::string& message) : Error(message) {}
};

}  // namespace baton::data
