// The tiny demo model (tests/data: config a, Mimi and LM) on the CPU backend, for tests that run
// whole conversations.
#pragma once

#include <memory>

#include "ppx/backend.h"
#include "ppx/config.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"

namespace ppx::test {

struct TinyModel {
  ModelConfig cfg = load_config(data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(data("lm_tiny_a.safetensors"))};
  FileWeights mw{std::make_shared<const SafeTensors>(data("mimi_tiny_a.safetensors"))};
  std::unique_ptr<ModelBackend> backend =
      make_cpu_backend(std::make_unique<Mimi>(cfg.mimi, mw), std::make_unique<Lm>(*cfg.lm, lw));
};

}  // namespace ppx::test
