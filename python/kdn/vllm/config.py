"""The connector's settings: vLLM's `kv_connector_extra_config`, validated."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class KdnConfig:
    """Keys of kv_connector_extra_config the connector reads (all optional).

    socket_path            kdnd's socket; default: $KDN_SOCKET, else libkdn's default path
    namespace              kdn namespace (tenant); default "default"
    token                  the namespace's token, if kdnd requires one
    chunk_tokens           tokens per kdn chunk: a multiple of vLLM's block size (default 256)
    copy_threads           threads copying KV between kdnd and vLLM's cache (default: CPUs)
    timeout_ms             how long one call to kdnd may wait (default 2000)
    reconnect_interval_s   how often to try kdnd again while it is unreachable (default 1.0)
    model_identity         names the weights instead of hashing the model's files (e.g.
                           "org/model@<commit>"); engines with equal identities share KV
    staging_bytes          the session's staging area for stores (default: kdnd's default)
    load / save            turn loading from or saving to kdnd off (default: both on)
    async_loads            a prefix with chunks on kdnd's disk or remote tier loads off the step
                           (vLLM's asynchronous load: the request waits, the batch runs on);
                           false: every load is synchronous (default: true)
    """

    socket_path: str | None = None
    namespace: str | None = None
    token: str | None = None
    chunk_tokens: int = 256
    copy_threads: int = 0
    timeout_ms: int = 2000
    reconnect_interval_s: float = 1.0
    model_identity: str | None = None
    staging_bytes: int = 0
    load: bool = True
    save: bool = True
    async_loads: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "KdnConfig":
        """Reads the connector's keys; unknown keys and wrong types raise ValueError."""
        extra = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(k for k in extra if k not in known)
        if unknown:
            raise ValueError(f"kdn connector: unknown kv_connector_extra_config keys {unknown}; "
                             f"known: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, value in extra.items():
            values[name] = _convert(name, value, known[name].type)
        cfg = cls(**values)
        if cfg.socket_path is None and os.environ.get("KDN_SOCKET"):
            cfg = cls(**{**values, "socket_path": os.environ["KDN_SOCKET"]})
        cfg.check()
        return cfg

    def check(self) -> None:
        if self.chunk_tokens <= 0 or self.chunk_tokens > 65536:
            raise ValueError("kdn connector: chunk_tokens must be in 1..65536")
        if self.copy_threads < 0 or self.copy_threads > 64:
            raise ValueError("kdn connector: copy_threads must be in 0..64")
        if self.timeout_ms <= 0:
            raise ValueError("kdn connector: timeout_ms must be positive")
        if self.reconnect_interval_s < 0:
            raise ValueError("kdn connector: reconnect_interval_s must not be negative")
        if self.staging_bytes < 0 or self.staging_bytes % 4096 != 0:
            raise ValueError("kdn connector: staging_bytes must be a multiple of 4096")

    def threads(self) -> int:
        """Copy threads besides the calling one."""
        n = self.copy_threads or (os.cpu_count() or 1)
        return max(0, n - 1)


def _convert(name: str, value: Any, annotation: Any) -> Any:
    text = str(annotation)
    if value is None and "None" in text:
        return None
    try:
        if text.startswith("bool"):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
            raise TypeError
        if text.startswith("int"):
            if isinstance(value, bool):
                raise TypeError
            return int(value)
        if text.startswith("float"):
            return float(value)
        if isinstance(value, str):
            return value
    except (TypeError, ValueError):
        pass
    raise ValueError(f"kdn connector: kv_connector_extra_config[{name!r}] = {value!r} is not a valid {text}")
