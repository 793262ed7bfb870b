"""The jars from Maven Central that tests need beside pyspark's own, fetched by `make test` before the
suite runs (``python -m tests.maven_jars``) into ~/.cache/solaris/jars: a test never downloads."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

CACHE = Path.home() / ".cache" / "solaris" / "jars"
DERBY = "10.16.1.1"  # the Derby of pyspark's own jars/ folder (the embedded metastore's)
# Derby's network server and its client driver: the shared Hive metastore of the write-race test.
JARS = {"derbynet": ("org.apache.derby", DERBY), "derbyclient": ("org.apache.derby", DERBY)}


def jar(artifact: str) -> Path:
    """Where ``artifact``'s jar is cached (fetched or not)."""
    return CACHE / f"{artifact}-{JARS[artifact][1]}.jar"


def fetch(artifact: str) -> Path:
    path = jar(artifact)
    if not path.exists():
        group, version = JARS[artifact]
        url = f"https://repo1.maven.org/maven2/{group.replace('.', '/')}/{artifact}/{version}/{path.name}"
        path.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


if __name__ == "__main__":
    for name in JARS:
        try:
            fetch(name)
        except OSError as e:
            sys.exit(f"cannot fetch the test jar {name} from Maven Central: {e}")
    print(f"test jars in {CACHE}: {', '.join(p.name for p in map(jar, JARS))}")
