#!/usr/bin/env bash
# Writes the seed corpus of the fuzz targets, fuzz/corpus/{request,connection}/: every request
# example in docs/PROTOCOL.md (the lines with an "op" in its ```json blocks), the whole set as
# one session, and edge cases (long lines, invalid UTF-8, deep nesting, huge numbers...).
# Run it again after docs/PROTOCOL.md changes: fuzz/seed-corpus.sh
# It rewrites only its own files (doc-*, edge-*); crash inputs added by hand (regression-*)
# stay.
set -euo pipefail
cd "$(dirname "$0")"
request=corpus/request
connection=corpus/connection
mkdir -p "$request" "$connection"
rm -f "$request"/doc-* "$request"/edge-* "$connection"/doc-* "$connection"/edge-*

# A request line: as is for `request` (one line, no newline), with its newline for `connection`.
both() {
    printf '%s' "$2" >"$request/$1"
    printf '%s\n' "$2" >"$connection/$1"
}
# Bytes (printf escapes allowed) for `connection` only, where lines and their ends matter.
session() {
    printf "$2" >"$connection/$1"
}
repeat() { # repeat N TEXT
    head -c "$1" /dev/zero | tr '\0' "$2"
}

examples=$(awk '/^```json$/ { json = 1; next } /^```$/ { json = 0; next } json && /"op":/' \
    ../docs/PROTOCOL.md)
[ -n "$examples" ] || { echo "no request examples found in docs/PROTOCOL.md" >&2; exit 1; }
n=0
while IFS= read -r line; do
    n=$((n + 1))
    op=$(sed -E 's/.*"op":"([a-z_]+)".*/\1/' <<<"$line")
    both "$(printf 'doc-%02d-%s' "$n" "$op")" "$line"
done <<<"$examples"
printf '%s\n' "$examples" >"$connection/doc-session"
# The same session on real processes: the relay puts a child's pid for $CHILD, the harness the
# next tree's id for $TREE.
sed -E 's/"pid":[0-9]+/"pid":$CHILD/; s/"tree":[0-9]+/"tree":$TREE/' <<<"$examples" \
    >"$connection/doc-session-live"
session doc-register-kill-live '{"id":1,"op":"subscribe"}\n{"id":2,"op":"register","pid":$CHILD,"grace_ms":0}\n{"id":3,"op":"list"}\n{"id":4,"op":"kill","tree":$TREE}\n{"id":5,"op":"status"}\n'
session doc-register-release-live '{"id":1,"op":"register","pid":$CHILD,"on_root_exit":"keep"}\n{"id":2,"op":"release","tree":$TREE}\n{"id":3,"op":"list"}\n'
session doc-register-limit-live '{"id":1,"op":"register","pid":$CHILD}\n{"id":2,"op":"register","pid":$CHILD}\n{"id":3,"op":"register","pid":$CHILD}\n{"id":4,"op":"register","pid":$CHILD}\n{"id":5,"op":"register","pid":$CHILD}\n'

# Lengths around the limit of a request line: 65536 bytes, its newline included.
padded() { # padded LENGTH: a valid `list` request of exactly LENGTH bytes
    local head='{"id":5,"op":"list","pad":"' tail='"}'
    printf '%s%s%s' "$head" "$(repeat $(($1 - ${#head} - ${#tail})) x)" "$tail"
}
both edge-line-65535 "$(padded 65535)"
both edge-line-65536 "$(padded 65536)"
printf '%s\n{"id":6,"op":"status"}\n' "$(padded 65537)" >"$connection/edge-line-too-long"
printf '%s' "$(padded 65537)" >"$request/edge-line-too-long"

both edge-empty ''
both edge-not-json 'not json'
both edge-array '[{"id":1,"op":"list"}]'
both edge-invalid-utf8 "$(printf '{"id":1,"op":"register","pid":2,"lease":"\xff\xfe\xc3\x28"}')"
both edge-lone-surrogate '{"id":1,"op":"register","pid":2,"lease":"\ud800"}'
both edge-nul "$(printf '{"id":1,"op":"list"}\x01')"
both edge-deep-nesting "{\"id\":1,\"op\":\"list\",\"x\":$(repeat 200 '[')$(repeat 200 ']')}"
both edge-deeper-nesting "$(repeat 20000 '[')"
both edge-huge-id '{"id":18446744073709551615,"op":"kill","tree":4294967295,"grace_ms":18446744073709551615}'
both edge-id-overflow '{"id":18446744073709551616,"op":"list"}'
both edge-huge-float '{"id":1e400,"op":"list"}'
both edge-negative-zero '{"id":-0,"op":"hello","protocol":99999999999999999999}'
both edge-pid-overflow '{"id":1,"op":"register","pid":4294967296}'
both edge-grace-over '{"id":1,"op":"register","pid":2,"grace_ms":600001}'
both edge-duplicate-id '{"id":1,"id":2,"op":"list"}'
both edge-unknown-field '{"id":1,"op":"status","extra":{"nested":[1,2,3]}}'
both edge-own-pid '{"id":1,"op":"register","pid":1}'
session edge-crlf '{"id":1,"op":"list"}\r\n{"id":2,"op":"status"}\r\n'
session edge-unterminated '{"id":1,"op":"list"}\n{"id":2,"op":"status"}'
session edge-blank-lines '\n\n\n{"id":1,"op":"list"}\n\n'
{ for i in $(seq 1 300); do printf '{"id":%d,"op":"status"}\n' "$i"; done; } >"$connection/edge-many-lines"
repeat 2000 '\n' >"$connection/edge-newlines"
echo "seed corpus: $(ls "$request" | wc -l) request, $(ls "$connection" | wc -l) connection inputs"
