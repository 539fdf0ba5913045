"""The body check's processes: one serving both protocols, or several on the same ports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import signal
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc.aio
from aiohttp import web

from body_check.proxy import CheckSettings, GrpcCheck, HttpCheck
from tools.triton_server import set_parent_death_signal

# several workers: each one's event loop stamps its beat this often (a shared clock value); one
# whose beat is WEDGED_AFTER_S old is wedged, and the command ends as if it had died, so whatever
# runs it starts it again (the launcher's /health probe reaches one worker only, at random)
BEAT_S = 1.0
WEDGED_AFTER_S = 10.0
START_GRACE_S = 60.0  # a worker's first beat comes once its servers listen


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


async def beat(stamp: Any) -> None:
    while True:
        stamp.value = time.monotonic()
        await asyncio.sleep(BEAT_S)


class Listen(NamedTuple):
    """host:port for each server: HTTP, gRPC ModelInfer, gRPC ModelStreamInfer."""

    http: str
    grpc: str
    stream: str


def grpc_server(
    handler: grpc.GenericRpcHandler, largest_message: int, listen: str
) -> grpc.aio.Server:
    """One gRPC server: gRPC refuses a message over ``largest_message`` from its length
    prefix, before buffering it. No BDP probe: a stream's window stays gRPC's 64 KB while its
    handler does not read, so a stream the check has stopped reading holds no more than that."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", largest_message),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1),
            ("grpc.http2.bdp_probe", 0),
        ]
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(listen)
    return server


async def serve(settings: CheckSettings, listen: Listen, stamp: Any = None) -> None:
    runner = web.AppRunner(HttpCheck(settings).app(), handle_signals=False, access_log=None)
    await runner.setup()
    host, port = split_address(listen.http)
    await web.TCPSite(runner, host, port, reuse_port=True).start()
    check = GrpcCheck(settings)
    servers = [
        grpc_server(check.infer_handler(), settings.max_body_bytes, listen.grpc),
        grpc_server(check.stream_handler(), settings.stream_bytes, listen.stream),
    ]
    for server in servers:
        await server.start()
    logging.getLogger("body_check").info("checking on HTTP %s, gRPC %s, gRPC streams %s", *listen)
    beating = asyncio.ensure_future(beat(stamp)) if stamp is not None else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    if beating is not None:
        beating.cancel()
    await asyncio.gather(*(server.stop(grace=5) for server in servers))
    with contextlib.suppress(Exception):
        await runner.cleanup()


def serve_one(settings: CheckSettings, listen: Listen, stamp: Any = None) -> None:
    set_parent_death_signal()  # a worker never outlives the command that started it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(settings, listen, stamp))


def serve_many(
    settings: CheckSettings,
    listen: Listen,
    workers: int,
    target: Callable[..., None] = serve_one,
    wedged_after_s: float = WEDGED_AFTER_S,
) -> int:
    """``workers`` processes on the same ports; 0 once asked to stop, 1 if one died or its
    event loop stopped beating for ``wedged_after_s``."""
    # spawned, not forked: a forked child would inherit gRPC's threads half-initialised
    context = multiprocessing.get_context("spawn")
    stamps = [context.Value("d", time.monotonic() + START_GRACE_S) for _ in range(workers)]
    processes = [
        context.Process(target=target, args=(settings, listen, stamp), daemon=True)
        for stamp in stamps
    ]
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.is_alive():
                process.terminate()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for process in processes:
        process.start()
    log = logging.getLogger("body_check")
    died = False
    while not stopping and not died:
        if multiprocessing.connection.wait([p.sentinel for p in processes], timeout=BEAT_S):
            died = not stopping
            if died:
                log.error("a worker exited: stopping the others")
            break
        silent = max(time.monotonic() - stamp.value for stamp in stamps)
        if silent > wedged_after_s:
            log.error("a worker answered nothing for %.0f s: stopping the others", silent)
            died = True
    if died:
        stop(signal.SIGTERM, None)
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return 1 if died else 0
