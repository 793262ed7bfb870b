# A stand-in for the public postgres image, built from a local Debian base where no registry can be
# reached (tests/test_compose_stack.py). It takes the same environment (POSTGRES_USER,
# POSTGRES_PASSWORD, POSTGRES_DB), keeps its data in the same place and answers pg_isready.
ARG BASE=solaris-base:bookworm
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data && chown postgres:postgres /var/lib/postgresql/data
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
USER postgres
EXPOSE 5432
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
