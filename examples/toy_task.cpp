// toy_task: the project's own RL toy task, small enough to learn on 2 CPU cores.
//
//   toy_task --out DIR [--seed S] [--max-operand N] [--val-size V]
//            [--train-size T] [--carry-noise P] [--hidden H] [--layers L]
//            [--heads A] [--head-dim D] [--family qwen2|qwen3|qwen3_moe]
//            [--experts E] [--experts-per-token K] [--op add|mul]
//            [--tool-share Q]
//
// The task is addition: the prompt "a+b=" (0 <= a, b < N), the answer in
// GSM8K's strict form "#### c". DIR receives
//   data/train.jsonl, data/val.jsonl  verl-format prompt rows (data_source
//                                     "openai/gsm8k", so the registry's GSM8K
//                                     reward scores them; ground_truth "c");
//                                     val holds V problems, train the rest
//                                     (the next T of them with --train-size)
//   data/sft.jsonl                    {"prompt": "a+b=", "response": "#### c"}
//                                     for every train problem (the SFT driver
//                                     appends the eos token); with probability
//                                     P a problem whose units digits carry gets
//                                     the answer without that carry (c - 10),
//                                     so a model fitted to it is right about
//                                     the carry only some of the time: a base
//                                     that is close, for RL to correct
//   model/                            a tiny model with seeded random weights
//                                     (config.json, model.safetensors) and a
//                                     character-level WordLevel tokenizer
//                                     (tokenizer.json, tokenizer_config.json):
//                                     with --family qwen2 (the default) a
//                                     Qwen2ForCausalLM (q/k/v biases); qwen3 a
//                                     Qwen3ForCausalLM (per-head q/k norms, no
//                                     biases, head_dim D, default H / A);
//                                     qwen3_moe a Qwen3MoeForCausalLM like it
//                                     whose layers after the first (dense, so
//                                     both MLP kinds train) have E experts of
//                                     width H, K of them per token (default
//                                     4 and 2), and a load-balancing loss of
//                                     weight 0.01 in the RL update
//
// --op mul makes it multiplication ("a*b=", ground truth a*b; no carry noise).
//
// --tool-share Q makes it a tool task in chat form, for multi-turn rollouts
// (configs/grpo_tool_toy.yaml): the tokenizer gets ChatML's tokens, a chat
// template (tool results in <tool_response> blocks of a user turn, as
// Qwen2.5's) and word tokens for the call's fixed parts ("<tool_call>",
// "\"calculator\"", ...), as a BPE would merge them; the model's end of turn
// is <|im_end|> and it has 128 positions. Prompts are chat messages
// [{"role": "user", "content": "a*b"}]; an SFT row's prompt is that rendered
// by the template, and its response, with probability Q, a call of the
// calculator tool in Qwen's Hermes form, the tool's result rendered as the
// template renders a tool turn, and "#### c"; otherwise "#### c" directly
// (for 3-digit products: what a tiny model rarely gets right without the
// tool).
//
// Everything is a function of the options: the same seed gives the same bytes.
// Exit status: 0 on success, 1 when writing fails, 2 for a usage error.
#include <ATen/ATen.h>

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/io/hf_model.h"
#include "engine/io/model_config.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"
#include "engine/parallel/parallel_state.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kUsage =
    "usage: toy_task --out DIR [--seed S] [--max-operand N] [--val-size V]\n"
    "                [--train-size T] [--carry-noise P] [--hidden H] [--layers L]\n"
    "                [--heads A] [--head-dim D] [--family qwen2|qwen3|qwen3_moe]\n"
    "                [--experts E] [--experts-per-token K] [--op add|mul]\n"
    "                [--tool-share Q]\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Family { kQwen2, kQwen3, kQwen3Moe };

struct Options {
  fs::path out;
  uint64_t seed = 1;
  int64_t max_operand = 100;  // operands in [0, max_operand)
  int64_t val_size = 256;
  int64_t train_size = -1;   // -1: every problem that is not in val
  double carry_noise = 0.5;  // share of carrying SFT answers that drop the carry
  int64_t hidden = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t head_dim = 0;  // 0: hidden / heads
  Family family = Family::kQwen2;
  int64_t experts = 4;            // qwen3_moe
  int64_t experts_per_token = 2;  // qwen3_moe
  bool multiply = false;          // --op mul
  double tool_share = -1;         // < 0: no tool (plain prompts); else the chat tool task
  bool chat() const { return tool_share >= 0; }
};

int64_t parse_int(const std::string& text, const std::string& flag, int64_t min) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(flag + " expects an integer, got \"" + text + "\"");
  if (v < min) throw UsageError(flag + " must be at least " + std::to_string(min));
  return v;
}

double parse_probability(const std::string& text, const std::string& flag) {
  std::size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(v >= 0.0 && v <= 1.0))
    throw UsageError(flag + " expects a number in [0, 1], got \"" + text + "\"");
  return v;
}

Family parse_family(const std::string& text) {
  if (text == "qwen2") return Family::kQwen2;
  if (text == "qwen3") return Family::kQwen3;
  if (text == "qwen3_moe") return Family::kQwen3Moe;
  throw UsageError("--family expects qwen2, qwen3 or qwen3_moe, got \"" + text + "\"");
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool have_out = false, have_moe_flag = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") throw UsageError("");
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--out") {
      o.out = value;
      have_out = true;
    } else if (flag == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(value, flag, 0));
    } else if (flag == "--max-operand") {
      o.max_operand = parse_int(value, flag, 2);
    } else if (flag == "--val-size") {
      o.val_size = parse_int(value, flag, 1);
    } else if (flag == "--train-size") {
      o.train_size = parse_int(value, flag, 1);
    } else if (flag == "--carry-noise") {
      o.carry_noise = parse_probability(value, flag);
    } else if (flag == "--hidden") {
      o.hidden = parse_int(value, flag, 1);
    } else if (flag == "--layers") {
      o.layers = parse_int(value, flag, 1);
    } else if (flag == "--heads") {
      o.heads = parse_int(value, flag, 1);
    } else if (flag == "--head-dim") {
      o.head_dim = parse_int(value, flag, 1);
    } else if (flag == "--family") {
      o.family = parse_family(value);
    } else if (flag == "--op") {
      if (value != "add" && value != "mul")
        throw UsageError("--op expects add or mul, got \"" + value + "\"");
      o.multiply = value == "mul";
    } else if (flag == "--tool-share") {
      o.tool_share = parse_probability(value, flag);
    } else if (flag == "--experts") {
      o.experts = parse_int(value, flag, 1);
      have_moe_flag = true;
    } else if (flag == "--experts-per-token") {
      o.experts_per_token = parse_int(value, flag, 1);
      have_moe_flag = true;
    } else {
      throw UsageError("unknown option " + flag);
    }
  }
  if (!have_out) throw UsageError("--out is required");
  if (o.val_size >= o.max_operand * o.max_operand)
    throw UsageError("--val-size must leave training problems (at most " +
                     std::to_string(o.max_operand * o.max_operand - 1) + ")");
  if (o.train_size > o.max_operand * o.max_operand - o.val_size)
    throw UsageError("--train-size " + std::to_string(o.train_size) + " is more than the " +
                     std::to_string(o.max_operand * o.max_operand - o.val_size) +
                     " problems --val-size leaves");
  if (o.head_dim > 0 && o.family == Family::kQwen2)
    throw UsageError("--head-dim needs --family qwen3 or qwen3_moe (Qwen2's is hidden / heads)");
  if (have_moe_flag && o.family != Family::kQwen3Moe)
    throw UsageError("--experts and --experts-per-token need --family qwen3_moe");
  if (o.experts_per_token > o.experts)
    throw UsageError("--experts-per-token (" + std::to_string(o.experts_per_token) +
                     ") must be at most --experts (" + std::to_string(o.experts) + ")");
  if (o.head_dim == 0 && o.hidden % o.heads != 0)
    throw UsageError("--heads (" + std::to_string(o.heads) + ") must divide --hidden (" +
                     std::to_string(o.hidden) + ")");
  return o;
}

// The tokenizer's vocabulary: special tokens first, then (in chat form) the
// word tokens, then one token per character.
const std::vector<std::string>& special_tokens(bool chat) {
  static const std::vector<std::string> plain = {"<pad>", "<eos>", "<unk>"};
  static const std::vector<std::string> chatml = {"<pad>", "<|im_end|>", "<unk>", "<|im_start|>"};
  return chat ? chatml : plain;
}
const std::vector<std::string>& word_tokens(bool chat) {
  static const std::vector<std::string> none;
  static const std::vector<std::string> words = {
      "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "user",
      "assistant",   "\"name\"",     "\"arguments\"",   "\"expression\"", "\"calculator\""};
  return chat ? words : none;
}
constexpr const char* kCharacters = "0123456789+-*= #";
// Chat form: also what tool calls, tool errors and template glue write.
constexpr const char* kChatCharacters =
    "\n{}[]\":,./()_'!?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

// ChatML, with consecutive tool messages in one user turn, each in its
// <tool_response> block (Qwen2.5's layout, without its system prompt).
constexpr const char* kChatTemplate =
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

std::string characters(bool chat) {
  return std::string(kCharacters) + (chat ? kChatCharacters : "");
}

json tokenizer_json(bool chat) {
  json vocab = json::object();
  json added = json::array();
  int64_t id = 0;
  const auto add = [&](const std::string& t, bool special) {
    added.push_back({{"id", id},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
    vocab[t] = id++;
  };
  for (const std::string& t : special_tokens(chat)) add(t, true);
  for (const std::string& t : word_tokens(chat)) add(t, false);
  for (char c : characters(chat)) vocab[std::string(1, c)] = id++;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          // Every character is its own piece; the WordLevel model maps it to its id.
          // [\s\S], not (?s).: HF's tokenizers (Oniguruma) refuses the (?s) flag.
          {"pre_tokenizer",
           {{"type", "Split"},
            {"pattern", {{"Regex", chat ? "[\\s\\S]" : "."}}},
            {"behavior", "Isolated"},
            {"invert", false}}},
          {"post_processor", nullptr},
          // Fuse joins the characters without the spaces a decoder-less decode inserts.
          {"decoder", {{"type", "Fuse"}}},
          {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "<unk>"}}}};
}

json tokenizer_config_json(bool chat) {
  json c = {{"tokenizer_class", "PreTrainedTokenizerFast"},
            {"bos_token", nullptr},
            {"eos_token", chat ? "<|im_end|>" : "<eos>"},
            {"pad_token", "<pad>"},
            {"unk_token", "<unk>"},
            {"add_bos_token", false},
            {"add_eos_token", false},
            {"model_max_length", chat ? 128 : 64}};
  if (chat) c["chat_template"] = kChatTemplate;
  return c;
}

int64_t vocab_size(bool chat) {
  return static_cast<int64_t>(special_tokens(chat).size() + word_tokens(chat).size() +
                              characters(chat).size());
}

baton::engine::ModelConfig model_config(const Options& o) {
  using baton::engine::ModelFamily;
  baton::engine::ModelConfig cfg;
  switch (o.family) {
    case Family::kQwen2:
      cfg.architecture = "Qwen2ForCausalLM";
      cfg.family = ModelFamily::kQwen2;
      cfg.qkv_bias = true;  // Qwen2 always has them
      break;
    case Family::kQwen3:
      cfg.architecture = "Qwen3ForCausalLM";
      cfg.family = ModelFamily::kQwen3;
      cfg.qk_norm = true;
      break;
    case Family::kQwen3Moe:
      cfg.architecture = "Qwen3MoeForCausalLM";
      cfg.family = ModelFamily::kQwen3Moe;
      cfg.qk_norm = true;
      cfg.moe.num_experts = o.experts;
      cfg.moe.top_k = o.experts_per_token;
      // Two of them per token: about the dense MLP's width.
      cfg.moe.intermediate_size = o.hidden;
      cfg.moe.norm_topk_prob = true;
      cfg.moe.mlp_only_layers = {0};  // a dense first layer: both MLP kinds train
      cfg.moe.router_aux_loss_coef = 0.01;
      break;
  }
  cfg.vocab_size = vocab_size(o.chat());
  cfg.hidden_size = o.hidden;
  cfg.intermediate_size = 2 * o.hidden;
  cfg.num_layers = o.layers;
  cfg.num_heads = o.heads;
  cfg.num_kv_heads = o.heads;
  cfg.head_dim = o.head_dim > 0 ? o.head_dim : o.hidden / o.heads;
  cfg.max_position_embeddings = o.chat() ? 128 : 64;
  cfg.rms_norm_eps = 1e-6;
  cfg.rope_theta = 10000.0;
  cfg.tie_word_embeddings = false;
  cfg.torch_dtype = "float32";
  cfg.eos_token_ids = {1};  // "<eos>", or "<|im_end|>" in chat form
  return cfg;
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw std::runtime_error(file.string() + ": cannot write");
}

void write_model(const Options& o) {
  const fs::path dir = o.out / "model";
  fs::create_directories(dir);
  const auto cfg = model_config(o);
  at::manual_seed(o.seed);
  auto model =
      std::make_shared<baton::engine::Transformer>(cfg, baton::engine::ParallelState::single());
  auto state = model->state_dict();
  // A sparse layer's router and experts start as zeros (they are normally
  // loaded): drawn here as the dense layers' linear maps are, N(0, 0.02).
  for (auto& [name, w] : state)
    if (name.find(".mlp.router.") != std::string::npos ||
        name.find(".mlp.experts.") != std::string::npos)
      w = at::randn(w.sizes(), w.options()) * 0.02;
  const auto hf = baton::engine::shards_to_hf(
      {{baton::engine::TensorMap(state.begin(), state.end())}}, cfg, {cfg.num_layers},
      /*value_model=*/false, model->parallel().config().make_vocab_size_divisible_by);
  // Keys HF's generation config reads that ModelConfig does not model.
  const json base = {{"pad_token_id", 0}, {"bos_token_id", nullptr}};
  baton::engine::save_hf_model(dir, cfg, hf, /*value_model=*/false,
                               baton::engine::kDefaultMaxShardBytes, &base);
  write_text(dir / "tokenizer.json", tokenizer_json(o.chat()).dump(2) + "\n");
  write_text(dir / "tokenizer_config.json", tokenizer_config_json(o.chat()).dump(2) + "\n");
}

struct Problem {
  int64_t a = 0, b = 0;
};

// Every (a, b) pair in a seeded order (Fisher-Yates on mt19937_64, whose output
// the standard fixes, so the order is the same with every standard library).
std::vector<Problem> shuffled_problems(const Options& o) {
  std::vector<Problem> all;
  for (int64_t a = 0; a < o.max_operand; ++a)
    for (int64_t b = 0; b < o.max_operand; ++b) all.push_back({a, b});
  std::mt19937_64 rng(o.seed);
  for (std::size_t i = all.size() - 1; i > 0; --i) std::swap(all[i], all[rng() % (i + 1)]);
  return all;
}

std::string expression_of(const Problem& p, const Options& o) {
  return std::to_string(p.a) + (o.multiply ? "*" : "+") + std::to_string(p.b);
}

std::string prompt_of(const Problem& p, const Options& o) { return expression_of(p, o) + "="; }

// Chat form: the user turn and the assistant prefix, as the template renders
// [{"role": "user", "content": "a*b"}] with the generation prompt.
std::string rendered_prompt_of(const Problem& p, const Options& o) {
  return "<|im_start|>user\n" + expression_of(p, o) + "<|im_end|>\n<|im_start|>assistant\n";
}

// Chat form: the calculator's call in Qwen's Hermes form, its result as the
// template's tool turn after the model's <|im_end|>, and the answer.
std::string tool_response_of(const Problem& p, const Options& o, const std::string& answer) {
  // As Qwen writes it: json.dumps's separators, keys in the schema's order.
  const std::string call = R"({"name": "calculator", "arguments": {"expression": ")" +
                           expression_of(p, o) + R"("}})";
  return "<tool_call>\n" + call + "\n</tool_call><|im_end|>\n" +
         "<|im_start|>user\n<tool_response>\n" + answer +
         "\n</tool_response><|im_end|>\n<|im_start|>assistant\n#### " + answer;
}

void write_data(const Options& o) {
  const fs::path dir = o.out / "data";
  fs::create_directories(dir);
  const auto problems = shuffled_problems(o);
  // A stream of its own, so that the noise does not change the problems' order.
  std::mt19937_64 noise(o.seed ^ 0x9e3779b97f4a7c15ULL);
  std::string train, val, sft;
  const std::size_t rows =
      o.train_size < 0 ? problems.size() : static_cast<std::size_t>(o.val_size + o.train_size);
  for (std::size_t i = 0; i < rows; ++i) {
    const Problem& p = problems[i];
    const bool is_val = static_cast<int64_t>(i) < o.val_size;
    const std::string answer = std::to_string(o.multiply ? p.a * p.b : p.a + p.b);
    const json prompt =
        o.chat() ? json::array({{{"role", "user"}, {"content", expression_of(p, o)}}})
                 : json(prompt_of(p, o));
    const json row = {
        {"data_source", "openai/gsm8k"},
        {"prompt", prompt},
        {"ability", "arithmetic"},
        {"reward_model", {{"style", "rule"}, {"ground_truth", answer}}},
        {"extra_info", {{"split", is_val ? "val" : "train"}, {"a", p.a}, {"b", p.b}}}};
    (is_val ? val : train) += row.dump() + "\n";
    if (is_val) continue;
    // 53 random bits → [0, 1), drawn for every train row so the stream does not
    // depend on which rows carry.
    const double u = static_cast<double>(noise() >> 11) * 0x1.0p-53;
    if (o.chat()) {
      const bool tool = u < o.tool_share;
      sft += json{{"prompt", rendered_prompt_of(p, o)},
                  {"response", tool ? tool_response_of(p, o, answer) : "#### " + answer}}
                 .dump() +
             "\n";
      continue;
    }
    const bool carries = !o.multiply && p.a % 10 + p.b % 10 >= 10;
    const std::string target =
        carries && u < o.carry_noise ? std::to_string(p.a + p.b - 10) : answer;
    sft += json{{"prompt", prompt_of(p, o)}, {"response", "#### " + target}}.dump() + "\n";
  }
  write_text(dir / "train.jsonl", train);
  write_text(dir / "val.jsonl", val);
  write_text(dir / "sft.jsonl", sft);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_args(argc, argv);
  } catch (const UsageError& e) {
    if (*e.what() != '\0') std::cerr << "toy_task: " << e.what() << "\n";
    std::cerr << kUsage;
    return 2;
  }
  try {
    write_data(o);
    write_model(o);
  } catch (const std::exception& e) {
    std::cerr << "toy_task: " << e.what() << "\n";
    return 1;
  }
  std::cout << "toy_task: wrote " << (o.out / "data").string() << " and "
            << (o.out / "model").string() << "\n";
  return 0;
}
