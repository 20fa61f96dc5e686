"""Tool base class, tool responses and the tool registry (verl's ``BaseTool`` shape, synchronous).

A tool is created once per trajectory (``create`` with that sample's ``tools_kwargs``
``create_kwargs``), executed for each call the model makes, and released at the end of the
trajectory. ``execute`` never raises on bad model input: it returns an error text for the
model and names the error kind in ``metrics["error"]`` so the rollout can count it.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


@dataclass
class ToolResponse:
    text: str
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        """The error kind (``bad_arguments``, ``tool_error``, ``sandbox_refused``, ...) or None."""
        return self.metrics.get("error")


class ToolArgumentError(ValueError):
    """The model called a tool with arguments that do not fit its schema."""


class BaseTool:
    """Subclasses set a default ``tool_schema`` (OpenAI function schema) and implement ``run``."""

    default_schema: dict[str, Any] = {}

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        self.config = dict(config or {})
        schema = copy.deepcopy(tool_schema or self.default_schema)
        if not schema or "function" not in schema or "name" not in schema["function"]:
            raise ValueError(
                f"{type(self).__name__}: tool_schema needs function.name (OpenAI function schema)"
            )
        schema.setdefault("type", "function")
        self.tool_schema = schema
        self._instances: dict[str, dict[str, Any]] = {}

    @property
    def name(self) -> str:
        return self.tool_schema["function"]["name"]

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return copy.deepcopy(self.tool_schema)

    # -- lifecycle --------------------------------------------------------------------------
    def create(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = {"kwargs": kwargs, "reward": 0.0}
        return instance_id

    def execute(self, instance_id: str, parameters: Any) -> ToolResponse:
        """Validate ``parameters`` against the schema and run the tool; never raises on model input."""
        state = self._instances.get(instance_id)
        if state is None:
            state = self._instances[self.create(instance_id)]
        try:
            args = self.check_arguments(parameters)
        except ToolArgumentError as exc:
            return ToolResponse(f"Error: {exc}", metrics={"error": "bad_arguments"})
        try:
            return self.run(state, **args)
        except ToolArgumentError as exc:
            return ToolResponse(f"Error: {exc}", metrics={"error": "bad_arguments"})
        except Exception as exc:  # a tool bug must not stop the step
            return ToolResponse(f"Error: {type(exc).__name__}: {exc}", metrics={"error": "tool_error"})

    def run(self, state: dict[str, Any], **arguments: Any) -> ToolResponse:
        raise NotImplementedError

    def step_warning(self) -> str | None:
        """A line the trainer repeats in its log every step (e.g. a tool running with weakened safety)."""
        return None

    def calc_reward(self, instance_id: str) -> float:
        return float(self._instances.get(instance_id, {}).get("reward", 0.0))

    def release(self, instance_id: str) -> None:
        self._instances.pop(instance_id, None)

    # -- arguments --------------------------------------------------------------------------
    def check_arguments(self, parameters: Any) -> dict[str, Any]:
        if not isinstance(parameters, dict):
            raise ToolArgumentError(
                f"arguments of {self.name} must be a JSON object, got {type(parameters).__name__}"
            )
        spec = self.tool_schema["function"].get("parameters") or {}
        props: dict[str, Any] = spec.get("properties") or {}
        missing = [k for k in spec.get("required") or [] if k not in parameters]
        if missing:
            raise ToolArgumentError(f"{self.name} is missing required argument(s) {missing}")
        unknown = [k for k in parameters if k not in props]
        if unknown and props:
            raise ToolArgumentError(
                f"{self.name} got unknown argument(s) {unknown}; expected {sorted(props)}"
            )
        for key, value in parameters.items():
            want = (props.get(key) or {}).get("type")
            types = _JSON_TYPES.get(want) if isinstance(want, str) else None
            if types is None:
                continue
            if isinstance(value, bool) and bool not in types:
                ok = False
            else:
                ok = isinstance(value, types)
            if not ok:
                raise ToolArgumentError(f"argument {key!r} of {self.name} must be a {want}, got {value!r}")
        return dict(parameters)


# ------------------------------------------------------------------ registry
TOOL_REGISTRY: dict[str, type[BaseTool]] = {}
# verl class paths that map to our implementations, so verl tool configs load unchanged
VERL_ALIASES = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "gsm8k",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "code_interpreter",
}


def register_tool(name: str):
    def deco(cls: type[BaseTool]) -> type[BaseTool]:
        TOOL_REGISTRY[name] = cls
        return cls

    return deco


def resolve_tool_class(class_name: str) -> type[BaseTool]:
    """A registered short name, a verl class path with an equivalent here, or ``module.Class``."""
    import importlib

    import dapo.tools  # noqa: F401  (registers the built-in tools)

    key = VERL_ALIASES.get(class_name, class_name)
    if key in TOOL_REGISTRY:
        return TOOL_REGISTRY[key]
    for cls in TOOL_REGISTRY.values():
        if f"{cls.__module__}.{cls.__qualname__}" == key:
            return cls
    module, _, attr = key.rpartition(".")
    if not module:
        raise ValueError(f"unknown tool class {class_name!r}; registered: {sorted(TOOL_REGISTRY)}")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"tool class {class_name!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ValueError(f"tool class {class_name!r} is not a dapo.tools.BaseTool subclass")
    return cls
