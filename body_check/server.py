"""The body check's processes: one serving both protocols, or several on the same ports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import signal

import grpc.aio
from aiohttp import web

from body_check.proxy import CheckSettings, GrpcCheck, HttpCheck
from tools.triton_server import set_parent_death_signal


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(settings: CheckSettings, http_listen: str, grpc_listen: str) -> None:
    runner = web.AppRunner(HttpCheck(settings).app(), handle_signals=False, access_log=None)
    await runner.setup()
    host, port = split_address(http_listen)
    await web.TCPSite(runner, host, port, reuse_port=True).start()
    size = settings.max_body_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1),
        ]
    )
    server.add_generic_rpc_handlers((GrpcCheck(settings),))
    server.add_insecure_port(grpc_listen)
    await server.start()
    logging.getLogger("body_check").info("checking on HTTP %s, gRPC %s", http_listen, grpc_listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(grace=5)
    with contextlib.suppress(Exception):
        await runner.cleanup()


def serve_one(settings: CheckSettings, http_listen: str, grpc_listen: str) -> None:
    set_parent_death_signal()  # a worker never outlives the command that started it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(settings, http_listen, grpc_listen))


def serve_many(settings: CheckSettings, http_listen: str, grpc_listen: str, workers: int) -> int:
    """``workers`` processes on the same ports; 0 once asked to stop, 1 if one died."""
    # spawned, not forked: a forked child would inherit gRPC's threads half-initialised
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=serve_one, args=(settings, http_listen, grpc_listen), daemon=True)
        for _ in range(workers)
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
    multiprocessing.connection.wait([p.sentinel for p in processes])
    died = not stopping
    if died:
        logging.getLogger("body_check").error("a worker exited: stopping the others")
        stop(signal.SIGTERM, None)
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return 1 if died else 0
