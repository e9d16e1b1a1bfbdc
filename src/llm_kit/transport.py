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

from llm_kit.errors import ProviderError

_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


class HttpTransport:
    """POSTs JSON to ``base_url + path``; returns (status, headers, body bytes)."""

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
        with self._errors():
            async with session.post(self.base_url + path, data=orjson.dumps(body)) as response:
                return response.status, response.headers, await response.read()

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
                return response.status, response.headers, await response.read()

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
                    return response.status, await response.read()
                async for chunk in response.content.iter_chunked(1 << 20):
                    target.write(chunk)
                return response.status, b""

    def _url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    @contextmanager
    def _errors(self, timeout: float | None = None) -> Iterator[None]:
        """aiohttp's exceptions → ProviderError (retryable: the request never got an answer)."""
        try:
            yield
        except TimeoutError:
            seconds = timeout or self._timeout.total or 0
            raise ProviderError(
                f"no answer from {self.base_url} within {seconds:g} s",
                kind="timeout",
                retryable=True,
            ) from None
        except aiohttp.ClientConnectionError as exc:
            raise ProviderError(
                f"connection to {self.base_url} failed ({type(exc).__name__}: {exc})",
                kind="connection_error",
                retryable=True,
            ) from None
        except aiohttp.ClientError as exc:
            raise ProviderError(
                f"HTTP error talking to {self.base_url} ({type(exc).__name__}: {exc})",
                kind="http_error",
                retryable=True,
            ) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
