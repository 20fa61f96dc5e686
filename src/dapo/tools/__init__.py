"""Tools for multi-turn rollouts: base class and registry, verl-shaped tool configs, the hermes
parser, the gsm8k answer checker, a safe calculator and a sandboxed Python interpreter."""

from dapo.tools.base import TOOL_REGISTRY, BaseTool, ToolArgumentError, ToolResponse, register_tool
from dapo.tools.calculator import CalculatorTool
from dapo.tools.code_interpreter import CodeInterpreterTool
from dapo.tools.config import ToolConfigError, load_tool_config, tools_from_config
from dapo.tools.gsm8k import Gsm8kTool
from dapo.tools.parser import ToolCall, get_parser, parse_hermes

__all__ = [
    "TOOL_REGISTRY",
    "BaseTool",
    "CalculatorTool",
    "CodeInterpreterTool",
    "Gsm8kTool",
    "ToolArgumentError",
    "ToolCall",
    "ToolConfigError",
    "ToolResponse",
    "get_parser",
    "load_tool_config",
    "parse_hermes",
    "register_tool",
    "tools_from_config",
]
