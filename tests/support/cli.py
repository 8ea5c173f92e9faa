"""Running ``flask fleet`` commands in-process and reading their JSON or errors."""
from __future__ import annotations

import json


def cli(app, *args):
    return app.test_cli_runner().invoke(args=list(args))


def cli_text(result) -> str:
    """Everything the command printed (stdout and stderr) plus any exception text."""
    parts = [result.output or ""]
    try:
        parts.append(result.stderr or "")
    except ValueError:
        pass
    return "\n".join(parts)


def assert_cli_error(result, code: str):
    """A clear error: non-zero exit, the error code named, never a traceback."""
    out = cli_text(result)
    assert result.exit_code != 0, out
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert code in out, out
    assert "Traceback" not in out, out


def cli_json(result):
    assert result.exit_code == 0, cli_text(result)
    return json.loads(result.stdout)
