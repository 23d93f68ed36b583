"""Reading a POST's JSON body off the wire: its media type, its size, and how long it may take to arrive.

A body that is not JSON gets a 415 (a missing `Content-Type` is read as JSON, as FastAPI does); one longer
than the limit a 413, told by its `Content-Length` before any of it is read, or (chunked) as soon as the part
read so far is; one that does not arrive in full within the time limit a 408 (a client that promises a body
and stalls holds nothing for longer). A client that goes away mid-body is a disconnect, not a server error.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from starlette.requests import ClientDisconnect

from tokenrouter.runtime.frontend.protocol import APIError

log = logging.getLogger("tokenrouter.frontend")


async def read_json_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, checked as the module doc says (APIError 415, 413, 408 or 499)."""
    check_json_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(request, limit)
    except TimeoutError:
        msg = f"the request body did not arrive in full within {timeout_s:g} s"
        raise APIError(408, msg, code="request_timeout") from None
    except ClientDisconnect:
        log.info("client disconnected while sending the body of %s %s", request.method, request.url.path)
        raise APIError(499, "client disconnected", code="client_disconnected") from None


def check_json_type(content_type: str | None) -> None:
    """A 415 unless `content_type` is absent, `application/json` or `application/*+json` (parameters such as
    `charset=utf-8` allowed)."""
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return
    msg = (
        f"unsupported Content-Type {content_type[:100]!r}: the body must be JSON "
        "(Content-Type: application/json)"
    )
    raise APIError(415, msg, code="unsupported_media_type")


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    msg = f"the request body is larger than the server's limit of {limit} bytes"
    return APIError(413, msg, code="request_too_large")
