"""Server settings: config.pbtxt parameters, each overridable for one model from the environment.

The variable names the model and the parameter: ``<MODEL>__<PARAMETER>`` in upper case, anything
but letters and digits written as "_" (``minilm``'s ``max_queue_rows`` -> ``MINILM__MAX_QUEUE_ROWS``),
so an override never reaches another model of the server by accident. ``PLANNER_OVERHEAD_TOKENS``
overrides the planner's overhead for every model (the planner's documented knob). An empty value
means "not set". Bad values fail model load with the name of the setting.

Fault injection is not a setting: only a test repository enables it, with a file of its own
(``python_backend.faults``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from python_backend.contract import PARAMETER_DEFAULTS
from python_backend.cost_models import OVERHEAD_ENV_VAR
from python_backend.planner import PLANNERS


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    truncate_default: bool  # rows over the max length: truncate (True) or refuse (False)
    max_queue_rows: int  # rows queued past this are refused at once with UNAVAILABLE
    default_timeout_ms: int  # 0: no deadline unless a request sets timeout_ms
    overhead_tokens: float | None  # None: the manifest's cost model; else overhead + B*T
    max_batch: int | None  # None: the manifest's; else the server's cap on rows per forward
    planner: str  # a name in planner.PLANNERS: "dp", or "per_bucket" (the baseline)


def env_name(model: str, parameter: str) -> str:
    """The environment variable that overrides ``parameter`` for ``model``."""
    return re.sub(r"[^A-Z0-9]", "_", f"{model}__{parameter}".upper())


class _Source:
    """A model's parameters, with its environment overrides laid over them."""

    def __init__(self, parameters: dict[str, Any], model: str) -> None:
        self.parameters, self.model = parameters, model

    def raw(self, name: str) -> str:
        env = os.environ.get(env_name(self.model, name)) if self.model else None
        if name == "overhead_tokens" and (env is None or env.strip() == ""):
            env = os.environ.get(OVERHEAD_ENV_VAR)
        if env is not None and env.strip() != "":
            return env.strip()
        value = self.parameters.get(name, {})
        if isinstance(value, dict):
            value = value.get("string_value", "")
        return str(value).strip() or PARAMETER_DEFAULTS.get(name, "")


def _int(source: _Source, name: str, minimum: int) -> int:
    raw = source.raw(name)
    if raw == "":
        return 0
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


def settings_from_parameters(parameters: dict[str, Any], model: str = "") -> Settings:
    """Settings from a model config's ``parameters`` map (as Triton hands it to initialize),
    with the environment's overrides for ``model``."""
    source = _Source(parameters, model)
    overhead_raw = source.raw("overhead_tokens")
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
    planner = source.raw("planner")
    if planner not in PLANNERS:
        raise SettingsError(f"setting planner must be {' or '.join(PLANNERS)}, got {planner!r}")
    return Settings(
        truncate_default=_bool(source.raw("truncate_default"), "truncate_default"),
        max_queue_rows=_int(source, "max_queue_rows", 1),
        default_timeout_ms=_int(source, "default_timeout_ms", 0),
        overhead_tokens=overhead,
        max_batch=_int(source, "max_batch", 0) or None,
        planner=planner,
    )
