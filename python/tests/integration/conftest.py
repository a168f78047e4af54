"""Fixtures of the integration tests (the database, the gateway and the workers are python/tests/conftest.py's).

- ``awp`` (function): ``awp(*args, ok=True, stdin=None)`` runs the CLI (``awp.cli.main``) in this process against
  ``gw`` with the operator's token and, with ``ok``, asserts that it exited 0; a module-level ``CLI_ENV`` adds to its
  environment (``COLUMNS``, ...).
- ``http`` (module): an httpx client of ``gw``'s base URL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from click.testing import CliRunner, Result

from awp.cli.main import main
from awp_testing.gateway import ServeProcess


@pytest.fixture
def awp(gw: ServeProcess, request: pytest.FixtureRequest) -> Callable[..., Result]:
    runner = CliRunner()
    env = {
        "AWP_GATEWAY_URL": gw.base_url,
        "AWP_OPERATOR_TOKEN": gw.tokens.operator,
        **getattr(request.module, "CLI_ENV", {}),
    }

    def invoke(*args: str, ok: bool = True, stdin: str | None = None) -> Result:
        result = runner.invoke(main, list(args), env=env, input=stdin, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        return result

    return invoke


@pytest.fixture(scope="module")
def http(gw: ServeProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.base_url, timeout=40) as client:
        yield client
