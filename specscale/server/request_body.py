"""Request bodies: read within the size limit, parsed as JSON and validated, every failure a 4xx.

No body reaches a handler that the rest of the server could choke on: over the size limit is 413; bytes
that are not UTF-8 JSON, NaN / Infinity, nesting deeper than `MAX_DEPTH` (a 10 KB body can nest 5,000
levels and exhaust Python's recursion) and strings holding a lone UTF-16 surrogate (`"\\ud800"` is valid
JSON but no tokenizer can encode it) are 400 with OpenAI's error JSON; a field of the wrong type or value
is 400 naming that field. A client that goes away while sending its body ends the request quietly (one
debug line, status 499), not as an unexpected error (see docs/architecture.md, "Serving over HTTP").
"""

from __future__ import annotations

import json
import logging
import re
from collections import deque

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from specscale.server.errors import CLIENT_CLOSED, APIError

log = logging.getLogger("specscale.server")

MAX_DEPTH = 64  # arrays / objects inside one another; the request schema needs 4
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


async def read_json(request: Request, limit: int):
    """The parsed JSON body (any JSON value), or an APIError: 413 past `limit` bytes, 400 if malformed,
    499 if the client disconnected before sending all of it."""
    body = await read_body(request, limit)
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, NaN / Infinity
        raise APIError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from error
    except RecursionError as error:  # json's C scanner guards its recursion; far too deep for us anyway
        raise too_deep() from error
    check_payload(payload)
    return payload


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body is {declared} bytes; the limit is {limit} bytes", code="body_too_large")
    chunks, size = [], 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            log.debug("the client of %s %s disconnected after %d body bytes", request.method, request.url.path, size)
            raise APIError(CLIENT_CLOSED, "the client disconnected while sending the body", code="client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body exceeds the limit of {limit} bytes", code="body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def check_payload(payload) -> None:
    """400 for nesting deeper than MAX_DEPTH or a string (key or value) holding a lone surrogate. One
    breadth-first walk with an explicit queue: no recursion, whatever the input."""
    queue = deque([((), payload)])
    while queue:
        loc, value = queue.popleft()
        if len(loc) > MAX_DEPTH:
            raise too_deep()
        if isinstance(value, str):
            _check_text(value, loc)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, (*loc, key))
                queue.append(((*loc, key), item))
        elif isinstance(value, list):
            queue.extend(((*loc, index), item) for index, item in enumerate(value))


def _check_text(text: str, loc: tuple) -> None:
    if LONE_SURROGATE.search(text):
        param = field_path(loc) or None
        raise APIError(400, f"{param or 'the request body'}: a string holds a lone UTF-16 surrogate (an unpaired "
                       "\\ud800-\\udfff escape), which is not text", param, "invalid_unicode")


def too_deep() -> APIError:
    return APIError(400, f"the request body nests arrays / objects deeper than {MAX_DEPTH} levels",
                    code="invalid_json")


def validate(model: type[BaseModel], payload) -> BaseModel:
    if not isinstance(payload, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(payload).__name__}",
                       code="invalid_json")
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        param = field_path(first["loc"])
        raise APIError(400, f"{param}: {first['msg']}", param, first["type"]) from error


def field_path(loc: tuple) -> str:
    """('messages', 0, 'content', 'str') → 'messages[0].content' (union member tags dropped)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _TYPE_TAGS:
            path += f".{part}" if path else part
    return path
