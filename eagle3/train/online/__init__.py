"""Online training: capture producers feed the trainer through a store; no feature shard is
written."""
