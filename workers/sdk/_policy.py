"""The project policy a worker sees (``GET /api/v1/projects/{p}``)."""
from __future__ import annotations

from dataclasses import dataclass

from workers.wire.protocol import is_int
from workers.sdk._errors import ProtocolError


@dataclass(frozen=True)
class Policy:
    """Exactly the worker-facing policy fields of DESIGN §6.

    ``dispatch_qps`` is enforced by the master; ``worker_claim_qps`` is a pace
    the SDK keeps per queue; ``max_jobs_per_claim`` clamps ``claim()``;
    ``recommended_lease_seconds`` is the lease asked for unless the queue was
    opened with its own; ``refresh_after_ms`` is how long this copy is good for.
    """
    project_id: str
    dispatch_qps: float | None
    worker_claim_qps: float | None
    max_jobs_per_claim: int
    recommended_lease_seconds: int
    policy_version: int
    refresh_after_ms: int

    @classmethod
    def from_wire(cls, data: dict) -> "Policy":
        try:
            policy = cls(
                project_id=_str(data["project_id"]),
                dispatch_qps=_rate(data["dispatch_qps"]),
                worker_claim_qps=_rate(data["worker_claim_qps"]),
                max_jobs_per_claim=_positive(data["max_jobs_per_claim"]),
                recommended_lease_seconds=_positive(data["recommended_lease_seconds"]),
                policy_version=_int(data["policy_version"]),
                refresh_after_ms=_int(data["refresh_after_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"project policy has an unexpected shape: {exc!r}") from None
        return policy


def _str(value) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _int(value) -> int:
    if not is_int(value) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return value


def _positive(value) -> int:
    if _int(value) < 1:
        raise ValueError(f"expected an integer >= 1, got {value!r}")
    return value


def _rate(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"expected a rate > 0 or null, got {value!r}")
    return float(value)
