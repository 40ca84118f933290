"""A stdio MCP server with one tool, `lookup`, for the durable tests: each call appends a line to the file
`CATALOG_CALLS` names, so a test in another process counts what the server really ran."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer('catalog')


@server.tool()
def lookup(q: str) -> str:
    """Look `q` up in the catalog."""
    with open(os.environ['CATALOG_CALLS'], 'a', encoding='utf-8') as calls:
        calls.write(f'{q}\n')
    return f'found {q}'


if __name__ == '__main__':
    server.run('stdio')
