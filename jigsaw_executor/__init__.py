"""jigsaw_executor."""
