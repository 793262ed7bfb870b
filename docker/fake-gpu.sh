#!/bin/sh
# A Spark GPU discovery script that reports one GPU, address 0, whatever the machine has: the
# compose stack test (tests/test_compose_stack.py) gives it to the workers so that the scheduler
# must assign GPU addresses to the tasks that ask for them, on a machine without a GPU.
echo '{"name": "gpu", "addresses": ["0"]}'
