// libFuzzer target: the torch.save voice reader, in memory (ppx::read_pt_tensors_from_bytes).
// Every input must load or throw ppx::Error; a loaded tensor's data must match its shape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "ppx/error.h"
#include "ppx/pt_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tensors = ppx::read_pt_tensors_from_bytes(data, size, "fuzz.pt");
    for (const auto& [key, t] : tensors) {
      size_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
      if (t.f32.size() + t.i64.size() != numel) std::abort();
      if (!t.f32.empty() && !t.i64.empty()) std::abort();
    }
  } catch (const ppx::Error&) {
  }
  return 0;
}
