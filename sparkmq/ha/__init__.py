"""High availability: the replica process that tails a master's CommitLog, and promotion.

Not built yet (issue 6). The store already carries what it needs: the writer
lease with an epoch in the transaction log, which fences a returning master.
"""
