#include "text/tokenizer/post_processor.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/tokenizer_error.h"

namespace baton::data {
namespace {

class Identity final : public PostProcessor {
 public:
  std::vector<int32_t> process(std::vector<int32_t> ids) const override { return ids; }
};

// The "single" template: special tokens' ids around the sequence ($A).
class TemplateProcessing final : public PostProcessor {
 public:
  // `pieces`: either the ids of a special token, or nullopt for the sequence itself.
  explicit TemplateProcessing(std::vector<std::optional<std::vector<int32_t>>> pieces)
      : pieces_(std::move(pieces)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids) const override {
    std::vector<int32_t> out;
    for (const auto& piece : pieces_) {
      if (piece)
        out.insert(out.end(), piece->begin(), piece->end());
      else
        out.insert(out.end(), ids.begin(), ids.end());
    }
    return out;
  }

 private:
  std::vector<std::optional<std::vector<int32_t>>> pieces_;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids) const override {
    for (const auto& part : parts_) ids = part->process(std::move(ids));
    return ids;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

std::unique_ptr<PostProcessor> make_template(const nlohmann::json& config,
                                             const std::string& where) {
  const auto& single = json_array(config, "single", where);
  const auto& specials = json_field(config, "special_tokens", where);
  std::vector<std::optional<std::vector<int32_t>>> pieces;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string here = where + ".single[" + std::to_string(i) + "]";
    const auto& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      const std::string id = json_string(piece["Sequence"], "id", here + ".Sequence");
      if (id != "A") {
        throw TokenizerError(here + ": the single-sequence template refers to sequence '" + id +
                             "'; only A exists");
      }
      pieces.emplace_back(std::nullopt);
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const std::string name = json_string(piece["SpecialToken"], "id", here + ".SpecialToken");
      const std::string sp_where = where + ".special_tokens[\"" + name + "\"]";
      if (!specials.is_object() || !specials.contains(name)) {
        throw TokenizerError(here + ": special token '" + name + "' is not in " + where +
                             ".special_tokens");
      }
      std::vector<int32_t> ids;
      for (const auto& id : json_array(specials[name], "ids", sp_where)) {
        if (!id.is_number_integer()) throw TokenizerError(sp_where + ".ids: expected integers");
        ids.push_back(id.get<int32_t>());
      }
      pieces.emplace_back(std::move(ids));
    } else {
      throw TokenizerError(here + ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  return std::make_unique<TemplateProcessing>(std::move(pieces));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& config,
                                                   const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = json_type(config, where);
  if (type == "TemplateProcessing") return make_template(config, where);
  if (type == "ByteLevel") return std::make_unique<Identity>();  // it only trims offsets
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    const auto& list = json_array(config, "processors", where);
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto part = make_post_processor(list[i], where + ".processors[" + std::to_string(i) + "]");
      if (part) parts.push_back(std::move(part));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  throw TokenizerError(where + ": unsupported post-processor type '" + type +
                       "' (baton supports TemplateProcessing, ByteLevel and Sequence)");
}

}  // namespace baton::data
