"""Random secrets for docker-compose.yml, as an .env file: docker compose refuses to start without them.

    python -m include.compose_secrets > .env

SOLARIS_DB_PASSWORD (PostgreSQL, Airflow's metadata), AIRFLOW_JWT_SECRET (signs the API's tokens)
and AIRFLOW_FERNET_KEY (encrypts connections and variables in the metadata database). Keep the file
private and stable: a new Fernet key cannot read what the old one encrypted.
"""

from __future__ import annotations

import base64
import secrets
import sys


def generate() -> dict[str, str]:
    return {"SOLARIS_DB_PASSWORD": secrets.token_urlsafe(24),
            "AIRFLOW_JWT_SECRET": secrets.token_hex(32),
            # a Fernet key is 32 random bytes, url-safe base64
            "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()}


def main() -> int:
    sys.stdout.write("".join(f"{k}={v}\n" for k, v in generate().items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
