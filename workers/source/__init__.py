"""``fleethq-source``, the program that packs, merges and inspects source
files (:mod:`workers.source.cli`, :mod:`workers.source.merge`); the format
itself is :mod:`workers.wire.source`."""
