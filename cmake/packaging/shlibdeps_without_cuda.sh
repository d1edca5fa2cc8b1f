#!/bin/sh
# dpkg-shlibdeps, with the packages of NVIDIA's CUDA libraries removed from the Depends it
# prints (cuda-*, libcublas*, libcudart*, libnv*, nvidia-*): the CUDA build needs libcublas.so.*
# at run time, but GPU boxes install it under many package names (docs/deploy.md). Everything
# else (--version, --help, the warnings on stderr, the exit status) passes through.
out=$(dpkg-shlibdeps "$@") || exit $?
printf '%s\n' "$out" | awk '
  /^shlibs:Depends=/ {
    n = split(substr($0, 16), deps, /, /)
    line = ""
    for (i = 1; i <= n; i++) {
      if (deps[i] ~ /^(cuda-|libcublas|libcudart|libcufft|libcurand|libcusparse|libcusolver|libnv|nvidia-)/) continue
      line = line (line == "" ? "" : ", ") deps[i]
    }
    print "shlibs:Depends=" line
    next
  }
  { print }'
