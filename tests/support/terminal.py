"""Running a command with its stderr on a pseudo-terminal, as a person at a
terminal would see it (progress bars draw only there)."""
from __future__ import annotations

import os
import pty
import subprocess


def run_on_a_terminal(argv: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, str]:
    """The finished command (stdout captured) and what it drew on the terminal."""
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=terminal, **kwargs)
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end closed
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(controller)
    return done, drawn.decode(errors="replace")


def last_line(drawn: str) -> str:
    """The line a self-rewriting bar left last."""
    return drawn.replace("\r\n", "\n").split("\r")[-1].strip()
