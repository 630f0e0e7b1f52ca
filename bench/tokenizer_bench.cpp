// tokenizer_bench: baton's tokenizer encoding (and decoding) a corpus on one thread.
// bench/tokenizer_bench.py drives it beside HF `tokenizers` on Qwen's real vocabulary.
//
//   ./build/bench/tokenizer_bench --tokenizer DIR --corpus FILE [--repeats 5]
//
// The corpus's lines (split at '\n', empty ones dropped) are the documents: each pass encodes
// every document with Tokenizer::encode (no special tokens), then decodes each one's ids. One
// untimed pass first (it fills the BPE cache, as a long-running loader's would be), then
// --repeats timed passes. The last line of stdout is JSON:
//   load_s                    Tokenizer::load of DIR
//   documents, bytes, tokens  per pass
//   encode_s, decode_s        median wall seconds of a pass
//   encode_tokens_per_s, encode_mb_per_s, decode_tokens_per_s   from those medians
//   encode_cpu_s, encode_cpu_tokens_per_s   the same by the process's CPU time (steadier than
//                             wall time on a shared VM, where other processes take turns)
//   ids_fnv1a                 64-bit FNV-1a of every id of a pass, in order (the driver checks
//                             that HF produced the same ids)
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"
#include "tools/cli.h"

namespace cli = baton::cli;
using baton::data::Tokenizer;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string tokenizer;
  std::string corpus;
  int64_t repeats = 5;
};

[[noreturn]] void usage(const std::string& error) {
  std::cerr << "tokenizer_bench: " << error
            << "\nusage: tokenizer_bench --tokenizer DIR --corpus FILE [--repeats N]\n";
  std::exit(2);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::string> read_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) usage("cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<std::string> docs;
  for (std::string& line : cli::split(text.str(), '\n')) {
    if (!line.empty()) docs.push_back(std::move(line));
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    cli::for_each_option(argc, argv, {}, [&](const std::string& key, const std::string& value) {
      if (key == "--tokenizer")
        args.tokenizer = value;
      else if (key == "--corpus")
        args.corpus = value;
      else if (key == "--repeats")
        args.repeats = cli::parse_int(value, key);
      else
        cli::unknown_option(key);
    });
  } catch (const cli::UsageError& e) {
    usage(e.what());
  }
  if (args.tokenizer.empty() || args.corpus.empty() || args.repeats < 1)
    usage("--tokenizer and --corpus are required, --repeats >= 1");

  const auto load_start = Clock::now();
  const Tokenizer tok = Tokenizer::load(args.tokenizer);
  const double load_s = seconds_since(load_start);
  const std::vector<std::string> docs = read_documents(args.corpus);
  std::size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();

  std::vector<std::vector<int32_t>> ids(docs.size());
  std::vector<double> encode_s, encode_cpu_s, decode_s;
  std::size_t tokens = 0, decoded_bytes = 0;
  for (int64_t pass = 0; pass <= args.repeats; ++pass) {
    auto start = Clock::now();
    const double cpu_start = cpu_seconds();
    for (std::size_t i = 0; i < docs.size(); ++i) ids[i] = tok.encode(docs[i], false);
    const double enc = seconds_since(start), enc_cpu = cpu_seconds() - cpu_start;
    start = Clock::now();
    decoded_bytes = 0;
    for (const auto& d : ids) decoded_bytes += tok.decode(d, false).size();
    const double dec = seconds_since(start);
    if (pass == 0) continue;  // the warm-up pass
    encode_s.push_back(enc);
    encode_cpu_s.push_back(enc_cpu);
    decode_s.push_back(dec);
  }
  uint64_t hash = 14695981039346656037ull;
  for (const auto& d : ids) {
    tokens += d.size();
    for (int32_t id : d) {
      hash ^= static_cast<uint32_t>(id);
      hash *= 1099511628211ull;
    }
  }
  const double enc = median(encode_s), enc_cpu = median(encode_cpu_s), dec = median(decode_s);
  const nlohmann::json out = {
      {"tokenizer", args.tokenizer},
      {"load_s", load_s},
      {"documents", docs.size()},
      {"bytes", bytes},
      {"tokens", tokens},
      {"repeats", args.repeats},
      {"encode_s", enc},
      {"decode_s", dec},
      {"encode_tokens_per_s", static_cast<double>(tokens) / enc},
      {"encode_mb_per_s", static_cast<double>(bytes) / enc / 1e6},
      {"encode_cpu_s", enc_cpu},
      {"encode_cpu_tokens_per_s", static_cast<double>(tokens) / enc_cpu},
      {"decode_tokens_per_s", static_cast<double>(tokens) / dec},
      {"decoded_bytes", decoded_bytes},
      {"ids_fnv1a", std::to_string(hash)},
  };
  std::cout << out.dump() << std::endl;
  return 0;
}
