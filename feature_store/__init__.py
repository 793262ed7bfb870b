"""Table declarations, data-quality checks and (later) the online lookup."""
