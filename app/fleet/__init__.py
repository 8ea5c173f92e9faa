"""Enrolled nodes, token workers, enrollment credentials and heartbeats."""
