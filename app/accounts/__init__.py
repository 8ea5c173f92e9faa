"""Users, roles and machine tokens."""
