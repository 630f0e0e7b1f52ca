#include "text/tokenizer/normalizer.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/tokenizer_error.h"
#include "text/tokenizer/unicode_nfc.h"

namespace baton::data {
namespace {

class Nfc final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return to_nfc(text); }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string normalize(std::string_view text) const override {
    std::string out(text);
    for (const auto& part : parts_) out = part->normalize(out);
    return out;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config,
                                            const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = json_type(config, where);
  if (type == "NFC") return std::make_unique<Nfc>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    const auto& list = json_array(config, "normalizers", where);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto part = make_normalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]");
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  throw TokenizerError(where + ": unsupported normalizer type '" + type +
                       "' (baton supports NFC and Sequence)");
}

}  // namespace baton::data
