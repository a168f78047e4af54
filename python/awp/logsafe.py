"""Log lines that a client cannot forge: control characters (a ``%0A`` in a URL path, an escape sequence in a
header) are written as ``\\xNN`` / ``\\uNNNN`` escapes, so one log call is always one line.

:class:`SafeFormatter` escapes the whole formatted line of every record (``awp`` sets it on its log handler,
:func:`awp.cli.main.main`); a traceback keeps its line breaks but loses every other control character.
:func:`escape_controls` is for a value logged some other way.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and lone surrogates (bytes that were not
# UTF-8, kept by aiohttp as surrogate escapes).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_CONTROLS_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control character escaped (newlines kept when ``keep_newlines``)."""
    return (_CONTROLS_BUT_NEWLINE if keep_newlines else _CONTROLS).sub(_escape, text)


class SafeFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose message line never holds a control character."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return escape_controls(super().formatException(ei), keep_newlines=True)

    def formatStack(self, stack_info: str) -> str:
        return escape_controls(super().formatStack(stack_info), keep_newlines=True)
