"""TokenRouter: a serving system for token-level LLM routing."""

__version__ = "0.1.0"
_API = ("Delta", "Engine", "EngineError", "Generation", "Sampling", "TokenLogprob")


def __getattr__(name: str):
    """`tokenrouter.Engine` and its types (tokenrouter/api.py), imported on first use."""
    if name in _API:
        from tokenrouter import api

        return getattr(api, name)
    raise AttributeError(f"module 'tokenrouter' has no attribute {name!r}")
