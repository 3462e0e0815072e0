"""The Copernicus Climate Data Store through ``cdsapi``: credentials, a quiet client, retries with back-off.

Credentials are resolved as cdsapi 0.7 resolves them: ``CDSAPI_URL`` and ``CDSAPI_KEY`` from the
environment, anything missing from the file named by ``CDSAPI_RC`` (default ``~/.cdsapirc``,
lines ``url: ...`` and ``key: ...``). A key without ``:`` is a personal access token of the
current CDS, which cdsapi serves through ecmwf-datastores-client (the ``retrieve/v1`` processes
and jobs API); a ``UID:KEY`` key would be sent to the retired CDS API, so it is refused here.
The key never reaches a log line or an error message: the client's debug messages (which
print it) are dropped and everything else it says is routed, redacted, to the caller's ``say``.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEY_HELP = ("set CDSAPI_URL and CDSAPI_KEY, or write the two lines 'url: https://cds.climate.copernicus.eu/api' "
            "and 'key: <your personal access token>' to {rc} (the token is on your CDS profile page; "
            "accept the dataset's licence once on its CDS page)")


class FetchError(RuntimeError):
    """A download failed after all retries (or the CDS served something unusable); rerun to resume."""


def cds_credentials(url: str | None = None, key: str | None = None) -> tuple[str, str, bool]:
    """``(url, key, verify)`` resolved like cdsapi 0.7: arguments, then environment, then the rc file.

    Raises:
        ValueError: something is missing, or the key has the legacy ``UID:KEY`` form (cdsapi
            would send such a key to the retired CDS API); the message never holds the key.
    """
    url = url or os.environ.get("CDSAPI_URL")
    key = key or os.environ.get("CDSAPI_KEY")
    rc = Path(os.environ.get("CDSAPI_RC", "~/.cdsapirc")).expanduser()
    verify = True
    if (not url or not key) and rc.is_file():  # cdsapi reads the file (and its verify) only then
        config = {}
        for line in rc.read_text(errors="replace").splitlines():
            if ":" in line:
                k, v = line.strip().split(":", 1)
                config[k.strip()] = v.strip()
        url, key = url or config.get("url"), key or config.get("key")
        verify = config.get("verify", "1").strip() not in ("0", "false", "False")
    missing = [name for name, value in (("url", url), ("key", key)) if not value]
    if missing:
        raise ValueError(f"no CDS API {' and '.join(missing)} found: " + KEY_HELP.format(rc=rc))
    if ":" in key:
        raise ValueError("the CDS API key has the legacy 'UID:KEY' form, which cdsapi sends to the retired CDS API; "
                         "use the personal access token (no colon) from your CDS profile page")
    return url, key, verify


def cds_client(say: Callable[[str], None], progress: bool = False) -> tuple[Any, str]:
    """``(client, key)``: a ``cdsapi.Client`` for the current CDS whose messages go to ``say`` (debug
    ones, which hold the key, are dropped) and which does not retry by itself (:func:`retrieve` does).

    ``progress`` shows the client's download progress bar on stderr.

    Raises:
        ValueError: from :func:`cds_credentials`.
    """
    import cdsapi

    url, key, verify = cds_credentials()

    def route(*args: Any, **_: Any) -> None:
        text = args[0] % args[1:] if len(args) > 1 else str(args[0]) if args else ""
        say("CDS: " + _redact(text, key))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client = cdsapi.Client(url=url, key=key, verify=verify, quiet=True, progress=progress, retry_max=1,
                               sleep_max=60, info_callback=route, warning_callback=route, error_callback=route,
                               debug_callback=lambda *a, **k: None)
    for w in caught:  # e.g. the CDS news could not be read: worth a line, not a traceback
        say("CDS: " + _redact(str(w.message), key))
    return client, key


def _redact(text: str, key: str | None) -> str:
    text = " ".join(str(text).split())  # one line
    return text.replace(key, "***") if key else text


def retrieve(client: Any, dataset: str, request: dict[str, Any], target: Path, what: str, retries: int,
             backoff: float, say: Callable[[str], None], key: str | None = None) -> Path:
    """Download ``request`` of ``dataset`` to ``target`` with ``client.retrieve``, retrying failures.

    Attempt ``i`` (from 0) that fails is followed, while attempts remain, by a pause of
    ``backoff * 2**i`` seconds (at most one hour). ``what`` names the request in messages,
    ``say`` receives one line per failed attempt, and ``key`` is redacted from all of them.

    Raises:
        ValueError: the CDS answered 400, 401, 403 or 404 (bad request, key, licence, dataset):
            the same request would fail again, so it is not retried.
        FetchError: every attempt failed (connection, HTTP 5xx, a failed job, a short download).
    """
    import requests

    for attempt in range(retries + 1):
        try:
            client.retrieve(dataset, request, str(target))
            return target
        except requests.HTTPError as err:
            status = err.response.status_code if err.response is not None else None
            if status in (400, 401, 403, 404):  # the same request would fail the same way
                hint = ": check the API key" if status == 401 else ""
                raise ValueError(f"the CDS refused the request for {what} (HTTP {status}{hint}): "
                                 f"{_redact(err, key)[:400]}") from None
            error: Exception = err
        except Exception as err:  # noqa: BLE001 - connections, 5xx, failed jobs, short downloads: all retried
            error = err
        message = f"{type(error).__name__}: {_redact(error, key)[:400]}"
        if attempt == retries:
            raise FetchError(f"{what} failed after {retries + 1} attempts ({message}); "
                             "run the same command again to resume") from None
        wait = min(backoff * 2**attempt, 3600.0)
        say(f"{what}: attempt {attempt + 1} failed ({message}); retrying in {wait:g} s")
        time.sleep(wait)
    raise AssertionError("unreachable")
