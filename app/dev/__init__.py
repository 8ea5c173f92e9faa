"""``make dev`` and nothing else: the development stack (``python -m app.dev``),
its embedded PostgreSQL and Redis, process supervision, the demos, the state
file other shells find the stack by, and the generator of the configuration
reference. Production code never imports this package; the one exception is
:mod:`app.config` reading :mod:`app.dev.state` (a stack's state file is a
source of configuration: see docs/design-notes.md)."""
