"""ServerSettings: what one `specscale serve` process admits and how long it waits (limits, auth, names)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSettings:
    """served_model_name: the `model` the API answers to. default_preset: the search preset of a request
    without `search.preset`. max_waiting: accepted searches not yet admitted to the runtime; one more is
    refused with 429 + Retry-After. max_beam_size: the largest `search.beam_size` a request may ask for.
    request_timeout_s: the longest a search may take (a request may ask for less with `search.timeout_s`).
    max_body_bytes: larger request bodies get 413. retry_after_s: the Retry-After header of a 429.
    api_key: None serves without authentication (an empty key is refused: it would look like auth and
    be none). protect_metrics: /health and /metrics need the key too (by default they stay open for
    probes). trust_special_tokens: special-token text inside message contents is read as control tokens
    (lets a caller forge chat turns; for trusted callers only). header_timeout_s / body_timeout_s: the
    longest a client may take to send a request's headers / its body before it gets 408 and the
    connection closes. keep_alive_s: how long an idle kept-alive connection stays open between requests;
    longer than the idle expiry of common clients' connection pools (5 s in httpx and so the `openai`
    client, 15 s in aiohttp), because a server that closes an idle connection just as its client reuses it
    fails that request with a read error, which clients do not retry for a POST.
    max_connections: open connections beyond it get 503 and are closed.
    drain_timeout_s: on SIGTERM, how long the server waits for the searches it has accepted to finish
    (refusing new ones with 503) before it exits; None: request_timeout_s plus 5 s, so that every
    search ends by its own budget."""

    served_model_name: str = "specscale"
    default_preset: str = "specscale"
    max_waiting: int = 64
    max_beam_size: int = 32
    request_timeout_s: float = 600.0
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1
    api_key: str | None = None
    protect_metrics: bool = False
    trust_special_tokens: bool = False
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 30.0
    max_connections: int = 1024
    drain_timeout_s: float | None = None

    @property
    def drain_s(self) -> float:
        return self.request_timeout_s + 5.0 if self.drain_timeout_s is None else self.drain_timeout_s

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.max_beam_size < 1:
            raise ValueError(f"max_beam_size must be >= 1, got {self.max_beam_size}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, got {self.request_timeout_s}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty (None serves without authentication)")
        if self.protect_metrics and self.api_key is None:
            raise ValueError("protect_metrics needs an api_key")
        if min(self.header_timeout_s, self.body_timeout_s, self.keep_alive_s) <= 0:
            raise ValueError("header_timeout_s, body_timeout_s and keep_alive_s must be positive")
        if self.drain_timeout_s is not None and self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
