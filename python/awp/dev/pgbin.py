"""Locate the PostgreSQL server binaries (initdb, pg_ctl, postgres, psql).

Search order: ``AWP_PG_BINDIR``; ``pg_config --bindir``; ``initdb`` on ``PATH``; the highest version under
``/usr/lib/postgresql/*/bin`` (Debian/Ubuntu) or ``/usr/pgsql-*/bin`` (RHEL). A directory only counts when
it holds ``initdb`` and ``pg_ctl`` (``pg_config`` from libpq-dev alone points at a bindir without them).
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found. Install them, e.g. "
    "`apt-get install -y postgresql-15` (or the distribution default: `apt-get install -y postgresql`), "
    "or point AWP_PG_BINDIR at the directory that holds initdb."
)


class PostgresNotFound(RuntimeError):
    """No usable PostgreSQL installation was found."""


def _usable(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path)) or (0,)


def _candidates() -> list[Path]:
    found: list[Path] = []
    env = os.environ.get("AWP_PG_BINDIR")
    if env:
        found.append(Path(env))
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
            found.append(Path(out.stdout.strip()))
        except (OSError, subprocess.CalledProcessError):
            pass
    initdb = shutil.which("initdb")
    if initdb:
        found.append(Path(initdb).resolve().parent)
    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"):
        found.extend(Path(p) for p in sorted(glob.glob(pattern), key=_version_key, reverse=True))
    return found


@functools.lru_cache(maxsize=1)
def bindir() -> Path:
    """The directory holding initdb/pg_ctl/postgres; raises PostgresNotFound with an install hint."""
    env = os.environ.get("AWP_PG_BINDIR")
    for candidate in _candidates():
        if _usable(candidate):
            return candidate
        if env and candidate == Path(env):
            raise PostgresNotFound(f"AWP_PG_BINDIR={env} does not hold initdb, pg_ctl and postgres")
    raise PostgresNotFound(INSTALL_HINT)


def pg_bin(name: str) -> str:
    """Absolute path of one PostgreSQL program, e.g. ``pg_bin("pg_ctl")``."""
    path = bindir() / name
    if not os.access(path, os.X_OK):
        raise PostgresNotFound(f"{path} is missing; {INSTALL_HINT}")
    return str(path)
