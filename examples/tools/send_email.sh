#!/bin/sh
# A user tool (see README, "Adding a tool"): reads {"to", "subject", "body"}
# as JSON on stdin and "sends" the mail by dropping it in the host's outbox
# folder, named by the call's idempotency key. It runs on the host, outside
# the sandbox, with the host's environment: a real one would read its SMTP
# password from there. Prints {"queued": true, "message_id": KEY}.
set -eu
outbox="${CAIRN_OUTBOX:-${CAIRN_HOME:-.cairn}/outbox}"
mkdir -p "$outbox"
id="$(printf '%s' "$CAIRN_IDEMPOTENCY_KEY" | tr '/' '_')"
cat > "$outbox/$id.json"
printf '{"queued":true,"message_id":"%s"}\n' "$CAIRN_IDEMPOTENCY_KEY"
