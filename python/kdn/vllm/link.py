"""The connector's connection to kdnd, made lazily and made again after kdnd comes back.

An engine must never wait on, fail because of, or crash because of kdn: while kdnd is
unreachable `model()` answers None at once (one connection attempt per
reconnect_interval_s), and the connector treats that as a miss.
"""

from __future__ import annotations

import logging
import time

import kdn

from .config import KdnConfig
from .stats import ConnectorStats

# Errors after which this connection is not used again.
_BROKEN = {int(kdn.Status.UNAVAILABLE), int(kdn.Status.TIMEOUT), int(kdn.Status.PROTOCOL),
           int(kdn.Status.VERSION), int(kdn.Status.PERMISSION), int(kdn.Status.INTERNAL)}


class KdnLink:
    def __init__(self, cfg: KdnConfig, desc: kdn.ModelDesc, stats: ConnectorStats, log: logging.Logger,
                 read_only: bool) -> None:
        self._cfg = cfg
        self._desc = desc
        self._stats = stats
        self._log = log
        self._read_only = read_only
        self._client: kdn.Client | None = None
        self._model: kdn.Model | None = None
        self._next_try = 0.0
        self._connections = 0
        self._warned = False

    def sibling(self, read_only: bool) -> "KdnLink":
        """Another connection for the same model, for a thread that must not share this one."""
        return KdnLink(self._cfg, self._desc, self._stats, self._log, read_only)

    def model(self) -> kdn.Model | None:
        """The registered model, or None while kdnd cannot be reached."""
        if self._model is not None:
            return self._model
        now = time.monotonic()
        if now < self._next_try:
            return None
        self._next_try = now + self._cfg.reconnect_interval_s
        try:
            client, model = self._connect()
        except kdn.KdnError as e:
            self._stats.unavailable += 1
            if not self._warned:
                self._log.warning("kdn: kdnd not reachable (%s); serving without it, retrying every %.1f s",
                                  e, self._cfg.reconnect_interval_s)
                self._warned = True
            return None
        if self._connections:
            self._stats.reconnects += 1
        self._connections += 1
        if self._warned:
            self._log.warning("kdn: connected to kdnd again")
        self._warned = False
        self._client, self._model = client, model
        return model

    def warm(self) -> None:
        """Connects now, at the engine's start, so that its first request does not pay for the
        connection and for mapping kdnd's arena (its page tables are filled in at connect). If
        kdnd is not there yet, nothing is logged or counted: the first request tries as before."""
        if self._model is not None:
            return
        try:
            self._client, self._model = self._connect()
        except kdn.KdnError:
            return
        self._connections += 1

    def _connect(self) -> tuple[kdn.Client, kdn.Model]:
        client = kdn.Client(self._cfg.socket_path, self._cfg.namespace, self._cfg.token,
                            read_only=self._read_only, timeout_ms=self._cfg.timeout_ms,
                            staging_bytes=0 if self._read_only else self._cfg.staging_bytes)
        return client, client.register_model(self._desc)

    def failed(self, code: int) -> bool:
        """A call failed with `code`: drops the connection if it is broken, and then answers
        True when the caller may retry the call once on a new connection at once.

        An engine that was idle while kdnd restarted still holds a session of the old kdnd;
        its first call finds it closed. Retrying once on a fresh session keeps that call (a
        save, say) from being lost; the next attempt after a failed retry waits for
        reconnect_interval_s as usual.
        """
        if int(code) not in _BROKEN:
            return False
        had_session = self._model is not None
        if had_session and int(code) == int(kdn.Status.UNAVAILABLE):
            self._stats.unavailable += 1
        self.close()
        if had_session:
            self._next_try = 0.0
        return had_session

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None
        self._model = None
