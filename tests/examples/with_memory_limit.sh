#!/bin/sh
# with_memory_limit.sh KB PROGRAM ARGS...: runs PROGRAM under a virtual memory limit of KB
# kilobytes (ulimit -v), so that creating many threads fails the way a task limit makes it fail
# (root ignores ulimit -u).
limit=$1
shift
ulimit -v "$limit" && exec "$@"
