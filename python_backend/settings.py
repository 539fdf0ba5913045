"""Server settings: config.pbtxt parameters, each overridable by an environment variable.

The variable is the parameter's name in upper case (``max_queue_rows`` -> ``MAX_QUEUE_ROWS``);
an empty value means "not set". Bad values fail model load with the name of the setting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from python_backend.cost_models import OVERHEAD_ENV_VAR


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    truncate_default: bool  # rows over the max length: truncate (True) or refuse (False)
    max_queue_rows: int  # rows queued past this are refused at once with UNAVAILABLE
    default_timeout_ms: int  # 0: no deadline unless a request sets timeout_ms
    overhead_tokens: float | None  # None: the manifest's cost model; else overhead + B*T
    max_batch: int | None  # None: the manifest's; else the server's cap on rows per forward
    planner: str  # "dp" (the DP partitioner) or "per_bucket" (the baseline, for comparison)
    fault_injection: str  # test repositories only: see python_backend/faults.py


def _raw(parameters: dict[str, Any], name: str) -> str:
    env = os.environ.get(name.upper())
    if name == "overhead_tokens" and env is None:
        env = os.environ.get(OVERHEAD_ENV_VAR)
    if env is not None and env.strip() != "":
        return env.strip()
    value = parameters.get(name, {})
    if isinstance(value, dict):
        value = value.get("string_value", "")
    return str(value).strip()


def _int(parameters: dict[str, Any], name: str, default: int, minimum: int) -> int:
    raw = _raw(parameters, name)
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"setting {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"setting {name} must be >= {minimum}, got {value}")
    return value


def _bool(raw: str, name: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise SettingsError(f"setting {name} must be true or false, got {raw!r}")


def settings_from_parameters(parameters: dict[str, Any]) -> Settings:
    """Settings from a model config's ``parameters`` map (as Triton hands it to initialize)."""
    truncate_raw = _raw(parameters, "truncate_default") or "true"
    overhead_raw = _raw(parameters, "overhead_tokens")
    overhead: float | None = None
    if overhead_raw:
        try:
            overhead = float(overhead_raw)
        except ValueError:
            raise SettingsError(
                f"setting overhead_tokens must be a number, got {overhead_raw!r}"
            ) from None
        if overhead < 0:
            raise SettingsError(f"setting overhead_tokens must be >= 0, got {overhead}")
    max_batch = _int(parameters, "max_batch", 0, 0) or None
    planner = _raw(parameters, "planner") or "dp"
    if planner not in ("dp", "per_bucket"):
        raise SettingsError(f"setting planner must be dp or per_bucket, got {planner!r}")
    return Settings(
        truncate_default=_bool(truncate_raw, "truncate_default"),
        max_queue_rows=_int(parameters, "max_queue_rows", 4096, 1),
        default_timeout_ms=_int(parameters, "default_timeout_ms", 0, 0),
        overhead_tokens=overhead,
        max_batch=max_batch,
        planner=planner,
        fault_injection=_raw(parameters, "fault_injection"),
    )
