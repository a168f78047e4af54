"""The gateway's JSON answers: compact UTF-8 written by :func:`awp.protocol.jsonio.dumps_bytes`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from awp.protocol.jsonio import dumps_bytes


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps_bytes(value), status=status, content_type="application/json", charset="utf-8")
