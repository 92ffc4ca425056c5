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
    api_key: None serves without authentication."""

    served_model_name: str = "specscale"
    default_preset: str = "specscale"
    max_waiting: int = 64
    max_beam_size: int = 32
    request_timeout_s: float = 600.0
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.max_beam_size < 1:
            raise ValueError(f"max_beam_size must be >= 1, got {self.max_beam_size}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, got {self.request_timeout_s}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
