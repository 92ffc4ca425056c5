"""What a search replica sends back to the ingress over a Ray Serve streaming handle call: first one of
`Rejected` (an OpenAI error with its status), `Answered` (a whole response body) or `StreamOpened`
(the search runs; SSE chunks, as text, follow until `data: [DONE]`). The ingress names the replica that
answered in the `X-SpecScale-Replica` response header."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi.responses import JSONResponse

from specscale.server.errors import APIError


@dataclass(frozen=True)
class Rejected:
    status: int
    body: dict
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, error: APIError) -> Rejected:
        return cls(error.status, error.body(), dict(error.headers))

    def response(self) -> JSONResponse:
        return JSONResponse(self.body, status_code=self.status, headers=self.headers)


@dataclass(frozen=True)
class Answered:
    body: dict
    replica_id: str


@dataclass(frozen=True)
class StreamOpened:
    replica_id: str
