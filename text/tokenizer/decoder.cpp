#include "text/tokenizer/decoder.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/regex.h"
#include "text/tokenizer/tokenizer_error.h"
#include "text/utf8.h"

namespace baton::data {
namespace {

// Bytes back from the byte-level alphabet; a token with any character outside it is kept as
// it is (HF's ByteLevel decoder). The bytes are read as UTF-8 with U+FFFD for invalid parts.
class ByteLevelDecoder final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const std::size_t mark = bytes.size();
      bool in_alphabet = true;
      for (char32_t cp : utf8::decode(token)) {
        const int b = byte_level::byte_of(cp);
        if (b < 0) {
          in_alphabet = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!in_alphabet) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    return {utf8::from_bytes_lossy(bytes)};
  }
};

class Fuse final : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string out;
    for (const std::string& token : tokens) out += token;
    return {out};
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class Strip final : public Decoder {
 public:
  Strip(char32_t content, std::size_t start, std::size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& token : tokens) {
      const std::vector<char32_t> cps = utf8::decode(token);
      std::size_t begin = 0;
      while (begin < start_ && begin < cps.size() && cps[begin] == content_) ++begin;
      std::size_t end = cps.size();
      while (cps.size() - end < stop_ && end > begin && cps[end - 1] == content_) --end;
      token = utf8::encode(std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(begin),
                                                 cps.begin() + static_cast<std::ptrdiff_t>(end)));
    }
    return tokens;
  }

 private:
  char32_t content_;
  std::size_t start_, stop_;
};

class Replace final : public Decoder {
 public:
  Replace(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (std::string& token : tokens) {
      std::string out;
      std::size_t prev = 0;
      for (const auto& [begin, end] : pattern_.find_all(token)) {
        out.append(token, prev, begin - prev);
        out += content_;
        prev = end;
      }
      out.append(token, prev, std::string::npos);
      token = std::move(out);
    }
    return tokens;
  }

 private:
  Regex pattern_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& part : parts_) tokens = part->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

std::size_t count_field(const nlohmann::json& config, const char* key, const std::string& where) {
  const int64_t n = json_int(config, key, where);
  if (n < 0) throw TokenizerError(where + "." + key + ": expected a count >= 0");
  return static_cast<std::size_t>(n);
}

}  // namespace

std::string Decoder::decode(std::vector<std::string> tokens) const {
  std::string out;
  for (const std::string& part : decode_chain(std::move(tokens))) out += part;
  return out;
}

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = json_type(config, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    const std::string content = json_string(config, "content", where);
    const std::vector<char32_t> cps =
        utf8::is_valid(content) ? utf8::decode(content) : std::vector<char32_t>{};
    if (cps.size() != 1) throw TokenizerError(where + ".content: expected one character");
    return std::make_unique<Strip>(cps[0], count_field(config, "start", where),
                                   count_field(config, "stop", where));
  }
  if (type == "Replace") {
    return std::make_unique<Replace>(Regex::from_pattern_field(config, where),
                                     json_string(config, "content", where));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    const auto& list = json_array(config, "decoders", where);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto part = make_decoder(list[i], where + ".decoders[" + std::to_string(i) + "]");
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  throw TokenizerError(where + ": unsupported decoder type '" + type +
                       "' (baton supports ByteLevel, Fuse, Strip, Replace and Sequence)");
}

}  // namespace baton::data
