"""Who may call which route: the roles the operator, viewer and worker bootstrap tokens grant, the access
class of each route, and the check (secrets compared in constant time; worker session tokens are checked by
the database)."""

from __future__ import annotations

import enum
import hmac

from aiohttp import web

from awp.protocol.jsonio import bad_text
from awp.server.appstate import CONFIG, GatewayConfig
from awp.server.errors import ApiError


class Role(enum.Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    BOOTSTRAP = "bootstrap"


class Access(enum.Enum):
    PUBLIC = "public"  # health, openapi
    READ = "read"  # viewer or operator
    WRITE = "write"  # operator
    REGISTER = "register"  # worker bootstrap
    WORKER = "worker"  # a worker session token (checked by the database)
    METRICS = "metrics"  # the metrics token when one is set


def bearer_token(request: web.Request) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None when missing or malformed (bytes that are not UTF-8
    too: aiohttp keeps them as lone surrogates, which no token holds and PostgreSQL refuses)."""
    header = request.headers.get("Authorization", "")
    if bad_text(header):
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def role_of(config: GatewayConfig, token: str) -> Role | None:
    """The role a token grants; every secret is compared (in constant time) whatever matches."""
    matches = [
        (Role.VIEWER, _same(token, config.viewer_token)),
        (Role.OPERATOR, _same(token, config.operator_token)),
        (Role.BOOTSTRAP, _same(token, config.bootstrap_token)),
    ]
    for role, matched in matches:
        if matched:
            return role
    return None


def authorize(request: web.Request, access: Access) -> None:
    config = request.app[CONFIG]
    if access is Access.PUBLIC:
        return
    token = bearer_token(request)
    if access is Access.METRICS:
        if config.metrics_token is not None and (token is None or not _same(token, config.metrics_token)):
            raise ApiError.of(401, "a valid metrics token is required")
        return
    if token is None:
        raise ApiError.of(401, "missing or malformed Authorization: Bearer header")
    if access is Access.WORKER:
        return  # the session token is checked by the database
    role = role_of(config, token)
    allowed = {
        Access.READ: {Role.VIEWER, Role.OPERATOR},
        Access.WRITE: {Role.OPERATOR},
        Access.REGISTER: {Role.BOOTSTRAP},
    }[access]
    if role in allowed:
        return
    if role is None or role is Role.BOOTSTRAP:  # the bootstrap token is just a wrong token elsewhere
        raise ApiError.of(401, "invalid token")
    raise ApiError.of(403, f"the {role.value} token may not {request.method} this route")
