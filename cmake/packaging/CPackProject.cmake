# Read by cpack (CPACK_PROJECT_CONFIG_FILE) before it packages. CPackDeb looks dpkg-shlibdeps up
# with find_program(SHLIBDEPS_EXECUTABLE), which keeps a value already in the cache: point it at
# the wrapper that drops the CUDA libraries' packages from the computed Depends (CMakeLists.txt
# says why).
if(CPACK_PPX_SHLIBDEPS_WRAPPER)
  set(SHLIBDEPS_EXECUTABLE "${CPACK_PPX_SHLIBDEPS_WRAPPER}" CACHE FILEPATH "dpkg-shlibdeps without CUDA" FORCE)
endif()
