#!/bin/bash
# The steps of `cargo xtask systemtest`, run inside a Debian guest whose PID 1 is systemd, by
# the unit leash-systemtest.service once the system is up. Everything it prints goes to the
# serial console; the host reads the lines that start with SYSTEMTEST. The packages to install
# and what they are expected to score are in /root/systemtest.env.
set -uo pipefail
# shellcheck source=/dev/null
. /root/systemtest.env

say() { echo "SYSTEMTEST $*"; }
ok() { say "ok: $*"; }
finish() {
    say "END $1"
    sync
    systemctl poweroff --force --force
}
fail() {
    say "FAIL: $*"
    journalctl --unit leash --no-pager --lines 80 | sed 's/^/  journal: /'
    finish fail
    exit 1
}

# await SECONDS WHAT COMMAND...: runs COMMAND every 0.1 s until it succeeds; fails the test
# with WHAT if it has not within SECONDS.
await() {
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        ((SECONDS < deadline)) || fail "$what: not within ${seconds} s"
        sleep 0.1
    done
}

running() { pgrep -fx "$1" >/dev/null; }
# A tree N: a `leash run` host of the unprivileged user agent, whose command leaves one
# sleeper in a session of its own (setsid) and becomes another.
start_tree() {
    setpriv --reuid=agent --regid=agent --init-groups -- \
        leash run --grace 100ms -- sh -c "setsid sleep 100$1 & exec sleep 200$1" \
        </dev/null >/dev/null 2>&1 &
    HOST=$!
    await 60 "tree $1 started" tree_alive "$1"
}
tree_alive() { running "sleep 100$1" && running "sleep 200$1"; }
tree_gone() { ! running "sleep 100$1" && ! running "sleep 200$1"; }
# SIGKILLs tree N's host: the daemon must kill the tree.
kill_host() {
    # The host must still run: a tree whose host already died proves nothing here.
    kill -KILL "$HOST" || fail "the host of tree $1 was gone before it was killed"
    await 60 "tree $1 killed after its host was SIGKILLed" tree_gone "$1"
}

active() { systemctl is-active --quiet leash && [ -S /run/leash/leash.sock ]; }
main_pid() { systemctl show --property MainPID --value leash; }
# restarted OLD_PID: another daemon runs and serves.
restarted() {
    local pid
    pid=$(main_pid)
    [ "$pid" != 0 ] && [ "$pid" != "$1" ] && active && leash status >/dev/null 2>&1
}
installed_version() { dpkg-query --show --showformat '${Version}' leash 2>/dev/null; }

cd /root || fail "no /root"
say "START $(uname -r), $(systemctl --version | head -1)"

# 1. Install: the service is enabled and started.
apt-get install --yes --quiet "/root/$DEB_A" || fail "apt-get install $DEB_A"
await 60 "the service active after the install" active
systemctl is-enabled --quiet leash || fail "the service is not enabled"
ok "installed $(installed_version): $(leash --version), service $(systemctl is-active leash)"

# 2. A tree of an unprivileged user dies with its host.
start_tree 1
kill_host 1
ok "a tree of uid $(id -u agent) died with its SIGKILLed host"
setpriv --reuid=agent --regid=agent --init-groups -- leash kill 424242 2>/dev/null &&
    fail "leash kill of a tree that does not exist succeeded"

# 3. An upgrade hands over: the tree stays tracked and still dies with its host.
start_tree 2
before=$(main_pid)
apt-get install --yes --quiet "/root/$DEB_B" || fail "apt-get install $DEB_B (upgrade)"
[ "$(installed_version)" = "$VERSION_B" ] || fail "installed: $(installed_version), not $VERSION_B"
await 60 "a new daemon after the upgrade" restarted "$before"
tree_alive 2 || fail "the upgrade killed tree 2"
journalctl --unit leash --no-pager | grep -q "handing over" ||
    fail "the old daemon did not hand over"
ok "upgraded to $VERSION_B: daemon $before handed over to $(main_pid), tree 2 still runs"
kill_host 2
ok "tree 2 died with its host after the upgrade"

# 4. An upgrade whose pins have another ABI cannot hand over: it is refused before anything
# changes, and says what to choose.
start_tree 5
before=$(main_pid)
refusal=$(apt-get install --yes --quiet "/root/$DEB_C" 2>&1) &&
    fail "an upgrade to other pins' ABI went ahead"
echo "$refusal" | grep -q "refusing to upgrade while leash.service runs" ||
    fail "the refusal does not say why: $refusal"
echo "$refusal" | grep -q "systemctl stop leash" || fail "the refusal names no choice: $refusal"
[ "$(installed_version)" = "$VERSION_B" ] || fail "installed: $(installed_version), not $VERSION_B"
[ "$(main_pid)" = "$before" ] || fail "the daemon changed: $before, now $(main_pid)"
tree_alive 5 || fail "the refused upgrade killed tree 5"
kill_host 5
ok "an upgrade to other pins' ABI refused, naming the choice; tree 5 untouched, then killed with its host"

# 5. A daemon SIGKILLed is restarted by systemd, takes over, and enforcement goes on.
start_tree 3
before=$(main_pid)
systemctl kill --signal KILL leash || fail "systemctl kill"
await 60 "the daemon restarted after SIGKILL" restarted "$before"
tree_alive 3 || fail "tree 3 did not survive its daemon's SIGKILL"
kill_host 3
ok "daemon $before SIGKILLed, $(main_pid) took over, tree 3 died with its host"

# 6. The unit's exposure, as this systemd scores it.
score=$(systemd-analyze security --no-pager leash.service | sed -n 's/.*Overall exposure level for leash.service: \([0-9.]*\).*/\1/p')
[ -n "$score" ] || fail "systemd-analyze security printed no score"
awk -v s="$score" -v max="$MAX_EXPOSURE" 'BEGIN { exit !(s <= max) }' ||
    fail "systemd-analyze security: $score, over $MAX_EXPOSURE"
ok "systemd-analyze security leash.service: $score (at most $MAX_EXPOSURE)"

# 7. Remove: the service stops the documented way, killing every tree and removing the pins.
start_tree 4
apt-get remove --yes --quiet leash || fail "apt-get remove"
await 60 "tree 4 killed by the removal" tree_gone 4
! systemctl is-active --quiet leash || fail "the service still runs after the removal"
[ ! -e /sys/fs/bpf/leash ] || fail "pins left after the removal: $(ls /sys/fs/bpf/leash)"
ok "removed: tree 4 killed, the pins gone"

# 8. Purge leaves nothing behind.
apt-get purge --yes --quiet leash || fail "apt-get purge"
left=$(find / -xdev \( -path /proc -o -path /sys -o -path /root \) -prune -o -iname '*leash*' \
    -print | grep -v -e '^/usr/local/sbin/leash-systemtest$' -e 'leash-systemtest.service')
left+=$(ls -d /run/leash /sys/fs/bpf/leash 2>/dev/null)
[ -z "$left" ] || fail "left after the purge: $left"
ok "purged: nothing left"

# 9. The journal answers what was killed, when and why: every kill above, the removal's too,
# each with its tree, reason, host and owner; and the other events, the refusal of step 2's
# `leash kill` among them.
journal() { journalctl --unit leash --output json --no-pager "$@"; }
for event in lease_opened tree_registered lease_ended request_refused; do
    [ -n "$(journal LEASH_EVENT=$event)" ] || fail "no $event entry in the journal"
done
killed=$(journal LEASH_EVENT=tree_killed)
count=$(echo "$killed" | grep -c .)
[ "$count" -ge 5 ] || fail "$count tree_killed entries in the journal, expected 5 or more"
for field in LEASH_TREE LEASH_REASON LEASH_HOST_PID LEASH_UID LEASH_ELAPSED_MS; do
    [ "$(echo "$killed" | grep -c "\"$field\":")" = "$count" ] ||
        fail "a tree_killed entry without $field: $killed"
done
echo "$killed" | grep -q '"LEASH_UID":"1000"' || fail "no kill names uid 1000: $killed"
echo "$killed" | grep -q '"LEASH_REASON":"shutdown"' || fail "no kill for the removal: $killed"
journal LEASH_EVENT=request_refused | grep -q '"LEASH_CODE":"not_found"' ||
    fail "the refused kill is not in the journal with its code"
ok "journalctl -u leash LEASH_EVENT=tree_killed: $count entries, each with its tree, reason, host, uid and time"

# 10. A daemon started by hand already serves the socket: the install says which process and
# what to do, and leaves the service enabled but not started. Then pins whose lock a live
# process holds (as a daemon does for its whole life): the purge leaves them, naming it.
dpkg-deb --extract "/root/$DEB_A" /root/by-hand || fail "dpkg-deb --extract $DEB_A"
mkdir -p -m 0755 /run/leash
/root/by-hand/usr/bin/leash daemon >/root/by-hand.log 2>&1 &
hand=$!
await 60 "the daemon started by hand serving" /root/by-hand/usr/bin/leash status
said=$(apt-get install --yes --quiet "/root/$DEB_A" 2>&1) || fail "apt-get install $DEB_A: $said"
echo "$said" | grep -q "pid $hand (/root/by-hand/usr/bin/leash daemon) already serves /run/leash/leash.sock" ||
    fail "the install does not name the daemon started by hand: $said"
echo "$said" | grep -q "systemctl start leash" || fail "the install names no choice: $said"
! systemctl is-active --quiet leash || fail "the service started beside the daemon started by hand"
kill -TERM "$hand" && wait "$hand"
ok "installed beside a daemon started by hand: it names pid $hand and what to do, the service not started"
mkdir -p /sys/fs/bpf/leash
flock --nonblock --close /sys/fs/bpf/leash sleep 3001 &
locker=$!
await 10 "the pins locked" sh -c '! flock --nonblock /sys/fs/bpf/leash true'
said=$(apt-get purge --yes --quiet leash 2>&1) || fail "apt-get purge: $said"
echo "$said" | grep -q "leaving /sys/fs/bpf/leash: a running daemon, pid $locker" ||
    fail "the purge does not say it leaves the pins, held by pid $locker: $said"
[ -d /sys/fs/bpf/leash ] || fail "the purge removed pins a live process holds"
kill "$locker"
pkill -fx "sleep 3001"
rmdir /sys/fs/bpf/leash || fail "rmdir /sys/fs/bpf/leash"
ok "purged beside held pins: they stay, pid $locker named"

finish pass
