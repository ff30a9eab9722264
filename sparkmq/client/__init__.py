"""sparkmq's own producer and consumers. Not built yet (issue 4); use sparkmq.Store in-process."""
