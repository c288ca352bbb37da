"""Text printed to the reviewer's terminal: the one escaping rule for everything dsv4ctl prints.

Owns :func:`escape` and :func:`escaped_output`. Why: a plan, a diff or an error shows text that
came from outside (extra_args, an inventory's GPU name, a host's nvidia-smi output, an HTTP error
body). Raw, a terminal escape sequence in it can rewrite what the reviewer sees (clear a line, hide
a flag, set the window title), and a bidi override (U+202E) can show ``--port 1 # safe`` for text
that runs otherwise (CVE-2021-42574, "Trojan Source"). So every byte dsv4ctl writes to stdout or
stderr goes through :func:`escape`, installed once at the CLI boundary (:func:`escaped_output`):
no printing path can forget it.

Escaped: C0 controls but newline and tab, DEL, C1 controls (U+0080-U+009F), the bidi embeddings,
overrides and isolates (U+202A-U+202E, U+2066-U+2069), the marks U+200E, U+200F, U+061C, and
U+2028/U+2029 (line breaks some terminals honour), and the invisible characters (zero-width
space and joiners, word joiner, byte-order mark, soft hyphen, tag characters U+E0000-U+E007F...)
that make two different paths look alike. Each becomes ``\\uXXXX`` (a surrogate pair beyond
U+FFFF): readable, and inside a JSON string (``plan --format json``) it decodes back to the same
character, so JSON stays valid and equal. The CLI escapes before click writes (click strips escape
sequences from piped output, which then showed other bytes than were deployed). Standard library
only.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                    "\u202a-\u202e\u2066-\u2069"
                    # invisible (issue 31: printed raw in paths and history): soft hyphen,
                    # combining grapheme joiner, Hangul fillers, Mongolian vowel separator,
                    # zero-width space/non-joiner/joiner, word joiner and invisible operators,
                    # the byte-order mark, interlinear annotations, and the tag characters
                    "\u00ad\u034f\u115f\u1160\u180e\u200b-\u200d\u2060-\u2064\u3164"
                    "\ufeff\uffa0\ufff9-\ufffb\U000e0000-\U000e007f]")


def _code(ch: str) -> str:
    n = ord(ch)
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    n -= 0x10000  # as a JSON string writes it: a surrogate pair, so JSON stays valid and equal
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


def escape(text: str) -> str:
    """``text`` with every character of :data:`UNSAFE` written as ``\\uXXXX`` (a surrogate
    pair beyond U+FFFF)."""
    return UNSAFE.sub(lambda m: _code(m.group()), text)


class _EscapingStream:
    """A text stream that escapes what is written and delegates everything else."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(escape(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def raw(self) -> TextIO:
        """The stream beneath, for dsv4ctl's own control output (a progress line's ``\\r``)."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def raw_stream(stream: TextIO) -> TextIO:
    """The unescaped stream behind ``stream`` (itself when not wrapped). Only for text dsv4ctl
    composes entirely itself."""
    return stream.raw if isinstance(stream, _EscapingStream) else stream  # type: ignore[return-value]


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Within this block, sys.stdout and sys.stderr escape :data:`UNSAFE` characters."""
    old = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, _EscapingStream):
        sys.stdout = _EscapingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, _EscapingStream):
        sys.stderr = _EscapingStream(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = old
