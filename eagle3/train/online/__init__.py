"""Online training (issue 48): capture producers feed the trainer through a store; no feature shard is written."""
