// A whole (single-process) model of an HF fixture in tests/engine/fixtures:
// its config, its weights converted to the engine's layout.
//
// Example:
//   auto model = test::load_fixture_model("tiny-qwen3");
//   auto lora = test::load_fixture_model("tiny-llama", TransformerOptions{...});
#pragma once

#include <memory>
#include <string>

#include "engine/io/model_config.h"
#include "engine/io/safetensors.h"
#include "engine/io/weight_conversion.h"
#include "engine/model/transformer.h"

namespace baton::engine::test {

// REQUIRES: BATON_FIXTURES_DIR is defined (the test target's compile definition).
inline std::shared_ptr<Transformer> load_fixture_model(const std::string& fixture,
                                                       const ModelConfig& config,
                                                       TransformerOptions options = {}) {
  const std::string dir = std::string(BATON_FIXTURES_DIR) + "/" + fixture;
  auto model = std::make_shared<Transformer>(config, ParallelState::single(), options);
  model->load_state_dict(hf_to_shard(read_hf_weights(dir), config,
                                     ShardSpec::for_rank(config, 0, 1, 0, {config.num_layers})));
  return model;
}

inline std::shared_ptr<Transformer> load_fixture_model(const std::string& fixture,
                                                       TransformerOptions options = {}) {
  return load_fixture_model(
      fixture, ModelConfig::load(std::string(BATON_FIXTURES_DIR) + "/" + fixture), options);
}

}  // namespace baton::engine::test
