"""TokenRouter: a serving system for token-level LLM routing."""

__version__ = "0.1.0"
