// A character-level tokenizer (every printable ASCII character and "\n" is a
// token) with ChatML's special tokens and a ChatML chat template that renders
// tool messages as Qwen2.5's does (consecutive ones share a user turn, each in
// its <tool_response> block), for tests of multi-turn rollouts. 101 ids: it
// fits the tiny fixture models' 128-token vocabulary.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace baton::test {

// Every newline is in an expression: transformers renders with trim_blocks
// and lstrip_blocks.
inline constexpr const char* kChatmlTemplate =
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

inline nlohmann::json chatml_tokenizer_json() {
  using nlohmann::json;
  json vocab = json::object();
  json added = json::array();
  int64_t id = 0;
  for (const char* t : {"<pad>", "<|im_end|>", "<|im_start|>", "<eos>"}) {
    added.push_back({{"id", id},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    vocab[t] = id++;
  }
  for (int c = 32; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = id++;
  vocab["\n"] = id++;
  vocab["<unk>"] = id++;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Split"},
            {"pattern", {{"Regex", "[\\s\\S]"}}},
            {"behavior", "Isolated"},
            {"invert", false}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Fuse"}}},
          {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "<unk>"}}}};
}

inline nlohmann::json chatml_tokenizer_config_json() {
  return {{"eos_token", "<|im_end|>"}, {"pad_token", "<pad>"}, {"chat_template", kChatmlTemplate}};
}

inline data::Tokenizer chatml_tokenizer() {
  return data::Tokenizer::from_json(chatml_tokenizer_json().dump(),
                                    chatml_tokenizer_config_json().dump(), "chatml_tokenizer.h");
}

// Writes tokenizer.json and tokenizer_config.json into `dir` (created).
inline void write_chatml_tokenizer(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << chatml_tokenizer_json().dump();
  std::ofstream(dir / "tokenizer_config.json") << chatml_tokenizer_config_json().dump();
}

}  // namespace baton::test
