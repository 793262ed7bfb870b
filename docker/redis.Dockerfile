# A stand-in for the public redis image, built from a local Debian base where no registry can be
# reached (tests/test_compose_stack.py). As in the public image, a `redis-server ...` command
# listens on every interface of the container without protected mode.
ARG BASE=solaris-base:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
USER redis
WORKDIR /var/lib/redis
EXPOSE 6379
ENTRYPOINT ["sh", "-c", "if [ \"$1\" = redis-server ]; then shift; exec redis-server --protected-mode no \"$@\"; fi; exec \"$@\"", "--"]
CMD ["redis-server"]
