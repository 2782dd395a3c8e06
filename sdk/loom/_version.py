"""The SDK's version; sent as ``X-Loom-Client: loom-python/<version>`` on every call."""

__version__ = "0.1.0"
