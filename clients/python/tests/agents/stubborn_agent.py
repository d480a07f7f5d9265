"""A fake ACP agent that does everything an agent should not: it ignores SIGTERM and SIGHUP, goes
on after its stdin ends, and on a prompt starts a tool in a session of its own (`setsid`) that
ignores SIGTERM too. Both write a heartbeat (a timestamp a line) into BEAT_DIR: agent.beat and
tool.beat, every 50 ms, until they are killed.

    python3 stubborn_agent.py BEAT_DIR (hang | answer)

`hang`: the prompt is never answered (a host that waits on it); `answer`: it is answered at
once, the tool still running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

TOOL = 'trap "" TERM HUP; while :; do date +%s.%N >> "$0"; sleep 0.05; done'


def heartbeat(path: str) -> None:
    while True:
        with open(path, "a") as beat:
            beat.write(f"{time.time():.6f}\n")
        time.sleep(0.05)


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    beat_dir, mode = sys.argv[1], sys.argv[2]
    for line in sys.stdin:
        request = json.loads(line)
        method, request_id = request.get("method"), request.get("id")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"protocolVersion": 1}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            tool = subprocess.Popen(
                ["setsid", "sh", "-c", TOOL, os.path.join(beat_dir, "tool.beat")]
            )
            threading.Thread(
                target=heartbeat, args=(os.path.join(beat_dir, "agent.beat"),), daemon=True
            ).start()
            update = {
                "sessionId": "s1",
                "update": {
                    "sessionUpdate": "tool_call",
                    "toolCallId": "t1",
                    "status": "in_progress",
                    "title": f"tool pid {tool.pid}",
                },
            }
            send({"jsonrpc": "2.0", "method": "session/update", "params": update})
            if mode == "answer":
                send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})
    # Its stdin has ended: a well-behaved agent would exit; this one goes on.
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
