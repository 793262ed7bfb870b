"""Shared plumbing: typed config, the Spark session factory, the SQL entry point, synthetic data."""
