"""The agent's lifecycle: own the spool, run the sender and the server, stop cleanly.

SIGTERM or SIGINT: stop accepting, answer the requests in progress, give the sender
`shutdown_timeout_s` to get in-flight events acknowledged, persist the positions. What
is not acknowledged by then stays in the spool for the next start.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from eventspool.agent.config import AgentConfig
from eventspool.agent.server import AgentServer
from eventspool.spool.api import Spool

log = logging.getLogger(__name__)


async def serve(config: AgentConfig, spool: Spool, shutdown_timeout_s: float = 10.0) -> None:
    server = AgentServer(
        spool,
        config.socket_path,
        socket_mode=config.socket_mode,
        max_frame=config.max_frame_bytes,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    log.info("agent listening on %s", config.socket_path)
    try:
        await stop.wait()
    finally:
        log.info("agent stopping")
        await server.stop()
        await loop.run_in_executor(None, spool.close, shutdown_timeout_s)


def run(config: AgentConfig) -> None:
    """Run the agent until a signal; raises SpoolLockedError if another agent owns the spool."""
    spool = Spool(
        config.spool_dir,
        config.bootstrap_servers,
        settings=config.spool,
        sender_settings=config.sender,
    )
    try:
        asyncio.run(serve(config, spool))
    finally:
        spool.close()
