# Include layering, checked at every build (the `check_layers` target, part of ALL): a source file
# of a module may include project headers only from the modules below it. A wrong-way include
# (the server including app code, the engine including the server, a public header including a
# private one) fails the build with the file, the line and the rule.
#
#   cmake -DSRC=<repo root> -P cmake/CheckLayers.cmake
#
# Module of a file: include/ppx (public headers) or src/<dir>. Project headers are included as
# "<module>/<name>" ("ppx/..." for the public ones); kernel headers (kernels/, no prefix) are
# the CUDA backend's and are not checked here.
cmake_minimum_required(VERSION 3.20)
if(NOT SRC)
  message(FATAL_ERROR "CheckLayers.cmake: pass -DSRC=<repository root>")
endif()

# Allowed include prefixes per module (besides the module itself).
set(allow_ppx "")
set(allow_core "ppx")
set(allow_audio "ppx")
set(allow_backend "ppx;lm")
set(allow_codec "ppx;backend")
set(allow_lm "ppx;backend")
set(allow_engine "ppx")
set(allow_server "ppx;engine")
set(allow_apps "ppx;engine;server;backend;lm;codec;audio;core")
set(modules ppx core audio backend codec lm engine server apps)

file(GLOB_RECURSE files RELATIVE "${SRC}" "${SRC}/include/ppx/*.h" "${SRC}/src/*.h" "${SRC}/src/*.cpp")
set(errors "")
foreach(f IN LISTS files)
  if(f MATCHES "^include/ppx/")
    set(mod ppx)
  elseif(f MATCHES "^src/([a-z_]+)/")
    set(mod "${CMAKE_MATCH_1}")
  else()
    continue()
  endif()
  if(NOT mod IN_LIST modules)
    list(APPEND errors "${f}: module '${mod}' has no layering rule in cmake/CheckLayers.cmake")
    continue()
  endif()
  file(STRINGS "${SRC}/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"[a-z_]+/")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"([a-z_]+)/[^\"]*\"" inc "${line}")
    set(dir "${CMAKE_MATCH_1}")
    if(dir STREQUAL mod OR NOT dir IN_LIST modules)
      continue()
    endif()
    if(NOT dir IN_LIST allow_${mod})
      list(APPEND errors "${f}: ${inc}: module '${mod}' may include only its own headers and: ${allow_${mod}}")
    endif()
  endforeach()
endforeach()
if(errors)
  list(JOIN errors "\n  " msg)
  message(FATAL_ERROR "wrong-way includes:\n  ${msg}")
endif()
