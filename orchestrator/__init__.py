"""dsv4ctl: declarative deployment of DeepSeek-V4-Flash on SGLang.

The package is a library first; ``orchestrator.cli`` is a thin click adapter over it.
"""

__version__ = "0.1.0"
