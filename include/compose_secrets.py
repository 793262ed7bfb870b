"""Random secrets for docker-compose.yml, as an .env file: docker compose refuses to start without them.

    python -m include.compose_secrets --out .env

The file is written readable by its owner alone (0600) and never overwritten (a new Fernet key
cannot read what the old one encrypted); it is in .gitignore.

SOLARIS_DB_PASSWORD (PostgreSQL, Airflow's metadata), AIRFLOW_JWT_SECRET (signs the API's tokens),
AIRFLOW_FERNET_KEY (encrypts connections and variables in the metadata database), REDIS_PASSWORD
(Redis refuses every command without it) and SPARK_AUTH_SECRET (the Spark master, its workers and
every driver share it: a job submitted without it is refused). Keep the file private and stable: a
new Fernet key cannot read what the old one encrypted.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import sys
from pathlib import Path


def generate() -> dict[str, str]:
    return {"SOLARIS_DB_PASSWORD": secrets.token_urlsafe(24),
            "AIRFLOW_JWT_SECRET": secrets.token_hex(32),
            # a Fernet key is 32 random bytes, url-safe base64
            "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            # URL-safe: it is part of the Redis URL the DAGs and the lookup are given
            "REDIS_PASSWORD": secrets.token_urlsafe(24),
            "SPARK_AUTH_SECRET": secrets.token_hex(32)}


def env_text() -> str:
    """Fresh secrets as the lines of an .env file."""
    return "".join(f"{k}={v}\n" for k, v in generate().items())


def write(path: Path) -> None:
    """Write fresh secrets to ``path``, mode 0600 from its creation on; refuse an existing file."""
    text = env_text()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # O_EXCL: never over the old keys
    with os.fdopen(fd, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m include.compose_secrets", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write to this file (0600, refused if it exists); default: standard output")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.out is None:
        sys.stdout.write(env_text())
        return 0
    try:
        write(Path(a.out))
    except FileExistsError:
        print(f"error: {a.out} exists; it holds the keys the stack's data was encrypted with: keep it "
              f"(delete it only together with the stack's volumes)", file=sys.stderr)
        return 2
    print(f"wrote {a.out} (mode 0600)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
