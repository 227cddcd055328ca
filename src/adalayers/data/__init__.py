"""Data: task readers, encoding (text -> rows -> batches) and input templates."""
