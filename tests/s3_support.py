"""A real S3 endpoint for tests: a ``moto_server`` on 127.0.0.1 (a port the OS picked), a
client for it, and recognisable credentials that the runs read from environment variables
named in ``storage_options``. Plain functions, no pytest: ray_support also uses them inside
its network namespace."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MOTO_SERVER = Path(sys.executable).with_name("moto_server")

# Recognisable values: a grep finds them if anything writes them down.
KEY_ID = "AKIAMMIRAGETEST4242"
SECRET = "mmirage-s3-secret-Zq8vT3pLw0XyR7nK"
OPTIONS = {"key": "MMI_S3_KEY", "secret": "MMI_S3_SECRET", "endpoint_url": "MMI_S3_ENDPOINT"}


def missing() -> str | None:
    """What is not installed for an S3 test (``None``: nothing)."""
    absent = [m for m in ("moto", "s3fs", "boto3") if importlib.util.find_spec(m) is None]
    if absent or not MOTO_SERVER.exists():
        return f"not installed: {', '.join(absent) or 'moto_server'} (the dev extra has them)"
    return None


def start_moto(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``moto_server`` on 127.0.0.1; the process and its endpoint, read from its log."""
    with open(log, "wb") as sink:
        server = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", "0"], stdout=sink, stderr=sink
        )
    while server.poll() is None:
        found = re.search(r"Running on http://127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return server, f"http://127.0.0.1:{found[1]}"
        time.sleep(0.05)
    raise RuntimeError(f"moto_server did not start: {log.read_text()[-500:]}")


def client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )


def variables(endpoint: str) -> dict[str, str]:
    """The environment a run needs for ``storage_options: OPTIONS``."""
    return {
        "MMI_S3_KEY": KEY_ID,
        "MMI_S3_SECRET": SECRET,
        "MMI_S3_ENDPOINT": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask a cloud's metadata service
    }


def keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    listed = client(endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in listed.get("Contents", []))


def download(endpoint: str, bucket: str, prefix: str, into: Path) -> list[str]:
    """Every object under ``prefix`` to ``into/<key>``; their keys."""
    found = keys(endpoint, bucket, prefix)
    for key in found:
        target = into / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client(endpoint).download_file(bucket, key, str(target))
    return found
