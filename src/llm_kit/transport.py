"""HTTP: one pooled aiohttp session per client, errors mapped to ProviderError.

aiohttp because the transport is where throughput is won: measured against a local server at
concurrency 256 a raw aiohttp pool does an order of magnitude more requests/s than httpx or the
provider SDKs (DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO

import aiohttp
import orjson

from llm_kit.errors import ConnectError, ProviderError
from llm_kit.redact import redact_bytes, redact_text

_JSON = {"Content-Type": "application/json", "Accept": "application/json"}
# Headers whose values are credentials (matched as parts of the lower-cased name).
_CREDENTIAL_HEADER_WORDS = ("auth", "key", "token", "secret")


class HttpTransport:
    """POSTs JSON to ``base_url + path``; returns (status, headers, body bytes).

    An error body (status >= 400) comes back redacted: some gateways quote the request's
    headers, and every error message of llm_kit is built from these bodies.
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        max_connections: int,
        request_timeout: float,
        connect_timeout: float,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {**_JSON, **headers}
        self.secrets: tuple[str, ...] = credential_values(headers)
        self._where = redact_text(self.base_url, self.secrets)  # for error texts, once
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=connect_timeout)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, ttl_dns_cache=300, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            headers=self._headers,
            json_serialize=lambda obj: orjson.dumps(obj).decode(),
        )
        return self._session

    async def post_json(self, path: str, body: Any) -> tuple[int, Mapping[str, str], bytes]:
        """The live hot path: POST a JSON body, read the whole answer."""
        session = self._session or self._open()
        # try/except rather than the _errors() context manager: one generator less per request.
        try:
            # numpy scalars in an item's sampling (a parameter sweep) are plain JSON numbers.
            data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
            async with session.post(self.base_url + path, data=data) as response:
                raw = await response.read()
                return response.status, response.headers, self._body(response.status, raw)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._provider_error(exc, None) from None

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Any request; ``path`` may also be an absolute URL (a provider's results_url)."""
        session = self._session or self._open()
        if isinstance(data, aiohttp.FormData):
            # The session's default JSON content type must give way to the multipart boundary.
            payload = data()
            data, headers = payload, {**(headers or {}), "Content-Type": payload.content_type}
        with self._errors(timeout):
            async with session.request(
                method,
                self._url(path),
                data=data,
                headers=headers,
                params=params,
                timeout=aiohttp.ClientTimeout(total=timeout) if timeout else self._timeout,
            ) as response:
                body = await response.read()
                return response.status, response.headers, self._body(response.status, body)

    async def download(
        self, path: str, target: BinaryIO, *, timeout: float = 3600.0
    ) -> tuple[int, bytes]:
        """Stream a GET's body into ``target`` in chunks: result files can be gigabytes.

        Returns (status, error body); on an error status nothing is written to ``target``.
        """
        session = self._session or self._open()
        with self._errors(timeout):
            async with session.get(
                self._url(path),
                headers={"Accept": "application/binary"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                if response.status >= 400:
                    return response.status, self._body(response.status, await response.read())
                async for chunk in response.content.iter_chunked(1 << 20):
                    target.write(chunk)
                return response.status, b""

    def _body(self, status: int, body: bytes) -> bytes:
        return redact_bytes(body, self.secrets) if status >= 400 else body

    def _url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    @contextmanager
    def _errors(self, timeout: float | None = None) -> Iterator[None]:
        """aiohttp's exceptions → ProviderError (retryable: the request never got an answer).

        Messages are redacted: aiohttp's own may quote a URL with a ``key=`` parameter."""
        try:
            yield
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._provider_error(exc, timeout) from None

    def _provider_error(
        self, exc: TimeoutError | aiohttp.ClientError, timeout: float | None
    ) -> ProviderError:
        where = self._where
        if isinstance(exc, aiohttp.ConnectionTimeoutError):  # a TimeoutError too: first
            seconds = self._timeout.sock_connect or 0
            return ConnectError(
                f"could not connect to {where} within {seconds:g} s", where=where, kind="timeout"
            )
        if isinstance(exc, TimeoutError):
            seconds = timeout or self._timeout.total or 0
            return ProviderError(
                f"no answer from {where} within {seconds:g} s", kind="timeout", retryable=True
            )
        why = f"{type(exc).__name__}: {redact_text(str(exc), self.secrets)}"
        if isinstance(exc, aiohttp.ClientConnectorError):  # never reached: refused, DNS, TLS
            return ConnectError(f"connection to {where} failed ({why})", where=where)
        if isinstance(exc, aiohttp.ClientConnectionError):
            return ProviderError(
                f"connection to {where} failed ({why})", kind="connection_error", retryable=True
            )
        return ProviderError(
            f"HTTP error talking to {where} ({why})", kind="http_error", retryable=True
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def credential_values(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The credential values among ``headers``: each value, and a token without its scheme
    (``Bearer <token>``), so that an echo of either form is caught."""
    values: list[str] = []
    for name, value in headers.items():
        if value and any(word in name.lower() for word in _CREDENTIAL_HEADER_WORDS):
            values.append(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                values.append(token.strip())
    return tuple(values)
