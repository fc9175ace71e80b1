"""A request's job in the HTTP server's own engine: admitted while the worker has room
(``capacity``: running plus waiting), run in a thread once a slot is free, cancelled when
its client leaves. Shared by the faces that answer a request with a job's result (OpenAI's
routes in handler.faces.http_server, Deepgram's pre-recorded route)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from fastapi import Request, Response

log = logging.getLogger(__name__)

POLL_DISCONNECT_S = 0.25


async def loaded_models(state: Any) -> list[str]:
    """The models a job may name: this worker's, or (a gateway) those its consumers loaded
    (BrokerDown when the broker cannot be reached); [] while the model loads."""
    if state.gateway is not None:
        return list(await asyncio.to_thread(state.gateway.models))
    return list(state.worker.pool.names) if state.worker is not None else []


async def run_admitted(
    state: Any,
    request: Request,
    job: Callable[[threading.Event], Any],
    full: Callable[[], Any],
    admitted: bool = False,
) -> Any:
    """Run ``job(cancel)`` in a thread once a slot is free; ``full()`` (the face's 429) when
    the queue is full. ``state``: a handler.faces.http_server.ServerState.

    A client that disconnects meanwhile sets the job's cancel event, and so does the
    cancellation of this coroutine (an abandoned stream): the slot stays held until the job
    has left the model, so the admission count never undercounts what runs. ``admitted``:
    the caller already took its place (a stream, before answering 200).
    """
    if not admitted:
        if state.admitted >= state.capacity:
            return full()
        state.admitted += 1
    assert state.slots is not None
    cancel = threading.Event()
    try:
        async with state.slots:
            if await request.is_disconnected():
                return Response(status_code=499)
            future = asyncio.get_running_loop().run_in_executor(state.executor, job, cancel)
            state.running += 1
            try:
                result = await watch(future, request, cancel)
            except asyncio.CancelledError:
                log.info("request abandoned: cancelling its job")
                cancel.set()
                state.metrics.job_done(await settle(future))
                raise
            finally:
                state.running -= 1
            state.metrics.job_done(result)
            return result
    finally:
        state.admitted -= 1


async def watch(future: asyncio.Future, request: Request, cancel: threading.Event) -> Any:
    """The job's result; sets ``cancel`` when the client disconnects meanwhile."""
    while True:
        done, _ = await asyncio.wait({future}, timeout=POLL_DISCONNECT_S)
        if done:
            return future.result()
        if not cancel.is_set() and await request.is_disconnected():
            log.info("client disconnected: cancelling its job")
            cancel.set()


async def settle(future: asyncio.Future) -> Any:
    """Wait for a cancelled job's thread to stop (its next cancel check); its result."""
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue  # cancelled again while waiting: the thread still holds the slot
        except Exception:
            break
    if future.cancelled() or future.exception() is not None:
        return None
    return future.result()
