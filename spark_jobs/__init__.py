"""Spark jobs: each module is a pure transform plus a thin main(argv), runnable with spark-submit."""
