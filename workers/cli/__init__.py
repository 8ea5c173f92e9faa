"""What the command-line programs (``hqctl``, ``fleethq-source``) share:
SavewebHQ-compatible argument parsing (``args``), the HTTP client and its
settings (``http``), and reading job specs from files (``spec_input``)."""
