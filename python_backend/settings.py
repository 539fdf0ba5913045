"""Server settings: config.pbtxt parameters, each overridable for one model from the environment.

Each setting is declared once, as a field of ``Settings``: its type, its default (the string
config.pbtxt holds; empty means "not set": the manifest decides), its parser (with its bounds)
and its help. The builder writes the defaults into config.pbtxt (``CONFIG_DEFAULTS``), and the
README's settings table is ``settings_table()`` (a test compares them).

The variable names the model and the parameter: ``<MODEL>__<PARAMETER>`` in upper case, anything
but letters and digits written as "_" (``minilm``'s ``max_queue_rows`` -> ``MINILM__MAX_QUEUE_ROWS``),
so an override never reaches another model of the server by accident. ``PLANNER_OVERHEAD_TOKENS``
overrides the planner's overhead for every model (the planner's documented knob). An empty value
means "not set". Bad values fail model load with the name of the setting.

Fault injection is not a setting: only a test repository enables it, with a file of its own
(``python_backend.engines.faults``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from typing import Any

from python_backend.common.cost_models import OVERHEAD_ENV_VAR
from python_backend.common.values import (
    BadValue,
    Parser,
    int_at_least,
    number_at_least,
    number_between,
    one_of,
    parse_bool,
)
from python_backend.scheduling.planner import PLANNERS
from python_backend.scheduling.policy import ServiceClasses
from python_backend.stub.cpu_pinning import PIN_CORES

OVERLAP_FORWARDS = ("auto", "on", "off")


def overlaps_forwards(setting: str, runs_on_gpu: bool) -> bool:
    """Whether forwards run on an engine thread (``Scheduler(overlap=True)``): it pays where a
    forward waits on a GPU with the GIL released; ONNX Runtime on the CPU takes the cores the
    overlap would use."""
    return setting == "on" or (setting == "auto" and runs_on_gpu)


# a setting's bad value fails model load with the setting named
SettingsError = BadValue


def _setting(default: str, parse: Parser, help: str) -> Any:
    """A setting's declaration: config.pbtxt's default text, its parser, its help."""
    return field(metadata={"default": default, "parse": parse, "help": help})


@dataclass(frozen=True)
class Settings:
    truncate_default: bool = _setting(
        "true", parse_bool, "rows over the max length: truncate, or refuse"
    )
    max_queue_rows: int = _setting(
        "4096", int_at_least(1), "rows queued past this are refused at once (503)"
    )
    default_timeout_ms: int = _setting(
        "0",
        int_at_least(0, empty=0),
        "deadline for requests that set no `timeout_ms` (0: none)",
    )
    overhead_tokens: float | None = _setting(
        "",
        number_at_least(0.0),
        "plan with `overhead + B*T` instead of the calibrated cost "
        f"(`{OVERHEAD_ENV_VAR}` sets it for every model)",
    )
    max_batch: int | None = _setting("", int_at_least(1), "the server's cap on rows per forward")
    planner: str = _setting(
        "dp",
        one_of(tuple(PLANNERS)),
        "`dp`, or `per_bucket` (the baseline, to measure what the DP gains)",
    )
    pin_cores: str = _setting(
        "auto",
        one_of(PIN_CORES),
        "each front, queue owner and GPU instance on a core of its own: `on`, `off`, or `auto` "
        "(where the server has cores of its own: a cpuset); an engine that computes on the CPU "
        "keeps every core",
    )
    overlap_forwards: str = _setting(
        "auto",
        one_of(OVERLAP_FORWARDS),
        "forwards on an engine thread, the next planned and padded and the last answered while "
        "one runs: `on`, `off`, or `auto` (on where the engine runs on a GPU)",
    )
    classes: int = _setting(
        "2", int_at_least(1), "service classes a request may name with `priority` (1 first)"
    )
    class_wait_ms: float = _setting(
        "50",
        number_at_least(1.0),
        "about how long a lower class may hold a higher class's row: while a higher class waits or "
        "was seen in the last `class_recent_ms`, a lower class's forwards are capped to about this "
        "long each, and riders take what a row has not waited of it",
    )
    class_recent_ms: float = _setting(
        "1000", number_at_least(0.0), "how recently a higher class was seen for the cap to hold"
    )
    class_min_share: float = _setting(
        "0.05",
        number_between(0.0, 1.0),
        "a lower class with rows waiting gets at least this share of the engine's recent work",
    )

    class_rider_factor: float = _setting(
        "2",
        number_at_least(1.0),
        "riders of the next class may make a higher class's forward cost this many times its own, "
        "however long its rows have waited",
    )

    def service_classes(self) -> ServiceClasses:
        return ServiceClasses(
            classes=self.classes,
            wait_s=self.class_wait_ms / 1000.0,
            recent_s=self.class_recent_ms / 1000.0,
            min_share=self.class_min_share,
            rider_factor=self.class_rider_factor,
        )


# the parameters block the builder writes into config.pbtxt: every setting, at its default
CONFIG_DEFAULTS: dict[str, str] = {f.name: f.metadata["default"] for f in fields(Settings)}


def settings_table() -> list[str]:
    """The README's table of settings, from the declarations."""
    lines = ["| parameter | default | meaning |", "|---|---|---|"]
    for f in fields(Settings):
        default = f"`{f.metadata['default']}`" if f.metadata["default"] else "(manifest)"
        lines.append(f"| `{f.name}` | {default} | {f.metadata['help']} |")
    return lines


def env_name(model: str, parameter: str) -> str:
    """The environment variable that overrides ``parameter`` for ``model``."""
    return re.sub(r"[^A-Z0-9]", "_", f"{model}__{parameter}".upper())


def _raw(parameters: dict[str, Any], model: str, name: str, default: str) -> str:
    """A setting's text: the model's environment override, else its config value, else the
    declared default."""
    env = os.environ.get(env_name(model, name)) if model else None
    if name == "overhead_tokens" and (env is None or env.strip() == ""):
        env = os.environ.get(OVERHEAD_ENV_VAR)
    if env is not None and env.strip() != "":
        return env.strip()
    value = parameters.get(name, {})
    if isinstance(value, dict):
        value = value.get("string_value", "")
    return str(value).strip() or default


def settings_from_parameters(parameters: dict[str, Any], model: str = "") -> Settings:
    """Settings from a model config's ``parameters`` map (as Triton hands it to initialize),
    with the environment's overrides for ``model``."""
    values = {
        f.name: f.metadata["parse"](
            _raw(parameters, model, f.name, f.metadata["default"]), f"setting {f.name}"
        )
        for f in fields(Settings)
    }
    return Settings(**values)
