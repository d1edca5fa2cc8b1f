# Every dependency comes from Debian packages; scripts/setup.sh installs them.
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SNDFILE REQUIRED IMPORTED_TARGET sndfile)
pkg_check_modules(SOXR REQUIRED IMPORTED_TARGET soxr)
pkg_check_modules(EBUR128 REQUIRED IMPORTED_TARGET libebur128)
pkg_check_modules(OPUS REQUIRED IMPORTED_TARGET opus)
pkg_check_modules(OGG REQUIRED IMPORTED_TARGET ogg)
find_library(SENTENCEPIECE_LIB sentencepiece REQUIRED)
find_path(SENTENCEPIECE_INCLUDE sentencepiece_processor.h REQUIRED)
if(PPX_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
# The server: Boost.Beast and Boost.Asio (header-only, libboost-dev) on POSIX threads.
find_package(Boost 1.70 REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED)  # TLS in the server (--ssl); SHA-256 of the prompt cache keys
