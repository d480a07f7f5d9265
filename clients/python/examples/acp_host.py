#!/usr/bin/env python3
"""An asyncio ACP host whose agent runs on a leash.

ACP (the Agent Client Protocol) is JSON-RPC 2.0 over the agent's stdin and stdout, one message
a line. This host starts the agent in a session of its own (`start_new_session=True`, so a
Ctrl-C in the host's terminal does not reach it), initializes it, opens a session, sends one
prompt and prints what the agent says until the prompt is answered. Then it exits, and the
lease's end kills the agent and everything it started.

The agent asks before it runs a tool (`session/request_permission`); the host answers with its
permission policy, a function of the request (`--policy`): `allow` (the default) allows every
tool call and logs it (title and command), `reject` refuses them, `cancel` answers as a client
that cancels the turn. A desktop app would ask its user there.

The only leash-specific line is the one that starts the agent:

    agent = await lease.create_subprocess_exec(...)   # was: asyncio.create_subprocess_exec(...)

If this host dies instead (SIGKILL, a crash, the OOM killer), the daemon kills the agent and
every process it started, in whatever session or process group, after `--grace` seconds: an
agent that ignores SIGTERM and stdin's end, or a tool it left behind with `setsid`, does not
outlive its host.

    python3 acp_host.py [--grace SECONDS] [--prompt TEXT] [--policy allow|reject|cancel] \
        -- AGENT [ARGS...]

With the small agent of the Node examples, whose prompts are shell commands:

    python3 acp_host.py --prompt 'echo hello > out.txt' -- node ../../node/examples/acp-agent.js
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional

import leash

# A permission policy: the `outcome` answered to an agent's session/request_permission, from
# the request's params ({"sessionId", "toolCall", "options"}).
PermissionPolicy = Callable[[Dict[str, Any]], Dict[str, Any]]


def select(options: List[Dict[str, Any]], kinds: List[str]) -> Dict[str, Any]:
    """The first option of the first kind in `kinds` that the agent offers, selected; else
    cancelled (the agent then runs nothing)."""
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind:
                return {"outcome": "selected", "optionId": option["optionId"]}
    return {"outcome": "cancelled"}


def described(tool_call: Dict[str, Any]) -> str:
    """A tool call for the log: its title and, for a shell tool, its command."""
    command = (tool_call.get("rawInput") or {}).get("command", "(no command)")
    return f"{json.dumps(tool_call.get('title', tool_call.get('toolCallId')))}: {command}"


def allow_and_log(request: Dict[str, Any]) -> Dict[str, Any]:
    """The default: allow the call (once, or always if that is all that is offered), logged."""
    outcome = select(request["options"], ["allow_once", "allow_always"])
    chosen = outcome.get("optionId", "cancelled")
    print(f"host: permission: {chosen} {described(request['toolCall'])}", flush=True)
    return outcome


def reject(request: Dict[str, Any]) -> Dict[str, Any]:
    """Deny: the agent must not run the tool (the turn goes on without it)."""
    print(f"host: permission: rejected {described(request['toolCall'])}", flush=True)
    return select(request["options"], ["reject_once", "reject_always"])


def cancel(request: Dict[str, Any]) -> Dict[str, Any]:
    """What a client answers while it cancels the turn (after session/cancel)."""
    return {"outcome": "cancelled"}


POLICIES: Dict[str, PermissionPolicy] = {"allow": allow_and_log, "reject": reject, "cancel": cancel}


class AcpConnection:
    """JSON-RPC 2.0 over an agent's stdio: requests with ids, the agent's notifications
    (session/update) printed as they come, and the agent's own requests answered: permission
    requests by `policy`."""

    def __init__(
        self, agent: asyncio.subprocess.Process, policy: PermissionPolicy = allow_and_log
    ) -> None:
        assert agent.stdin is not None and agent.stdout is not None
        self._policy = policy
        self._stdin = agent.stdin
        self._stdout = agent.stdout
        self._ids = itertools.count()
        self._pending: Dict[int, asyncio.Future[Any]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def request(self, method: str, params: Dict[str, Any]) -> Any:
        request_id = next(self._ids)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await reply

    async def _send(self, message: Dict[str, Any]) -> None:
        self._stdin.write(json.dumps(message).encode() + b"\n")
        await self._stdin.drain()

    async def _read(self) -> None:
        while True:
            line = await self._stdout.readline()
            if not line:
                break
            message = json.loads(line)
            if "method" in message and "id" in message:
                await self._answer(message)
            elif "method" in message:
                print(f"host: {message['method']}: {json.dumps(message.get('params'))}", flush=True)
            else:
                reply = self._pending.pop(message.get("id"), None)
                if reply is None or reply.done():
                    continue
                if "error" in message:
                    reply.set_exception(RuntimeError(f"agent error: {message['error']}"))
                else:
                    reply.set_result(message.get("result"))
        for reply in self._pending.values():
            if not reply.done():
                reply.set_exception(EOFError("the agent closed its stdout"))

    async def _answer(self, request: Dict[str, Any]) -> None:
        """The agent asks the host: permissions are the policy's, anything else is unknown here."""
        if request["method"] == "session/request_permission":
            result = {"outcome": self._policy(request["params"])}
            await self._send({"jsonrpc": "2.0", "id": request["id"], "result": result})
        else:
            error = {"code": -32601, "message": f"method not found: {request['method']}"}
            await self._send({"jsonrpc": "2.0", "id": request["id"], "error": error})


async def run(
    agent_command: List[str], grace: Optional[float], prompt: str, policy: PermissionPolicy
) -> int:
    async with leash.AsyncLease(grace=grace) as lease:
        agent = await lease.create_subprocess_exec(
            *agent_command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        print(f"host: agent pid {agent.pid} on leash tree {leash.tree_of(agent)}", flush=True)
        acp = AcpConnection(agent, policy)
        await acp.request(
            "initialize",
            {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": False}}},
        )
        session = await acp.request("session/new", {"cwd": os.getcwd(), "mcpServers": []})
        result = await acp.request(
            "session/prompt",
            {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": prompt}]},
        )
        print(f"host: prompt answered: {result.get('stopReason')}", flush=True)
    # The lease is closed: the agent and everything it started are gone.
    print(f"host: done, agent exit status {await agent.wait()}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grace", type=float, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--prompt", default="Hello")
    parser.add_argument(
        "--policy", choices=sorted(POLICIES), default="allow", help="answers to permission requests"
    )
    parser.add_argument("agent", nargs="+", help="the agent's command line (after --)")
    args = parser.parse_args()
    try:
        return asyncio.run(run(args.agent, args.grace, args.prompt, POLICIES[args.policy]))
    except leash.LeashError as e:
        print(f"host: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
