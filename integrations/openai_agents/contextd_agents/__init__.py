"""An OpenAI Agents SDK `Session` backed by contextd, and contextd's `memory` tool for agents."""

from contextd_agents.session import ContextdError, ContextdSession, memory_tool

__all__ = ["ContextdError", "ContextdSession", "memory_tool"]
