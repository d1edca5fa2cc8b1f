// libFuzzer target: the safetensors reader. SafeTensors takes a path and mmaps it, so the input
// is written to a memfd opened through /proc/self/fd/N. Every tensor it accepts is converted.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ppx/error.h"
#include "ppx/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t w = ::write(fd, data + done, size - done);
    if (w <= 0) std::abort();
    done += static_cast<size_t>(w);
  }
  try {
    ppx::SafeTensors st("/proc/self/fd/" + std::to_string(fd));
    for (const auto& [name, info] : st.tensors()) {
      if (info.nbytes > size) std::abort();  // data lies inside the input
      try {
        const auto f = st.to_f32(name);
        if (f.size() != static_cast<size_t>(info.numel())) std::abort();
      } catch (const ppx::Error&) {
      }
      try {
        const auto i = st.to_i64(name);
        if (i.size() != static_cast<size_t>(info.numel())) std::abort();
      } catch (const ppx::Error&) {
      }
    }
  } catch (const ppx::Error&) {
  }
  ::close(fd);
  return 0;
}
