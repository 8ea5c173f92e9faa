"""The configuration reference and ``.env.example``, generated from
``app.config.Defaults``: each setting's name, environment variable, default
and the comment written above (or beside) it in the code.

    python -m app.dev.config_reference --write   # docs/configuration.md, .env.example

``tests/test_config_reference.py`` fails when either file is not current.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import os
import tokenize
from dataclasses import dataclass

from app import config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "configuration.md")
ENV_EXAMPLE = os.path.join(ROOT, ".env.example")
# Built from others at load time, or Flask-SQLAlchemy's own: not settings of ours.
INTERNAL = ("SQLALCHEMY_ENGINE_OPTIONS",)
PLAIN_NAMES = ("DATABASE_URL", "REDIS_URL")


@dataclass(frozen=True)
class Setting:
    name: str
    source: str       # the default as written
    value: object     # the default as computed
    comment: str

    @property
    def variable(self) -> str:
        if self.name.startswith("S3_"):
            return self.name
        if self.name in PLAIN_NAMES:
            return self.name
        return f"FLEETHQ_{self.name}"

    def shown_default(self) -> str:
        if self.value is None:
            return "unset"
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        computed = json.dumps(self.value) if not isinstance(self.value, str) else self.value
        if isinstance(self.value, str):
            return f'"{self.value}"' if self.value else '""'
        return computed if self.source in (computed, repr(self.value)) else f"{computed} ({self.source})"

    def env_value(self) -> str:
        if self.value is None:
            return ""
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return self.value if isinstance(self.value, str) else json.dumps(self.value)


def settings() -> list[Setting]:
    path = config.__file__
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    inline = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].strip() != tok.string.strip():
            inline[tok.start[0]] = tok.string.lstrip("# ").strip()
    tree = ast.parse(source)
    defaults = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Defaults")
    found = []
    for node in defaults.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name in INTERNAL:
            continue
        above = []
        line = node.lineno - 2
        while line >= 0 and lines[line].strip().startswith("#"):
            above.insert(0, lines[line].strip().lstrip("#").strip())
            line -= 1
        comment = " ".join(above)
        if node.end_lineno in inline:
            comment = (comment + " " if comment else "") + inline[node.end_lineno]
        found.append(Setting(name, ast.get_source_segment(source, node.value),
                             getattr(config.Defaults, name), comment))
    return found


def render_markdown() -> str:
    out = ["# Configuration reference", "",
           "Generated from `app/config.py` by `python -m app.dev.config_reference --write`;",
           "do not edit by hand. Every setting is read from the environment:",
           "`FLEETHQ_<NAME>` (numbers, booleans and lists as JSON, text as given),",
           "`DATABASE_URL` and `REDIS_URL` under their usual names, and the S3 store's",
           "settings as plain `S3_*` variables. `.env.example` lists the same settings.",
           "A setting that cannot work (a number that is not one, a switch other than",
           "`true`/`false`, a value out of its range) stops every process at start with",
           "exit status 2 and one line: `fleethq: bad setting: NODE_LEASE_S must be an",
           "integer, not 'soon'`.",
           "", "| variable | default | meaning |", "| --- | --- | --- |"]
    for s in settings():
        meaning = s.comment.replace("|", "\\|")
        out.append(f"| `{s.variable}` | `{s.shown_default()}` | {meaning} |")
    out += ["", "SavewebHQ's own names work too, so that a switched installation's environment",
            "and secret files serve as they are (FleetHQ's name wins where both are set; a",
            "`*_FILE` must not be readable by group or others):", "",
            "| SavewebHQ | FleetHQ |", "| --- | --- |"]
    for name, key in config.SAVEWEBHQ_SETTINGS.items():
        target = "DATABASE_URL" if key == "DATABASE_URL" else f"FLEETHQ_{key}"
        read = " (the file's content)" if name == "HQ_GITHUB_CLIENT_SECRET_FILE" else ""
        out.append(f"| `{name}` | `{target}`{read} |")
    return "\n".join(out) + "\n"


def render_env_example() -> str:
    out = ["# FleetHQ settings, one per line, each commented out at its default.",
           "# Generated from app/config.py by `python -m app.dev.config_reference --write`.",
           "# Copy to .env, uncomment and set what your deployment needs; secrets are",
           "# better given as files (FLEETHQ_SECRET_KEY_FILE) than as values here.", ""]
    for s in settings():
        if s.comment:
            out.append(f"# {s.comment}")
        out.append(f"# {s.variable}={s.env_value()}")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write docs/configuration.md and .env.example")
    args = parser.parse_args()
    if not args.write:
        print(render_markdown(), end="")
        return
    for path, text in ((DOC, render_markdown()), (ENV_EXAMPLE, render_env_example())):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
