"""Sites: the publishers a fleet's fetches reach, named by site keys, and the
politeness the whole fleet keeps towards each (docs/politeness.md)."""
