"""ACL 2.0 (RocketMQ 5): the model and decisions (``model``) and the users and ACLs
kept in a store's transaction log (``meta``)."""
