"""High availability: RocketMQ's master/replica replication, and promotion.

``master.py`` (``HAService``) streams a master's CommitLog bytes and meta to each
replica and answers SYNC_MASTER waits; ``replica.py`` (``HAClient``) follows a
master and writes through the store's public replication API
(:mod:`sparkmq.log.replication`), and ``promote`` turns a replica into a master
with a higher writer epoch; ``protocol.py`` is the wire format and its HMAC
handshake; ``epochs.py`` the epoch history a rejoining store is truncated by.
"""
