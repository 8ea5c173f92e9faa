"""Post-archive hooks: webhook consumers, their deliveries, derive consumers
(the outbox they ride on is :mod:`app.outbox`)."""
