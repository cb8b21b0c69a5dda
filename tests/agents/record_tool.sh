#!/bin/bash
# A user tool for tests. Appends "KEY ARGS" to $CAIRN_TEST_TOOL_LOG for every
# call, then behaves per args.mode: "ok" (default) prints a JSON result,
# "hang" never answers, "garbage" prints text, "huge" prints 4 MiB, "crash"
# exits 3 with a message on stderr, "env" reports which host variables it saw.
set -u
args=$(cat)
echo "$CAIRN_IDEMPOTENCY_KEY $args" >> "${CAIRN_TEST_TOOL_LOG:-/dev/null}"
mode=$(printf '%s' "$args" | sed -n 's/.*"mode":"\([a-z]*\)".*/\1/p')
case "${mode:-ok}" in
  hang) sleep 60 ;;
  garbage) echo "this is not json" ;;
  huge) head -c 4194304 /dev/zero | tr '\0' 'x' ;;
  crash) echo "the mail server refused the message" >&2; exit 3 ;;
  env) printf '{"secret_seen":%s,"run":"%s"}\n' "$([ -n "${CAIRN_TEST_SECRET:-}" ] && echo true || echo false)" "$CAIRN_RUN_ID" ;;
  *) printf '{"sent":true,"key":"%s","seq":%s}\n' "$CAIRN_IDEMPOTENCY_KEY" "$CAIRN_TOOL_SEQ" ;;
esac
