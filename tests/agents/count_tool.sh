#!/bin/bash
# A user tool for the chaos test: counts its executions per call (per
# idempotency key RUN/SEQ) in $CAIRN_CHAOS_TOOL_DIR and returns the count, so
# a call that ran again after its result was journaled shows as a journaled
# count below the file's.
set -eu
cat > /dev/null
file="$CAIRN_CHAOS_TOOL_DIR/$(printf '%s' "$CAIRN_IDEMPOTENCY_KEY" | tr '/' '_')"
exec 9>> "$file.lock"
flock 9
n=$(( $(cat "$file" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$file"
printf '{"key":"%s","call":%s}\n' "$CAIRN_IDEMPOTENCY_KEY" "$n"
