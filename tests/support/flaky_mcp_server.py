"""A tiny live MCP server over stdio for failure tests: `echo` answers, `hang` never does, `die` kills the process.

Run: python -m tests.support.flaky_mcp_server  (or with --no-handshake to never answer at all).
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    if "--no-handshake" in sys.argv:
        time.sleep(3600)  # a server that starts but never speaks MCP
        return
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("flaky", subscriptions=False)

    @server.tool(name="echo", description="Echo a text back, with its length.")
    def echo(text: str) -> dict:
        return {"text": text, "length": len(text)}

    @server.tool(name="hang", description="Never returns (simulates a hung backend).")
    def hang(seconds: int = 3600) -> str:
        time.sleep(seconds)
        return "late"

    @server.tool(name="die", description="Kills the server process mid-session.")
    def die() -> str:
        os._exit(3)

    server.run()


if __name__ == "__main__":
    main()
