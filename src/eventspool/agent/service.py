"""The agent's lifecycle: own the spool, run the sender and the server, stop cleanly.

SIGTERM or SIGINT: stop accepting, answer the requests in progress, give the sender
`shutdown_timeout_s` to get in-flight events acknowledged, persist the positions. What
is not acknowledged by then stays in the spool for the next start. Under systemd
(`Type=notify`) the agent reports READY=1 once it listens and STOPPING=1 when it stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from eventspool.agent.access import AllowList, PeerRules
from eventspool.agent.config import AgentConfig
from eventspool.agent.config_loader import ConfigError
from eventspool.agent.quotas import Quotas
from eventspool.agent.server import AgentServer
from eventspool.agent.systemd import notify
from eventspool.agent.tls import TlsFileError, server_context
from eventspool.errors import EventspoolError
from eventspool.pipeline import Spool

log = logging.getLogger(__name__)

_ADOPT_PROGRESS_S = 5.0


def adopt(directory: Path, config: AgentConfig, stop: threading.Event) -> None:
    """Drain the spool a dead in-process producer left behind, then let it go.

    Takes the directory's lock like any owner, so a producer that is still alive is
    never robbed: that is reported and nothing is touched.
    """
    try:
        spool = Spool(
            directory,
            config.bootstrap_servers,
            settings=config.spool,
            sender_settings=config.sender,
        )
    except EventspoolError as exc:
        log.error("cannot adopt %s: %s", directory, exc)
        return
    try:
        remaining = spool.unacknowledged()
        log.info("adopting %s: %d events to deliver", directory, remaining)
        while remaining and not stop.is_set():
            remaining = spool.flush(_ADOPT_PROGRESS_S)
            log.info("adopting %s: %d events left", directory, remaining)
    finally:
        spool.close(config.shutdown_timeout_s)
    if not remaining:
        log.info("adopted %s: every event was delivered", directory)


async def serve(config: AgentConfig, spool: Spool, adopted: Sequence[Path] = ()) -> None:
    try:
        tls = None if config.tls is None else server_context(config.tls)
    except TlsFileError as exc:  # changed since the configuration was checked
        raise ConfigError(f"{exc.key}: {exc}", key=exc.key) from exc
    server = AgentServer(
        spool,
        config.socket_path,
        socket_mode=config.socket_mode,
        max_frame=config.max_frame_bytes,
        frame_timeout_s=config.frame_timeout_s,
        busy_poll_us=config.busy_poll_us,
        quotas=Quotas(config.quota_client_bytes_per_s, config.quota_topic_bytes_per_s),
        tcp_listen=_host_port(config.tcp_listen) if config.tcp_listen else None,
        tls=tls,
        allow=AllowList(config.allowed_topics, config.allowed_exchanges),
        peer_rules=PeerRules(config.access),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    log.info("agent listening on %s", config.socket_path)
    if config.tcp_listen:
        log.info("and on TCP %s%s", config.tcp_listen, " with TLS" if tls else "")
    notify("READY=1", f"STATUS=listening on {config.socket_path}")
    stop_adopting = threading.Event()
    adopters = [
        threading.Thread(target=adopt, args=(d, config, stop_adopting), name=f"adopt {d}")
        for d in adopted
    ]
    for thread in adopters:
        thread.start()
    try:
        await stop.wait()
    finally:
        log.info("agent stopping")
        notify("STOPPING=1", "STATUS=stopping: answering requests in progress")
        stop_adopting.set()
        await server.stop()
        for thread in adopters:
            await loop.run_in_executor(None, thread.join)
        await loop.run_in_executor(None, spool.close, config.shutdown_timeout_s)


def run(config: AgentConfig, adopted: Sequence[Path] = ()) -> None:
    """Run the agent until a signal; raises SpoolLockedError if another agent owns the spool.

    `adopted`: spool directories of dead producers to drain alongside.
    """
    if adopted and not config.bootstrap_servers:
        raise ConfigError("--adopt needs kafka.bootstrap_servers: there is nowhere to send to")
    spool = Spool(
        config.spool_dir,
        config.bootstrap_servers,
        settings=config.spool,
        sender_settings=config.sender,
        exchanges=config.exchanges,
    )
    try:
        asyncio.run(serve(config, spool, adopted))
    finally:
        spool.close()


def _host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
