# Sanitizer and fuzzing builds (scripts/sanitize.sh configures both in build-asan/).
#   PPX_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer on every C/C++ target, any UB
#                    report is fatal (-fno-sanitize-recover).
#   PPX_FUZZ=ON:     clang only; libraries get libFuzzer's coverage instrumentation
#                    (-fsanitize=fuzzer-no-link) and the fuzz/ targets are built, linked with
#                    -fsanitize=fuzzer. Meant to be combined with PPX_SANITIZE=ON.
# Both must come before the add_subdirectory() calls: add_compile_options() applies to targets
# created after it.
option(PPX_SANITIZE "Build everything with -fsanitize=address,undefined" OFF)
option(PPX_FUZZ "Build the libFuzzer targets in fuzz/ (clang only)" OFF)

if(PPX_SANITIZE)
  set(PPX_SANITIZE_FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer
                         -fno-sanitize-recover=undefined)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${PPX_SANITIZE_FLAGS}>")
  add_link_options(-fsanitize=address,undefined)
endif()
if(PPX_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PPX_FUZZ=ON needs clang (CC=clang CXX=clang++): libFuzzer is part of clang")
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>")
endif()
