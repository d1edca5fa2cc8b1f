# Project-wide warning flags, applied through the ppx_warnings interface target.
add_library(ppx_warnings INTERFACE)
target_compile_options(ppx_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unknown-pragmas>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${PPX_WERROR}>>:-Werror>)
# OpenMP SIMD pragmas only (no threading runtime): lets the compiler vectorise fp32 reductions.
add_library(ppx_simd INTERFACE)
target_compile_options(ppx_simd INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp-simd>)
