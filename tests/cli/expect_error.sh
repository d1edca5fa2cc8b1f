#!/usr/bin/env bash
# expect_error.sh PATTERN CMD [ARGS...]: passes when CMD exits with status 1-127 (an error, not a
# crash or signal) and its stderr contains PATTERN (grep -E). With EXPECT_STATUS set, the status
# must be that one.
pattern=$1
shift
err=$("$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -eq 0 ]; then echo "expected failure, got success: $*"; exit 1; fi
if [ "$rc" -ge 128 ]; then echo "crashed with status $rc: $*"; echo "$err"; exit 1; fi
if [ -n "$EXPECT_STATUS" ] && [ "$rc" -ne "$EXPECT_STATUS" ]; then
  echo "expected status $EXPECT_STATUS, got $rc: $*"; echo "$err"; exit 1
fi
if ! grep -qE -- "$pattern" <<<"$err"; then echo "stderr lacks /$pattern/:"; echo "$err"; exit 1; fi
echo "ok ($rc): $(head -c 300 <<<"$err")"
