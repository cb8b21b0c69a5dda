#!/usr/bin/env python3
# Clears O_NONBLOCK on fd 3, then becomes $BENCH_AGENT (see empty_step.mjs).
import fcntl, os
fcntl.fcntl(3, fcntl.F_SETFL, fcntl.fcntl(3, fcntl.F_GETFL) & ~os.O_NONBLOCK)
os.execv(os.environ["BENCH_AGENT"], [os.environ["BENCH_AGENT"]])
