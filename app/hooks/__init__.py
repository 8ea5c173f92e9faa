"""The outbox and post-archive hooks (webhook consumers and their deliveries)."""
