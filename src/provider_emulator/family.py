"""The request path every provider family shares: auth → parse → budget → faults → answer.

A family (OpenAI, Anthropic, Gemini) supplies its wire details: how a key is sent, how its
request becomes a ``Prompt``, how a ``Reply`` and each error look. This path is the hot one
under benchmarks: no middleware, no logging, headers built once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar

import orjson
from aiohttp import web

from provider_emulator.errors import RequestError
from provider_emulator.faults import Fault
from provider_emulator.limits import BudgetState
from provider_emulator.responder import Prompt, Reply
from provider_emulator.state import EmulatorState
from provider_emulator.wire_json import dumps

logger = logging.getLogger(__name__)

JSON_HEADERS: Mapping[str, str] = {"Content-Type": "application/json"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def retry_headers(wait_s: float) -> dict[str, str]:
    """``retry-after`` in whole seconds (rounded up) and the precise ``retry-after-ms``."""
    return {
        "retry-after": str(max(0, math.ceil(wait_s))),
        "retry-after-ms": str(max(0, math.ceil(wait_s * 1000))),
        "x-should-retry": "true",
    }


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] = JSON_HEADERS
) -> web.Response:
    return web.Response(body=dumps(data), status=status, headers=headers)


class Family(ABC):
    name: ClassVar[str]

    def __init__(self, state: EmulatorState) -> None:
        self.state = state
        self.limiter = state.limiters[self.name]

    # -- what each family provides -------------------------------------------------------

    @abstractmethod
    def authenticate(self, request: web.Request) -> web.Response | None:
        """The provider's refusal when the request carries no key, else None."""

    @abstractmethod
    def parse(self, body: dict[str, Any], request: web.Request) -> Prompt:
        """A request body → Prompt; raises RequestError for what the provider rejects."""

    @abstractmethod
    def render(self, prompt: Prompt, reply: Reply) -> dict[str, Any]:
        """The provider's success body (also a batch item's answer)."""

    @abstractmethod
    def request_error(self, error: RequestError) -> web.Response:
        """A 4xx in the provider's error shape."""

    @abstractmethod
    def limit_headers(self, budget: BudgetState) -> dict[str, str]:
        """The provider's rate-limit headers for the current budget."""

    @abstractmethod
    def budget_refusal(self, budget: BudgetState) -> web.Response:
        """The 429 of a spent budget."""

    @abstractmethod
    def fault_response(self, fault: Fault) -> web.Response:
        """The answer of an injected failure (never RESET or HANG)."""

    def sporadic_refusal(self, budget_headers: Mapping[str, str]) -> web.Response:
        """An injected 429 that is no spent budget: the rate-limit headers of the request it
        refuses (budget left), as providers answer a momentary overload."""
        response = self.fault_response(Fault.RATE_LIMIT)
        response.headers.update(budget_headers)
        return response

    # -- the shared path -------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        stats = self.state.stats
        stats.arrived()
        response = await self._answer(request)
        if response is None:  # the connection was dropped on purpose
            stats.answered(self.name, "reset")
            # Never sent: aiohttp cannot write to the aborted transport and lets it go quietly.
            return web.Response(status=500)
        stats.answered(self.name, response.status)
        return response

    async def _answer(self, request: web.Request) -> web.StreamResponse | None:
        """The response, or None when the connection was dropped on purpose."""
        refusal = self.authenticate(request)
        if refusal is not None:
            return refusal
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            prompt = self.parse(body, request)
        except orjson.JSONDecodeError:
            return self.request_error(RequestError("the request body is not valid JSON"))
        except RequestError as error:
            return self.request_error(error)
        if self.state.recorded is not None:
            self.state.record(self.name, body, prompt.messages)

        headers: Mapping[str, str] = JSON_HEADERS
        if self.limiter is not None:
            budget = self.limiter.admit(prompt.token_cost)
            if budget.retry_after_s > 0:
                return self.budget_refusal(budget)
            headers = {**JSON_HEADERS, **self.limit_headers(budget)}
        state = self.state
        if state.stats.record_times:
            state.stats.times.append(time.time())

        fault = state.faults.draw()
        if fault is Fault.RESET or (fault is Fault.HANG and not await state.hang()):
            _drop(request)
            return None
        if fault is Fault.RATE_LIMIT_BUDGET_LEFT:
            return self.sporadic_refusal(headers)
        if fault is not None and fault is not Fault.HANG:
            return self.fault_response(fault)

        if state.config.latency_s or state.config.latency_jitter_s:
            await asyncio.sleep(state.latency())
        try:
            reply = await state.responder.respond(prompt)
        except RequestError as error:
            return self.request_error(error)
        except Exception:  # a responder bug or a model failure: answer like a provider's 500
            logger.exception("the %s responder failed", state.config.responder)
            return self.fault_response(Fault.SERVER_ERROR)
        return json_response(self.render(prompt, reply), headers=headers)


def _drop(request: web.Request) -> None:
    """Close the connection without an answer, as a crashing proxy or server would."""
    transport = request.transport
    if transport is not None:
        transport.abort()
