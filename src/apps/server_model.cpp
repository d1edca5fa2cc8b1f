#include "apps/server_model.h"

#include "ppx/error.h"

namespace ppx::app {

server::ServerModel server_model(const LoadedModel& m) {
  server::ServerModel sm;
  sm.backend = m.backend.get();
  sm.tokenizer = m.tokenizer.get();
  if (!m.cfg.lm_gen) throw Error("the model config has no generation settings (lm_gen)");
  sm.gen = *m.cfg.lm_gen;
  sm.sample_rate = m.cfg.mimi.sample_rate;
  sm.frame_samples = m.cfg.mimi.frame_samples();
  sm.description = m.description;
  sm.device_index = m.device_index;
  sm.dep_steps = m.dep_steps;
  sm.speed_flags = m.speed_flags;
  sm.capacity = m.backend->capacity();
  return sm;
}

}  // namespace ppx::app
