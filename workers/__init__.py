"""Code that runs on worker computers: SDK, CLIs, shared protocol rules.

Nothing in this package may import ``app``; the master imports from here.
"""
