#!/bin/bash
# A user tool for tests. Appends "KEY ARGS" to $CAIRN_TEST_TOOL_LOG for every
# call, then behaves per args.mode: "ok" (default) prints a JSON result,
# "hang" never answers, "garbage" prints text, "huge" prints 4 MiB, "crash"
# exits 3 with a message on stderr, "env" reports which host variables it saw
# and the CAIRN_ variables it was given.
set -u
args=$(cat)
echo "$CAIRN_IDEMPOTENCY_KEY $args" >> "${CAIRN_TEST_TOOL_LOG:-/dev/null}"
mode=$(printf '%s' "$args" | sed -n 's/.*"mode":"\([a-z]*\)".*/\1/p')
case "${mode:-ok}" in
  hang) sleep 60 ;;
  garbage) echo "this is not json" ;;
  huge) head -c 4194304 /dev/zero | tr '\0' 'x' ;;
  crash) echo "the mail server refused the message" >&2; exit 3 ;;
  env) printf '{"secret_seen":%s,"api_key_seen":%s,"run":"%s","seq":"%s","key":"%s","path":"%s","names":%s}\n' \
         "$([ -n "${CAIRN_TEST_SECRET:-}" ] && echo true || echo false)" \
         "$([ -n "${CAIRN_LLM_API_KEY:-}" ] && echo true || echo false)" \
         "$CAIRN_RUN_ID" "$CAIRN_TOOL_SEQ" "$CAIRN_IDEMPOTENCY_KEY" "$PATH" \
         "[$(env | cut -d= -f1 | sort | sed 's/.*/"&"/' | paste -sd,)]" ;;
  *) printf '{"sent":true,"key":"%s","seq":%s}\n' "$CAIRN_IDEMPOTENCY_KEY" "$CAIRN_TOOL_SEQ" ;;
esac
