"""Inside a sandbox: the agent's way to the worker's gateway, then the agent itself.

Uploaded by workers/loops/sandbox_command.py and run there with the sandbox's own python3 (standard
library only; Python 3.8 and on), as

    python3 forward.py SOCKET TASK_JSON -- COMMAND...

with the rollout's secrets in its environment (FARM_GATEWAY_ROLLOUT, FARM_GATEWAY_TASK), never in
an argv. The sandbox has no network (loopback only), so the agent cannot reach the gateway's TCP
port; this script listens on a free port of the sandbox's own 127.0.0.1, relays every connection
byte for byte to SOCKET (the gateway's Unix socket, bound into the sandbox), and runs COMMAND as
its child with OPENAI_BASE_URL / OPENAI_API_KEY / FARM_TASK_URL pointing at that port, TASK_JSON
on its stdin, stdout and stderr its own. It exits with the command's status (128 + N when a signal
N ended it; 127 when it could not start). The exec that runs it is what bounds its time.
"""

import asyncio
import os
import sys

CHUNK = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


async def _relay(socket_path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
    except OSError as exc:
        print(f"farm forwarder: cannot reach the gateway at {socket_path}: {exc}", file=sys.stderr)
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    for w in (up_writer, writer):
        w.close()


def _child_env(port: int) -> dict:
    env = dict(os.environ)
    rollout = env.pop("FARM_GATEWAY_ROLLOUT", "")
    task = env.pop("FARM_GATEWAY_TASK", "")
    base = f"http://127.0.0.1:{port}"
    env["OPENAI_BASE_URL"] = f"{base}/r/{rollout}/v1"
    env["OPENAI_API_KEY"] = rollout
    if task:
        env["FARM_TASK_URL"] = f"{base}/t/{task}"
    for name in ("NO_PROXY", "no_proxy"):  # an image's proxy settings must not catch the gateway
        env[name] = ",".join(filter(None, ["127.0.0.1", "localhost", env.get(name, "")]))
    return env


async def _main(argv: list) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: forward.py SOCKET TASK_JSON -- COMMAND...", file=sys.stderr)
        return 2
    socket_path, task_json, command = argv[0], argv[1], argv[3:]
    server = await asyncio.start_server(lambda r, w: _relay(socket_path, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with open(task_json, "rb") as stdin:
        try:
            proc = await asyncio.create_subprocess_exec(*command, stdin=stdin, env=_child_env(port))
        except OSError as exc:
            print(f"farm forwarder: cannot start {command[0]!r}: {exc}", file=sys.stderr)
            return 127
    code = await proc.wait()
    server.close()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
