"""The running scheduler: the delay queue and its dispatcher, the worker pool, the firing
pipeline, and the threads that keep locks alive, record ends and do the upkeep."""
